"""The batch-invariance bench's table: tok/s over all rounds (not the mean of the rounds' rates), the median of the
rounds' ITL medians, and the invariant/default ratios."""

from __future__ import annotations

import math

from pagedserve.benchmarks.batch_invariant.__main__ import build_parser
from pagedserve.benchmarks.batch_invariant.summary import cell, table


def _metrics(tokens: int, seconds: float, itl_ms: float | None) -> dict:
    return {"total_output_tokens": tokens, "duration_s": seconds, "output_throughput_tok_s": tokens / seconds,
            "median_itl_ms": itl_ms}


def test_a_cell_sums_tokens_and_durations_and_takes_the_median_itl() -> None:
    c = cell([_metrics(100, 1.0, 10.0), _metrics(100, 3.0, 30.0), _metrics(100, 1.0, 20.0)])
    assert math.isclose(c.output_tok_s, 300 / 5.0)
    assert c.itl_p50_ms == 20.0
    assert c.rounds_tok_s == (100.0, 33.3, 100.0)


def test_rounds_without_an_itl_are_left_out_of_its_median() -> None:
    assert cell([_metrics(8, 2.0, None), _metrics(8, 2.0, 12.0)]).itl_p50_ms == 12.0
    assert math.isnan(cell([_metrics(1, 1.0, None)]).itl_p50_ms)


def test_the_table_has_a_line_per_stream_count_with_the_ratios() -> None:
    cells = {16: {"default": cell([_metrics(400, 2.0, 40.0)]), "invariant": cell([_metrics(400, 4.0, 60.0)])},
             1: {"default": cell([_metrics(50, 1.0, 20.0)]), "invariant": cell([_metrics(50, 1.0, 20.0)])}}
    lines = table(cells).splitlines()
    assert lines[2] == "| 1 | 50.0 | 50.0 | 1.00 | 20.0 | 20.0 | 1.00 |"
    assert lines[3] == "| 16 | 200.0 | 100.0 | 0.50 | 40.0 | 60.0 | 1.50 |"


def test_the_default_run_is_short() -> None:
    args = build_parser().parse_args([])
    assert (args.streams, args.output_len, args.rounds) == ("1,16,64", 64, 2)
