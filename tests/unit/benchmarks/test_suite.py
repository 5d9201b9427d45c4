import json

from pagedserve.benchmarks.suite import WORKLOADS, main, warmups_for
from tests.unit.benchmarks.conftest import MODEL_DIR
from tests.unit.benchmarks.fake_openai_server import FakeOpenAIServer, FakeState


def test_suite_runs_both_workloads_over_the_concurrency_sweep(tmp_path, tokenizer):
    state = FakeState(chunk_delay_s=0.0)
    with FakeOpenAIServer(state) as server:
        rc = main([
            "--base-url", server.base_url, "--model", "fake-model", "--tokenizer", str(MODEL_DIR), "--label", "ps",
            "--out-dir", str(tmp_path), "--concurrencies", "1,2", "--num-prompts", "3", "--num-warmups", "0",
            "--no-plot", "--disable-tqdm",
        ])  # fmt: skip
    assert rc == 0
    for workload in ("random", "shared-prefix"):
        result = json.loads((tmp_path / f"ps-{workload}.json").read_text())
        assert [run["load"]["max_concurrency"] for run in result["runs"]] == [1, 2]
        assert all(run["metrics"]["completed"] == 3 for run in result["runs"])
        assert result["contract"]["args"]["ignore_eos"] is True
    summary = (tmp_path / "ps-summary.txt").read_text()
    assert "## ps / random" in summary and "## ps / shared-prefix" in summary

    bodies = [b for b in state.bodies if b["max_tokens"] != 2]  # leave out the EOS probes
    random_bodies, shared_bodies = bodies[:6], bodies[6:]
    assert all(60 <= tokenizer.count(b["messages"][0]["content"]) <= 540 for b in random_bodies)
    assert all(25 <= b["max_tokens"] <= 231 for b in bodies)
    system, question = shared_bodies[0]["messages"]
    assert (system["role"], tokenizer.count(system["content"])) == ("system", 1250)
    assert tokenizer.count(question["content"]) == 50


def test_shared_prefix_warms_every_handbook_once():
    """A first point's warm-ups cover all 12 handbooks; later points of the same server get none."""
    shared = next(w for w in WORKLOADS if w.name == "shared-prefix")
    random = next(w for w in WORKLOADS if w.name == "random")
    assert (warmups_for(shared, 2), warmups_for(shared, 0), warmups_for(shared, 20)) == (12, 0, 20)
    assert (warmups_for(random, 2), warmups_for(random, 0)) == (2, 0)
