"""How each server under test is installed and started: pagedserve, llama.cpp's llama-server, transformers serve."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from pagedserve.benchmarks.peers.llama_build import ensure_gguf, ensure_llama_server, llama_server_path
from pagedserve.benchmarks.peers.process import ServerSpec
from pagedserve.services.ports import free_port


def default_llama_threads() -> int:
    """One core fewer than the machine has: the bench client runs beside the server, and ggml's threads wait for
    each other at every op, so a single descheduled thread stalls all (on 2 busy cores -t 2 decoded 45x slower)."""
    return max(1, (os.cpu_count() or 2) - 1)


# llama-server's own n-gram speculation (no draft model): the last n tokens looked up in the request's history,
# the tokens after the match drafted (its docs/speculative.md, "n-gram Map (ngram-simple)"); 3 and 8 as
# pagedserve's default copy-heavy setting looks up 2-4 tokens
LLAMA_SPEC_ARGS = ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8",
                   "--spec-draft-n-max", "8")

# Peers runs send whole bursts (16, 64 streams at once) on a machine that may be slow: pagedserve queues them as
# llama-server does, instead of refusing with 429 what its admission bound predicts would wait > 10 s.
PAGEDSERVE_ARGS = ("--max-queue-wait-s", "0")


@dataclass(frozen=True)
class ServerOptions:
    model_dir: Path  # the converted Hugging Face folder (pagedserve, transformers; tokenizer for every server)
    peers_dir: Path  # git-ignored home of the llama.cpp build and the GGUF
    llama_ctx_per_slot: int = 2048  # llama-server gets -c = slots x this (prompts <= ~1,400 + answers <= 231)
    threads: int = 1  # llama-server -t (pagedserve and transformers use torch's default); see default_llama_threads
    build_jobs: int = 2
    gguf: Path | None = None  # a GGUF file both pagedserve and llama-server serve; None: pagedserve serves model_dir
    # and llama-server the default model's GGUF under peers_dir
    speculative_config: str = ""  # pagedserve's --speculative-config (JSON; "" off); pagedserve-plain never has one
    llama_spec_args: tuple[str, ...] = LLAMA_SPEC_ARGS  # llama-server's speculation flags, for llama.cpp-spec only


@dataclass(frozen=True)
class ServerKind:
    label: str
    spec: Callable[[ServerOptions, int], ServerSpec]  # (options, max concurrency it must serve) -> how to start it
    prepare: Callable[[ServerOptions], None] = lambda options: None  # build or install; cached
    restart_per_concurrency: bool = False  # True: one server per concurrency point (its slots are fixed at start)


def pagedserve_spec(options: ServerOptions, concurrency: int) -> ServerSpec:
    """Engine counters (prefix hits, KV usage) are on the scheduler's own /metrics, not the gateway's."""
    port, metrics_port = free_port(), free_port()
    model = options.gguf or options.model_dir
    speculative = ["--speculative-config", options.speculative_config] if options.speculative_config else []
    argv = [sys.executable, "-m", "pagedserve.services.cli", "serve", str(model), "--port", str(port),
            "--scheduler-port", str(free_port()), "--worker-port", str(free_port()),
            "--metrics-port", str(metrics_port), *PAGEDSERVE_ARGS, *speculative]  # fmt: skip
    return ServerSpec("pagedserve", argv, port, metrics_port=metrics_port)


def pagedserve_plain_spec(options: ServerOptions, concurrency: int) -> ServerSpec:
    """pagedserve without speculation: the baseline of a run where `pagedserve` speculates."""
    return replace(pagedserve_spec(replace(options, speculative_config=""), concurrency), label="pagedserve-plain")


def llama_spec(options: ServerOptions, concurrency: int) -> ServerSpec:
    """`-np N` parallel slots, so that N concurrent requests are decoded as one batch; N x per-slot context."""
    port = free_port()
    argv = [str(llama_server_path(options.peers_dir)), "-m", str(options.gguf or ensure_gguf(options.peers_dir)),
            "--host", "127.0.0.1", "--port", str(port), "-np", str(concurrency),
            "-c", str(concurrency * options.llama_ctx_per_slot), "-t", str(options.threads),
            "--alias", options.model_dir.name, "--metrics", "--no-webui"]  # fmt: skip
    return ServerSpec("llama.cpp", argv, port)


def llama_speculative_spec(options: ServerOptions, concurrency: int) -> ServerSpec:
    spec = llama_spec(options, concurrency)
    return replace(spec, label="llama.cpp-spec", argv=[*spec.argv, *options.llama_spec_args])


def prepare_llama(options: ServerOptions) -> None:
    ensure_llama_server(options.peers_dir, options.build_jobs)
    if options.gguf is None:
        ensure_gguf(options.peers_dir)


def transformers_cli() -> str:
    """The venv's `transformers` script; TRANSFORMERS_CLI points elsewhere (e.g. a separate venv under .peers/)."""
    default = Path(sys.executable).parent / "transformers"
    return os.environ.get("TRANSFORMERS_CLI") or (str(default) if default.exists() else shutil.which("transformers"))


def transformers_spec(options: ServerOptions, concurrency: int) -> ServerSpec:
    port = free_port()
    argv = [transformers_cli(), "serve", str(options.model_dir), "--continuous-batching", "--device", "cpu",
            "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    return ServerSpec("transformers", argv, port)


def check_transformers(options: ServerOptions) -> None:
    if options.gguf is not None:
        raise RuntimeError("transformers serve runs MODEL_DIR, not the --gguf file: left out of this comparison")
    if not transformers_cli():
        raise RuntimeError("no `transformers` CLI: pip install 'transformers[serving]' (fastapi, uvicorn)")


SERVER_KINDS = {
    kind.label: kind
    for kind in (
        ServerKind("pagedserve", pagedserve_spec),
        ServerKind("pagedserve-plain", pagedserve_plain_spec),
        ServerKind("llama.cpp", llama_spec, prepare_llama, restart_per_concurrency=True),
        ServerKind("llama.cpp-spec", llama_speculative_spec, prepare_llama, restart_per_concurrency=True),
        ServerKind("transformers", transformers_spec, check_transformers),
    )
}
LLAMA_THREADS_PREFIX = "llama.cpp-t"  # llama.cpp at one thread count of a sweep: llama.cpp-t1, llama.cpp-t2, ...


def llama_kind(threads: int) -> ServerKind:
    """llama-server with `-t threads` whatever the options say, labelled llama.cpp-t<threads>."""
    def spec(options: ServerOptions, concurrency: int) -> ServerSpec:
        label = f"{LLAMA_THREADS_PREFIX}{threads}"
        return replace(llama_spec(replace(options, threads=threads), concurrency), label=label)

    return ServerKind(f"{LLAMA_THREADS_PREFIX}{threads}", spec, prepare_llama, restart_per_concurrency=True)


def server_kinds(labels: list[str], llama_threads: tuple[int, ...]) -> dict[str, ServerKind]:
    """label -> kind, in order; with several llama thread counts, llama.cpp becomes one kind per count."""
    kinds: dict[str, ServerKind] = {}
    for label in labels:
        if label == "llama.cpp" and len(llama_threads) > 1:
            kinds |= {kind.label: kind for kind in map(llama_kind, llama_threads)}
        else:
            kinds[label] = SERVER_KINDS[label]
    return kinds
