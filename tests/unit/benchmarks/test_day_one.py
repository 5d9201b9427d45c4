"""`pagedserve bench serve` as a newcomer types it: no --tokenizer (the server's /v1/models root names the model
folder), no --model (the server's first model), EOS suppressed for synthetic datasets, a non-zero exit when any
request fails, and a --help where every flag explains itself and shows its default."""

import argparse
import json

import pytest

from pagedserve.benchmarks.cli import build_parser, main
from tests.unit.benchmarks.conftest import MODEL_DIR
from tests.unit.benchmarks.fake_openai_server import FakeOpenAIServer, FakeState

SMALL = ["--random-input-len", "16", "--random-output-len", "4", "--num-prompts", "6", "--max-concurrency", "2",
         "--disable-tqdm", "--no-server-metrics"]


def run(base_url: str, tmp_path, *flags: str) -> int:
    return main(["serve", "--base-url", base_url, "--save-result", "--result-dir", str(tmp_path),
                 "--result-filename", "r.json", *SMALL, *flags])


def test_tokenizer_and_model_come_from_the_server(tmp_path, capsys):
    state = FakeState(model_root=str(MODEL_DIR.resolve()), eos_first=True)
    with FakeOpenAIServer(state) as server:
        assert run(server.base_url, tmp_path, "--dataset-name", "random") == 0
    out = capsys.readouterr().out
    assert "model: fake-model (the first of the server's /v1/models)" in out
    assert f"tokenizer: {MODEL_DIR.resolve()} (the model's root in the server's /v1/models)" in out
    contract = json.loads((tmp_path / "r.json").read_text())["contract"]
    assert contract["model"] == "fake-model" and contract["tokenizer"] == str(MODEL_DIR.resolve())
    assert contract["sampling"]["ignore_eos"] is True and contract["eos_token_ids"]  # EOS ids from that folder
    measured = state.bodies[-6:]
    assert all(body["model"] == "fake-model" and body["ignore_eos"] is True for body in measured)


def test_without_a_tokenizer_anywhere_random_data_says_what_to_pass(tmp_path, capsys):
    with FakeOpenAIServer(FakeState()) as server:  # no root in /v1/models
        assert run(server.base_url, tmp_path, "--model", "fake-model") == 2
    assert "needs a tokenizer: pass --tokenizer" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "suppressed"), [
    ((), True),  # random data: EOS suppressed by default, as vllm bench's synthetic runs
    (("--no-ignore-eos",), False),
    (("--dataset-name", "shared-prefix", "--shared-prefix-len", "16", "--shared-prefix-question-len", "4",
      "--shared-prefix-output-len", "4", "--num-groups", "2"), True),
])
def test_eos_is_suppressed_by_default_for_synthetic_data(tmp_path, flags, suppressed, capsys):
    state = FakeState(model_root=str(MODEL_DIR), eos_first=True)
    with FakeOpenAIServer(state) as server:
        rc = run(server.base_url, tmp_path, *flags)
    measured = state.bodies[-6:]
    assert all(body.get("ignore_eos", False) is suppressed for body in measured)
    if suppressed:
        assert rc == 0
    else:  # every answer ended at once: no_tokens failures, and the exit code says so
        assert rc == 1
        assert "error: 6 of 6 requests failed (no_tokens: 6)" in capsys.readouterr().err


def test_recorded_datasets_keep_eos_unless_asked(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps({"prompt": f"q{i}", "output_tokens": 4}) for i in range(6)))
    state = FakeState(model_root=str(MODEL_DIR))
    with FakeOpenAIServer(state) as server:
        assert run(server.base_url, tmp_path, "--dataset-name", "custom", "--dataset-path", str(trace)) == 0
        assert all("ignore_eos" not in body for body in state.bodies[-6:])
        assert run(server.base_url, tmp_path, "--dataset-name", "custom", "--dataset-path", str(trace),
                   "--ignore-eos") == 0
        assert all(body.get("ignore_eos") is True for body in state.bodies[-6:])


def _serve_parser() -> argparse.ArgumentParser:
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices["serve"]


def test_every_serve_flag_has_help_and_shows_its_default():
    parser = _serve_parser()
    for action in parser._actions:
        if action.dest == "help":
            continue
        assert action.help and action.help.strip(), f"{action.option_strings} has no help text"
    text = " ".join(parser.format_help().split())
    for shown in ("--num-prompts NUM_PROMPTS requests per load point (default: 200)",
                  "--random-input-len RANDOM_INPUT_LEN prompt tokens of each random request (default: 1024)",
                  "--dataset-name {random,shared-prefix,copy-heavy,sharegpt,custom}", "(default: random)",
                  "--ignore-eos, --no-ignore-eos", "--temperature TEMPERATURE sampling temperature of every "
                  "request (default: 0.0)", "Exits 1 when any request failed"):
        assert shown in text, shown
