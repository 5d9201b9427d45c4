from pagedserve.benchmarks.compare import compare_table, contract_differences, matched_runs, result_names


def result(label: str, runs: dict[str, dict]) -> dict:
    return {
        "contract": {"label": label},
        "runs": [{"label": key, "metrics": metrics, "server_metrics": None} for key, metrics in runs.items()],
    }


def metrics(rps: float, p99_ttft_ms: float | None, failed: int = 0) -> dict:
    return {
        "num_requests": 10,
        "failed": failed,
        "failures": {},
        "request_throughput_rps": rps,
        "p99_ttft_ms": p99_ttft_ms,
    }


def rows(table: str, section: str) -> dict[str, list[str]]:
    lines = table.splitlines()
    start = lines.index(f"== {section} ==")
    out = {}
    for line in lines[start + 2 :]:
        if not line or line.startswith("=="):
            break
        out[line.split()[0]] = line.split()[1:]
    return out


def test_ratios_are_against_the_first_file_per_load_point():
    a = result("vllm", {"c=1": metrics(2.0, 100.0), "c=4": metrics(4.0, 200.0)})
    b = result("pagedserve", {"c=4": metrics(5.0, 150.0, failed=1), "c=1": metrics(3.0, 50.0)})
    table = compare_table(["vllm", "pagedserve"], [a, b])
    assert rows(table, "c=1") == {
        "failed": ["0", "0", "-"],
        "request_throughput_rps": ["2.00", "3.00", "1.500"],
        "p99_ttft_ms": ["100.00", "50.00", "0.500"],
    }
    assert rows(table, "c=4")["request_throughput_rps"] == ["4.00", "5.00", "1.250"]
    assert rows(table, "c=4")["failed"] == ["0", "1", "-"]  # no ratio against zero


def test_unmatched_points_and_missing_values_show_dashes():
    a = result("a", {"c=1": metrics(2.0, None), "c=8": metrics(1.0, 10.0)})
    b = result("b", {"c=1": metrics(1.0, 5.0)})
    c = result("c", {"c=1": metrics(4.0, 20.0)})
    table = compare_table(["a", "b", "c"], [a, b, c])
    assert rows(table, "c=1")["p99_ttft_ms"] == ["-", "5.00", "-", "20.00", "-"]
    assert rows(table, "c=1")["request_throughput_rps"] == ["2.00", "1.00", "0.500", "4.00", "2.000"]
    assert rows(table, "c=8")["request_throughput_rps"] == ["1.00", "-", "-", "-", "-"]


def test_single_run_files_match_whatever_their_load():
    a = result("a", {"c=1": metrics(2.0, 1.0)})
    b = result("b", {"c=2": metrics(2.0, 1.0)})
    ((label, runs),) = matched_runs([a, b])
    assert label == "c=1" and [r["label"] for r in runs] == ["c=1", "c=2"]


def test_names_fall_back_to_file_stems_when_labels_collide():
    same = [result("x", {}), result("x", {})]
    assert result_names(["r/one.json", "r/two.json"], same) == ["one", "two"]
    assert result_names(["r/one.json", "r/two.json"], [result("x", {}), result("y", {})]) == ["x", "y"]


def test_contract_differences_are_flagged():
    a, b = result("a", {}), result("b", {})
    a["contract"] |= {"model": "m", "seed": 0, "dataset": {"name": "random", "num_prompts": 8}}
    b["contract"] |= {"model": "m", "seed": 0, "dataset": {"name": "random", "num_prompts": 16}}
    assert contract_differences(["a", "b"], [a, b]) == [
        'warning: dataset differs: a={"name": "random", "num_prompts": 8}; b={"name": "random", "num_prompts": 16}'
    ]
    assert contract_differences(["a", "a2"], [a, a]) == []
