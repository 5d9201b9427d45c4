"""`python -m pagedserve.benchmarks.detokenize_cpu`: the gateway's detokenization CPU per token, one token at a time.

Streams a few thousand tokens of mixed text (the repo's docs, plus accented, CJK and emoji lines) through the
gateway's IncrementalDetokenizer in requests of --request-tokens, the way a stream feeds it, and reports the CPU time
(process_time) per token. --compare FILE.py adds another detokenizer module (a class IncrementalDetokenizer(tokenizer,
prompt_ids) with add/flush, e.g. an older version from `git show`); the implementations then run in alternating
rounds so that the machine's load falls on each alike, and every one must give the same text as a full decode.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

from pagedserve.services.gateway.text.detokenizer import IncrementalDetokenizer
from pagedserve.services.gateway.text.tokenizer import PromptTokenizer

MIXED = ("Les élèves ont répondu: « oui » — Ça va? 東京は日本の首都です。 Привет, мир! 🙂👍 naïve café\n")


def corpus_ids(tokenizer: PromptTokenizer, num_tokens: int) -> list[int]:
    docs = sorted(Path("docs").glob("*.md"))
    text = "".join(MIXED + doc.read_text(encoding="utf-8") for doc in docs)
    ids = tokenizer.encode(text, add_special_tokens=False)[:num_tokens]
    if len(ids) < num_tokens:
        raise SystemExit(f"the corpus holds only {len(ids)} tokens")
    return ids


def load_class(path: str) -> type:
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.IncrementalDetokenizer


def request_bounds(tokenizer: PromptTokenizer, ids: list[int], request_tokens: int) -> list[tuple[int, int]]:
    """(start, end) of each request, about `request_tokens` long; none starts inside a character (its "prompt",
    the tokens before it, decodes whole), so the requests' texts add up to the full decode."""
    starts = [0]
    while starts[-1] + request_tokens < len(ids):
        start = starts[-1] + request_tokens
        while start < len(ids) and tokenizer.decode(ids[start - 4:start]).endswith("\ufffd"):
            start += 1
        starts.append(start)
    return [(start, end) for start, end in zip(starts, starts[1:] + [len(ids)], strict=True) if start < end]


def one_round(cls: type, tokenizer: PromptTokenizer, ids: list[int], bounds: list[tuple[int, int]]
              ) -> tuple[float, str]:
    """(CPU seconds, text) for streaming each request's tokens one per add, after its last 4 "prompt" tokens."""
    pieces = []
    start_s = time.process_time()
    for start, end in bounds:
        detokenizer = cls(tokenizer, ids[max(0, start - 4):start])
        for token_id in ids[start:end]:
            pieces.append(detokenizer.add([token_id]))
        pieces.append(detokenizer.flush())
    return time.process_time() - start_s, "".join(pieces)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pagedserve.benchmarks.detokenize_cpu",
                                description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", default="models/SmolLM2-135M-Instruct")
    p.add_argument("--num-tokens", type=int, default=4000)
    p.add_argument("--request-tokens", type=int, default=500, help="tokens per request (a fresh detokenizer each)")
    p.add_argument("--rounds", type=int, default=10, help="rounds per implementation, alternating")
    p.add_argument("--compare", action="append", default=[], help="another detokenizer module (FILE.py)")
    args = p.parse_args(argv)
    tokenizer = PromptTokenizer(args.model_dir)
    ids = corpus_ids(tokenizer, args.num_tokens)
    expected = tokenizer.decode(ids)
    bounds = request_bounds(tokenizer, ids, args.request_tokens)
    impls = {"current": IncrementalDetokenizer} | {path: load_class(path) for path in args.compare}
    times: dict[str, list[float]] = {name: [] for name in impls}
    for _ in range(args.rounds):
        for name, cls in impls.items():
            cpu_s, text = one_round(cls, tokenizer, ids, bounds)
            if text != expected:
                raise SystemExit(f"{name}: the streamed text differs from a full decode")
            times[name].append(cpu_s / len(ids) * 1e6)
    print(f"{len(ids)} tokens, requests of {args.request_tokens}, {args.rounds} alternating rounds; "
          f"CPU us per token (median, min..max):")
    for name, per_token in times.items():
        print(f"  {name}: {statistics.median(per_token):.2f} ({min(per_token):.2f}..{max(per_token):.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
