"""The README's benchmark command and figures stay true: the command parses with today's flags and the images it
links exist (the command itself was run on a fresh clone when it was pasted; the integration test
tests/integration/test_bench_cli.py runs the same kind of command against a live server)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from pagedserve.benchmarks.cli import build_parser

REPO = Path(__file__).resolve().parents[3]
README = (REPO / "README.md").read_text()


def shell_commands(text: str) -> list[str]:
    """Commands of the ```bash blocks, continuation lines joined and trailing comments dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    joined = "\n".join(blocks).replace("\\\n", " ")
    return [line.split("  #")[0].strip() for line in joined.splitlines() if line.strip()]


def test_the_readme_bench_command_parses_with_todays_flags():
    commands = [c for c in shell_commands(README) if " bench serve " in f" {c} "]
    assert commands, "the README shows no `pagedserve bench serve` command"
    for command in commands:
        argv = shlex.split(command)
        args = build_parser().parse_args(argv[argv.index("bench") + 1:])
        assert args.command == "serve" and args.model is None and args.tokenizer is None, command
        assert args.ignore_eos is None, "the command relies on the default EOS suppression"


def test_the_readme_figures_exist_and_are_pngs():
    images = re.findall(r"\]\((docs/[^)\s]+\.png)\)", README)
    assert len(images) >= 2, "the README links a sweep plot and a distribution plot"
    for image in images:
        assert (REPO / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", image
