"""`pagedserve`: serve a model with one command, or run one service, or benchmark a server."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

# command -> (module with main(argv, prog), one-line description)
COMMANDS = {
    "serve": ("pagedserve.services.launcher", "start worker, scheduler and gateway for MODEL_DIR (the one command)"),
    "gateway": ("pagedserve.services.gateway.__main__", "the OpenAI-compatible HTTP gateway"),
    "scheduler": ("pagedserve.services.scheduler.__main__",
                  "the scheduler (continuous batching, KV blocks, prefix cache)"),
    "worker": ("pagedserve.services.gpu_worker.__main__", "the gpu-worker (model and paged KV cache on one device)"),
    "bench": ("pagedserve.benchmarks.cli", "benchmark an OpenAI-compatible server"),
}


def usage() -> str:
    lines = ["usage: pagedserve COMMAND [ARGS]  (pagedserve COMMAND --help for its flags)", "", "commands:"]
    lines += [f"  {name:<10} {description}" for name, (_, description) in COMMANDS.items()]
    lines += ["", "Every flag can also be set with a PAGEDSERVE_* environment variable (--kv-cache-memory-bytes ->",
              "PAGEDSERVE_KV_CACHE_MEMORY_BYTES)."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"pagedserve: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[command][0])  # imported lazily: each command pulls only its deps
    if command == "bench":
        return module.main(rest)
    return module.main(rest, prog=f"pagedserve {command}")


if __name__ == "__main__":
    sys.exit(main())
