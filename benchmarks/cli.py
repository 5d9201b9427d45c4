"""Command line: `serve` runs a benchmark, `compare` puts result files side by side. Flags follow vllm bench serve."""

import argparse
import math
import sys
from datetime import datetime
from pathlib import Path

import uvloop

from pagedserve.benchmarks.cli_config import serve_config_from_args
from pagedserve.benchmarks.compare import run_compare
from pagedserve.benchmarks.datasets import DATASET_NAMES, SYNTHETIC_DATASETS
from pagedserve.benchmarks.metrics import LATENCY_METRICS
from pagedserve.benchmarks.payload import BACKEND_ALIASES, DEFAULT_ENDPOINTS, EOS_SUPPRESSIONS
from pagedserve.benchmarks.report import run_table, save_result, sweep_table
from pagedserve.benchmarks.serve import run_serve


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults shown after every help text; not for switches (always off) or None (the help text says what then)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.nargs == 0 and not isinstance(action, argparse.BooleanOptionalAction):
            return action.help or ""
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagedserve bench", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="benchmark an OpenAI-compatible server", formatter_class=_HelpFormatter,
                                description="Send a dataset's requests to a server at one or more load points and "
                                            "report throughput and latency (as vllm bench serve). Exits 1 when any "
                                            "request failed, 2 on bad arguments.")
    _add_serve_args(serve)
    compare = commands.add_parser("compare", help="compare result files; ratios are against the first",
                                  formatter_class=_HelpFormatter)
    compare.add_argument("results", nargs="+", help="result JSON files written by serve --save-result")
    compare.add_argument("--plot", default=None, help="also write latency-vs-load of all files to this PNG")
    return parser


def _add_serve_args(p: argparse.ArgumentParser) -> None:
    target = p.add_argument_group("target")
    target.add_argument("--base-url", default=None, help="server root, e.g. http://127.0.0.1:8000 (no /v1)")
    target.add_argument("--host", default="127.0.0.1", help="used when --base-url is not given")
    target.add_argument("--port", type=int, default=8000, help="used when --base-url is not given")
    target.add_argument("--model", default=None,
                        help="model name sent in requests; default: the first model of the server's /v1/models")
    backends = (*DEFAULT_ENDPOINTS, *BACKEND_ALIASES)
    target.add_argument("--backend", "--endpoint-type", dest="endpoint_type", default="openai-chat", choices=backends,
                        help="API to call: chat completions, or completions (openai and vllm mean completions)")
    target.add_argument("--endpoint", default=None, help="path; default /v1/chat/completions or /v1/completions")
    target.add_argument("--api-key", default=None, help="bearer token (default: $OPENAI_API_KEY)")
    target.add_argument("--tokenizer", default=None,
                        help="Hugging Face tokenizer folder; default: --model when it is a folder, else the model "
                             "folder the server's /v1/models names as `root` (pagedserve, vLLM) when it is on this "
                             "machine")
    target.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request")
    target.add_argument("--temperature", type=float, default=0.0, help="sampling temperature of every request")
    target.add_argument("--extra-body", default=None, help="JSON object merged into every request body")
    target.add_argument("--constrained-body", default=None,
                        help="JSON object merged into a fraction of the request bodies, e.g. "
                             '\'{"response_format": {"type": "json_schema", ...}}\'')
    target.add_argument("--constrained-fraction", type=float, default=None,
                        help="share of the requests that get --constrained-body, spread evenly; default 1 with it")
    target.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=None,
                        help="generate exactly max_tokens for every request (EOS suppressed); default: on "
                             f"for the synthetic datasets ({', '.join(SYNTHETIC_DATASETS)}), off for recorded ones")
    target.add_argument(
        "--eos-suppression",
        default="auto",
        choices=EOS_SUPPRESSIONS,
        help="how EOS is suppressed; auto tries ignore_eos, then logit_bias on a 4xx",
    )
    _add_dataset_args(p.add_argument_group("dataset"))
    _add_load_args(p.add_argument_group("load"))
    _add_output_args(p.add_argument_group("metrics and output"))


