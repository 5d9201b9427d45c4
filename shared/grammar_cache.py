"""Grammars compiled with xgrammar for one model's vocabulary, cached by the structured output's key (LRU).

Shared by the worker (which constrains decoding with them) and the gateway's grammar checker (which compiles each new
grammar once in a child process before a request carries it, so that one that does not compile is a 400 there).
Compiles run on a small thread pool (xgrammar's compiler releases the GIL), never on the worker's step thread.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import xgrammar as xgr

from pagedserve.shared.structured_output import StructuredOutput, StructuredOutputKind

log = logging.getLogger(__name__)
MAX_CACHED_BYTES = 512 * 1024**2  # compiled grammars kept for reuse (live matchers keep theirs alive regardless)
NUM_COMPILE_THREADS = 2  # one slow compile leaves a thread for the next grammar


class GrammarError(ValueError):
    """The grammar engine refused a request's grammar (mapped to INVALID_ARGUMENT)."""


class GrammarCache:
    """Compiles structured outputs into xgrammar grammars for this model's vocabulary, once per key (LRU)."""

    def __init__(self, model_dir: str, vocab_size: int, stop_token_ids: tuple[int, ...],
                 max_cached_bytes: int = MAX_CACHED_BYTES, num_threads: int = NUM_COMPILE_THREADS) -> None:
        self.model_dir = model_dir
        self.vocab_size = vocab_size  # the logits' width: the bitmask covers every row of the LM head
        self.stop_token_ids = stop_token_ids
        self.max_cached_bytes = max_cached_bytes
        self._pool = ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="grammar")
        self._lock = threading.Lock()
        # key -> future of its CompiledGrammar, LRU first
        self._entries: OrderedDict[str, Future[xgr.CompiledGrammar]] = OrderedDict()
        self._compiler: xgr.GrammarCompiler | None = None  # built on first use (loads the tokenizer)
        self._compiler_lock = threading.Lock()

    def prepare(self, structured: StructuredOutput) -> Future[xgr.CompiledGrammar]:
        """A future of the compiled grammar; starts the compile unless it is cached or under way."""
        with self._lock:
            future = self._entries.get(structured.key)
            if future is not None:
                self._entries.move_to_end(structured.key)
                return future
            self._evict()
            future = self._pool.submit(self._compile, structured)
            self._entries[structured.key] = future
        future.add_done_callback(lambda done: self._forget_failure(structured.key, done))
        return future

    def get(self, structured: StructuredOutput) -> xgr.CompiledGrammar:
        """The compiled grammar, compiling it now if needed (only after an eviction or a worker restart: the
        scheduler prepares every grammar before its request's first step). Raises GrammarError."""
        return self.prepare(structured).result()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def num_cached(self) -> int:
        return len(self._entries)

    def _evict(self) -> None:
        """Drop the least recently used compiled grammars past the byte budget (under the lock)."""
        total = sum(_size_bytes(f) for f in self._entries.values() if f.done())
        for key in list(self._entries):
            if total <= self.max_cached_bytes:
                return
            if self._entries[key].done():
                total -= _size_bytes(self._entries.pop(key))

    def _forget_failure(self, key: str, future: Future[xgr.CompiledGrammar]) -> None:
        """Keep what compiled and what the engine refused (a bad grammar is not compiled again); forget other
        failures (they may not happen again)."""
        error = future.exception()
        if error is not None and not isinstance(error, GrammarError):
            with self._lock:
                if self._entries.get(key) is future:
                    del self._entries[key]

    def _compile(self, structured: StructuredOutput) -> xgr.CompiledGrammar:
        compiler = self._get_compiler()
        start_s = time.perf_counter()
        try:
            compiled = _compile_with(compiler, structured)
        except (RuntimeError, ValueError, TypeError) as exc:  # xgrammar reports bad input as these
            raise GrammarError(f"the {structured.kind.value} cannot be compiled: {_first_line(exc)}") from None
        elapsed_s = time.perf_counter() - start_s
        if elapsed_s > 1.0:
            log.info("compiled a %s grammar in %.1f s (%d KiB)", structured.kind.value, elapsed_s,
                     compiled.memory_size_bytes // 1024)
        return compiled

    def _get_compiler(self) -> xgr.GrammarCompiler:
        with self._compiler_lock:
            if self._compiler is None:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
                info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size,
                                                          stop_token_ids=list(self.stop_token_ids))
                # our own LRU bounds the memory; xgrammar's cache would grow without a limit
                self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            return self._compiler


def _compile_with(compiler: xgr.GrammarCompiler, structured: StructuredOutput) -> xgr.CompiledGrammar:
    kind, spec, any_whitespace = structured.kind, structured.spec, structured.any_whitespace
    if kind is StructuredOutputKind.JSON_SCHEMA:  # strict_mode: no properties or items the schema does not name
        return compiler.compile_json_schema(spec, any_whitespace=any_whitespace, strict_mode=True)
    if kind is StructuredOutputKind.JSON_OBJECT:
        return compiler.compile_json_schema('{"type": "object"}', any_whitespace=any_whitespace, strict_mode=False)
    if kind is StructuredOutputKind.REGEX:
        return compiler.compile_regex(spec)
    if kind is StructuredOutputKind.GRAMMAR:
        return compiler.compile_grammar(spec)
    if kind is StructuredOutputKind.LARK:
        return compiler.compile_lark(spec)
    if kind is StructuredOutputKind.STRUCTURAL_TAG:
        return compiler.compile_structural_tag(spec if any_whitespace else compact_json_in_tag(spec))
    raise GrammarError(f"unknown structured output kind {kind}")


def compact_json_in_tag(spec: str) -> str:
    """The structural tag with each plain JSON-schema part as the grammar of its compact form (one space after
    `,` and `:`, none elsewhere), as JSON schemas compile by default here: a structural tag's own JSON allows free
    whitespace, where a small model can loop."""
    def rewrite(node: Any) -> Any:
        if isinstance(node, list):
            return [rewrite(item) for item in node]
        if not isinstance(node, dict):
            return node
        plain = set(node) <= _PLAIN_JSON_FORMAT and node.get("style", "json") == "json"
        if node.get("type") == "json_schema" and plain:
            grammar = xgr.Grammar.from_json_schema(node["json_schema"], any_whitespace=False, strict_mode=True)
            return {"type": "grammar", "grammar": str(grammar)}
        return {key: rewrite(value) for key, value in node.items()}

    return json.dumps(rewrite(json.loads(spec)), ensure_ascii=False)


_PLAIN_JSON_FORMAT = {"type", "json_schema", "style", "max_whitespace_cnt"}


def _size_bytes(future: Future[xgr.CompiledGrammar]) -> int:
    return 0 if future.exception() is not None else future.result().memory_size_bytes


def _first_line(exc: BaseException) -> str:
    """xgrammar's messages start with a '[time] file:line:' prefix and may span lines: keep the reason."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split(": ", 1)[1] if text.startswith("[") and ": " in text else text
