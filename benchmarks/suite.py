"""The standard suite (issue 5): random and shared-prefix workloads, EOS suppressed, swept over concurrency.

    python -m pagedserve.benchmarks.suite --base-url URL --model NAME --label pagedserve --out-dir bench-results/

Writes <label>-<workload>.json and PNG plots per workload, and <label>-summary.txt with one sweep table each.
Flags it does not know are passed to every `serve` (e.g. --api-key, --endpoint, --extra-body).
"""

import argparse
from dataclasses import dataclass
from pathlib import Path

from pagedserve.benchmarks.cli import main as bench_main
from pagedserve.benchmarks.report import load_result, sweep_table


@dataclass(frozen=True)
class Workload:
    name: str
    args: tuple[str, ...]  # serve flags that define the workload
    min_warmups: int = 0  # warm-ups before its first point, whatever --num-warmups says


WORKLOADS = (
    # prompts of 60-540 tokens and answers of 25-231 tokens (range ratio 0.8 around 300 and 128)
    Workload(
        "random",
        ("--dataset-name", "random", "--random-input-len", "300", "--random-output-len", "128",
         "--random-range-ratio", "0.8"),
    ),
    # the seed's policy assistant: 12 handbooks of 1,250 tokens, ~1,300-token prompts, uneven answers (25-231);
    # one warm-up per handbook, so every server is measured in the steady state of a service whose handbooks it
    # has seen before (the handbooks stay the same across points: --shared-prefix-seed)
    Workload(
        "shared-prefix",
        ("--dataset-name", "shared-prefix", "--shared-prefix-len", "1250", "--shared-prefix-question-len", "50",
         "--shared-prefix-output-len", "128", "--shared-prefix-output-range-ratio", "0.8", "--num-groups", "12"),
        min_warmups=12,
    ),
    # "fix this function" prompts of 60-540 tokens whose answers (25-231 tokens) copy the function back: where
    # speculative decoding pays; run on request only (not in DEFAULT_WORKLOADS)
    Workload(
        "copy-heavy",
        ("--dataset-name", "copy-heavy", "--random-input-len", "300", "--random-output-len", "128",
         "--random-range-ratio", "0.8"),
    ),
)  # fmt: skip
DEFAULT_WORKLOADS = ("random", "shared-prefix")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pagedserve.benchmarks.suite", description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--label", required=True, help="names the result files, e.g. pagedserve or vllm")
    parser.add_argument("--out-dir", default="bench-results")
    parser.add_argument("--tokenizer", default=None, help="HF tokenizer folder; default: --model if it is a folder")
    parser.add_argument("--backend", default="openai-chat", choices=("openai-chat", "openai-completions"))
    parser.add_argument("--concurrencies", default="1,4,16,64")
    parser.add_argument("--num-prompts", type=int, default=128, help="requests per concurrency point")
    parser.add_argument("--num-warmups", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                        help=f"comma list of {', '.join(w.name for w in WORKLOADS)}")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG plots")
    return parser


def warmups_for(workload: Workload, num_warmups: int) -> int:
    """0 stays 0 (a point after the first); otherwise at least the workload's minimum."""
    return max(num_warmups, workload.min_warmups) if num_warmups > 0 else 0


def serve_argv(args: argparse.Namespace, workload: Workload, passthrough: list[str]) -> list[str]:
    argv = [
        "serve", "--base-url", args.base_url, "--model", args.model, "--backend", args.backend,
        "--label", args.label, "--num-prompts", str(args.num_prompts),
        "--num-warmups", str(warmups_for(workload, args.num_warmups)),
        "--seed", str(args.seed), "--sweep", f"max-concurrency={args.concurrencies}", "--ignore-eos",
        "--save-result", "--result-dir", args.out_dir,
        "--result-filename", f"{args.label}-{workload.name}.json", *workload.args, *passthrough,
    ]  # fmt: skip
    argv += ["--tokenizer", args.tokenizer] if args.tokenizer else []
    return argv + ([] if args.no_plot else ["--plot"])


def main(argv: list[str] | None = None) -> int:
    args, passthrough = build_parser().parse_known_args(argv)
    chosen = args.workloads.split(",")
    unknown = set(chosen) - {w.name for w in WORKLOADS}
    if unknown:
        raise SystemExit(f"unknown workloads: {sorted(unknown)}")
    summary, status = [], 0
    for workload in (w for w in WORKLOADS if w.name in chosen):
        rc = bench_main(serve_argv(args, workload, passthrough))
        status = status or rc
        path = Path(args.out_dir) / f"{args.label}-{workload.name}.json"
        if rc == 0 and path.is_file():
            summary += [f"## {args.label} / {workload.name}", sweep_table(load_result(path)), ""]
    summary_path = Path(args.out_dir) / f"{args.label}-summary.txt"
    summary_path.parent.mkdir(parents=True, exist_ok=True)
    summary_path.write_text("\n".join(summary))
    print(f"summary: {summary_path}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
