"""`python -m pagedserve.benchmarks.structured`: output tok/s with half the requests under a JSON schema vs none, one
server.

Starts `pagedserve serve MODEL_DIR` on free ports and runs the bench (`pagedserve.benchmarks.cli serve`) at
--concurrency
streams in alternating rounds: all requests free, then every second one under a JSON schema whose grammar cannot end
before max_tokens (so it constrains every step). Alternating on one server keeps both modes under the same machine
load; each mode's tok/s is its output tokens over its time, summed over its rounds. Exits 1 when the ratio is below
--min-ratio or a request failed.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from pagedserve.benchmarks.cli import main as bench_main
from pagedserve.benchmarks.peers.process import ServerProcess, local_pagedserve_spec

# Every step of a constrained request is under the grammar: at least 64 strings, far more than max_tokens holds.
SCHEMA = {"type": "object", "properties": {"items": {"type": "array", "minItems": 64,
                                                     "items": {"type": "string", "maxLength": 24}}},
          "required": ["items"], "additionalProperties": False}
CONSTRAINED_BODY = {"response_format": {"type": "json_schema",
                                        "json_schema": {"name": "items", "schema": SCHEMA, "strict": True}}}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pagedserve.benchmarks.structured", description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", default="models/SmolLM2-135M-Instruct")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--num-prompts", type=int, default=32, help="requests per round")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2, help="rounds of each mode, alternating")
    p.add_argument("--fraction", type=float, default=0.5, help="share of the requests under the schema")
    p.add_argument("--min-ratio", type=float, default=0.85, help="constrained/free tok/s below this exits 1")
    p.add_argument("--serve-args", default="", help="extra `pagedserve serve` flags, one shell-quoted string")
    p.add_argument("--out", default="bench-results/structured.json")
    p.add_argument("--log", default="bench-results/logs/structured-serve.log")
    return p



def bench_round(args: argparse.Namespace, base_url: str, model: str, constrained: bool, seed: int,
                result_dir: Path) -> dict:
    """One bench run; returns its metrics."""
    name = f"{'constrained' if constrained else 'free'}-{seed}.json"
    argv = ["serve", "--base-url", base_url, "--model", model, "--tokenizer", args.model_dir,
            "--dataset-name", "random", "--num-prompts", str(args.num_prompts), "--random-input-len",
            str(args.input_len), "--random-output-len", str(args.output_len), "--ignore-eos",
            "--max-concurrency", str(args.concurrency), "--seed", str(seed), "--num-warmups", "4",
            "--disable-tqdm", "--no-server-metrics", "--save-result", "--result-dir", str(result_dir),
            "--result-filename", name]
    if constrained:
        argv += ["--constrained-body", json.dumps(CONSTRAINED_BODY), "--constrained-fraction", str(args.fraction)]
    if bench_main(argv) != 0:
        raise RuntimeError(f"the {name} round had failed requests")
    return json.loads((result_dir / name).read_text())["runs"][0]["metrics"]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rounds: dict[str, list[dict]] = {"free": [], "constrained": []}
    spec = local_pagedserve_spec(args.model_dir, args.serve_args)
    with ServerProcess(spec, Path(args.log)) as server, tempfile.TemporaryDirectory() as tmp:
        model = server.model_name()
        for i in range(args.rounds):
            for mode in ("free", "constrained"):  # same seed for both: the same prompts
                rounds[mode].append(bench_round(args, server.spec.base_url, model, mode == "constrained", 100 + i,
                                                Path(tmp)))
    tok_s = {mode: sum(m["total_output_tokens"] for m in runs) / sum(m["duration_s"] for m in runs)
             for mode, runs in rounds.items()}
    ratio = tok_s["constrained"] / tok_s["free"]
    summary = {"concurrency": args.concurrency, "num_prompts": args.num_prompts, "input_len": args.input_len,
               "output_len": args.output_len, "fraction": args.fraction, "rounds": args.rounds,
               "output_tok_s": {mode: round(v, 1) for mode, v in tok_s.items()}, "ratio": round(ratio, 3),
               "per_round_tok_s": {mode: [round(m["output_throughput_tok_s"], 1) for m in runs]
                                   for mode, runs in rounds.items()}}
    print(json.dumps(summary, indent=2))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if ratio >= args.min_ratio else 1


if __name__ == "__main__":
    raise SystemExit(main())