def _add_dataset_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--dataset-name", default="random", choices=DATASET_NAMES,
                   help="random: random words of the given lengths; shared-prefix: groups sharing a long prompt; "
                        "copy-heavy: 'fix this function' prompts whose answers repeat the prompt (random lengths); "
                        "sharegpt / custom: prompts read from --dataset-path")
    g.add_argument("--dataset-path", default=None, help="sharegpt JSON/JSONL or custom JSONL file")
    g.add_argument("--num-prompts", type=int, default=200, help="requests per load point")
    g.add_argument("--seed", type=int, default=0, help="load point i uses seed + i")
    g.add_argument("--random-input-len", type=int, default=1024, help="prompt tokens of each random request")
    g.add_argument("--random-output-len", type=int, default=128, help="max_tokens of each random request")
    g.add_argument("--random-range-ratio", type=float, default=0.0, help="lengths uniform in len * [1 - r, 1 + r]")
    g.add_argument("--random-prefix-len", type=int, default=0, help="tokens of a prefix shared by all prompts")
    g.add_argument("--shared-prefix-len", type=int, default=1250, help="tokens of each group's shared prompt")
    g.add_argument("--shared-prefix-question-len", type=int, default=50, help="tokens of each question")
    g.add_argument("--shared-prefix-output-len", type=int, default=128, help="mean max_tokens of each answer")
    g.add_argument("--shared-prefix-output-range-ratio", type=float, default=0.8, help="unevenness of answers")
    g.add_argument("--shared-prefix-seed", type=int, default=0,
                   help="seed of the shared prompts themselves (--seed varies questions and answer lengths)")
    g.add_argument("--num-groups", type=int, default=12, help="distinct shared prompts")
    g.add_argument("--sharegpt-output-len", type=int, default=None, help="override the recorded reply lengths")
    g.add_argument("--custom-output-len", type=int, default=256, help="for custom lines without output_tokens")


def _add_load_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--request-rate", type=float, default=math.inf, help="requests/s; inf sends all at once")
    g.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of gaps; 1 = Poisson")
    g.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most; None: no cap")
    g.add_argument("--num-warmups", type=int, default=0, help="unmeasured requests before the first point")
    g.add_argument("--sweep", default=None, help="max-concurrency=1,4,16,64 or request-rate=1,2,4,inf")


def _add_output_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--percentile-metrics", default=",".join(LATENCY_METRICS), help="comma list of ttft,tpot,itl,e2el")
    g.add_argument("--metric-percentiles", default="90,95,99", help="comma list; mean, median, std always shown")
    g.add_argument("--goodput", nargs="+", default=None, metavar="METRIC:MS", help="SLOs, e.g. ttft:500 tpot:50")
    g.add_argument("--metrics-url", default=None, help="Prometheus endpoint; default BASE_URL/metrics")
    g.add_argument("--no-server-metrics", action="store_true", help="do not scrape /metrics")
    g.add_argument("--metrics-interval", type=float, default=0.5, help="seconds between /metrics polls")
    g.add_argument("--label", default=None, help="names this result in files and compare; default: backend")
    g.add_argument("--save-result", action="store_true", help="write the result JSON")
    g.add_argument("--result-dir", default="bench-results", help="folder of the result JSON and the plots")
    g.add_argument("--result-filename", default=None,
                   help="result file name or path (joined to --result-dir; an absolute path wins); "
                        "default: LABEL-DATASET-MODEL-TIMESTAMP.json")
    g.add_argument("--plot", action="store_true", help="write PNG plots next to the result")
    g.add_argument("--disable-tqdm", action="store_true", help="no progress bar")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "compare":
            print(run_compare(args.results, args.plot))
            return 0
        return _serve(args)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _serve(args: argparse.Namespace) -> int:
    cfg, tokenizer = serve_config_from_args(args)
    # uvloop: the client's own CPU is taken from the server under test
    result = uvloop.run(run_serve(cfg, tokenizer, vars(args), on_run=lambda run: print(run_table(run), flush=True)))
    if len(result["runs"]) > 1:
        print(sweep_table(result))
    path = result_path(args.result_dir, args.result_filename
                       or _default_filename(args, cfg.label, result["contract"]["model"]))
    out_dir, stem = path.parent, path.stem
    if args.save_result:
        save_result(result, path)
        print(f"result: {path}")
    if args.plot:
        from pagedserve.benchmarks.plots import write_plots

        for path in write_plots(result, out_dir, stem):
            print(f"plot: {path}")
    return _exit_code(result)


def result_path(result_dir: str, result_filename: str) -> Path:
    """Where the result goes, as vLLM's bench writes it: the file name joined to --result-dir, so a path in
    --result-filename is kept (an absolute one wins over the folder)."""
    return Path(result_dir) / result_filename


def _exit_code(result: dict) -> int:
    """0 when every measured request succeeded; 1 (with the count and kinds on stderr) when any failed."""
    failures: dict[str, int] = {}
    num_requests = 0
    for run in result["runs"]:
        num_requests += run["metrics"]["completed"] + run["metrics"]["failed"]
        for kind, count in run["metrics"]["failures"].items():
            failures[kind] = failures.get(kind, 0) + count
    if not failures:
        return 0
    kinds = ", ".join(f"{kind}: {count}" for kind, count in sorted(failures.items()))
    print(f"error: {sum(failures.values())} of {num_requests} requests failed ({kinds})", file=sys.stderr)
    return 1


def _default_filename(args: argparse.Namespace, label: str, model: str) -> str:
    timestamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{label}-{args.dataset_name}-{Path(model).name}-{timestamp}.json"
