"""The tenants benchmark's accounting on made-up records (no server, no clock): backlog intervals, tokens counted
where they arrived, B's share only while both tenants wait, A's rate alone, probes under the flood, the targets,
the per-tenant counter and the keys file it serves with."""

from __future__ import annotations

import math

import pytest

from pagedserve.benchmarks.records import RequestRecord
from pagedserve.benchmarks.tenants import accounting
from pagedserve.benchmarks.tenants.__main__ import keys_file
from pagedserve.benchmarks.tenants.accounting import FairShareFigures, PriorityFigures
from pagedserve.benchmarks.tenants.report import table, targets
from pagedserve.services.gateway.tenants.keys_file import load_keys_file


def rec(send: float, chunks: list[float], tokens: int | None = None, error: str | None = None) -> RequestRecord:
    """A request sent at `send` whose text chunks arrived at the given absolute times."""
    r = RequestRecord(0, 32, send_offset_s=send, chunk_times_s=[t - send for t in chunks], error=error)
    r.num_output_tokens = len(chunks) if tokens is None else tokens
    r.e2el_s = (chunks[-1] - send) if chunks else 1.0
    return r


def test_intervals_merge_and_intersect():
    assert accounting.merge([(3, 4), (0, 1), (0.5, 2), (5, 5)]) == [(0, 2), (3, 4)]
    assert accounting.intersect([(0, 2), (3, 6)], [(1, 4), (5, 7)]) == [(1, 2), (3, 4), (5, 6)]
    assert accounting.length([(1, 2), (3, 4.5)]) == 2.5
    assert accounting.inside(1.0, [(1, 2)]) and not accounting.inside(2.0, [(1, 2)])
    assert not accounting.inside(0.5, [(1, 2)]) and accounting.inside(3.5, [(1, 2), (3, 4)])


def test_a_tenant_is_backlogged_from_a_send_to_its_first_token_and_a_failure_until_it_ended():
    records = [rec(0.0, [1.0, 1.5]), rec(0.5, [2.0]), rec(4.0, [], error="http_500")]
    assert accounting.backlog(records) == [(0.0, 2.0), (4.0, 5.0)]


def test_usage_tokens_are_spread_over_the_chunks_where_they_arrived():
    r = rec(0.0, [1.0, 2.0], tokens=6)  # e.g. a detokenizer holding back bytes: 3 tokens a chunk
    assert accounting.token_arrivals(r) == [(1.0, 3.0), (2.0, 3.0)]
    assert accounting.tokens_within([r], [(0.0, 1.5)]) == 3.0
    assert accounting.last_token_s([r, rec(0.5, [2.5])]) == 2.5


def test_fair_share_counts_only_while_both_wait_after_settling_and_a_alone_after_b_s_last_token():
    # A waits from 0 to 20 (a request whose first token comes at 20); a token a second arrives at 1, 2, ..., 29
    a = [rec(0.0, [20.0]), rec(0.0, [float(t) for t in range(1, 30) if t != 20])]
    # B waits from 0 to 10; a token a second from 1 to 12
    b = [rec(0.0, [10.0]), rec(0.0, [float(t) for t in range(1, 13) if t != 10])]
    figures = accounting.fair_share(a, b, settle_s=2.0, b_stop_s=12.0, a_stop_s=30.0)
    # both waited over [0, 10), counted from 2: A's and B's tokens at 2..9
    assert figures.both_s == 8.0 and figures.a_both == 8 and figures.b_both == 8 and figures.b_share == 0.5
    # B's last token at 12; A backlogged until 20 only (then nothing waits): its tokens at 12..19
    assert figures.alone_s == 8.0 and figures.a_alone == 8 and figures.alone_ratio == pytest.approx(0.5)


def test_priority_counts_only_probes_sent_while_the_flood_waited():
    flood = [rec(10.0, [20.0])]  # the flood waited over [10, 20)
    unloaded = [rec(0.0, [0.1]), rec(1.0, [1.3]), rec(2.0, [2.2])]
    probes = [rec(11.0, [11.2]), rec(12.0, [12.4]), rec(25.0, [26.0])]  # the last came after the flood
    figures = accounting.priority(unloaded, probes, flood)
    assert figures.unloaded_p50_s == pytest.approx(0.2) and figures.flood_p50_s == pytest.approx(0.3)
    assert (figures.num_unloaded, figures.num_flood, figures.num_flood_sent) == (3, 2, 3)
    assert figures.ratio == pytest.approx(1.5)


def test_targets_pass_and_fail_on_their_bounds_and_a_figure_of_nothing_fails():
    fair = FairShareFigures(both_s=10, a_both=540, b_both=460, alone_s=5, a_alone=480)
    prio = PriorityFigures(unloaded_p50_s=0.1, flood_p50_s=0.19, num_unloaded=10, num_flood=10, num_flood_sent=10)
    assert [t.ok for t in targets(fair, prio, 0)] == [True, True, True, True]
    unfair = FairShareFigures(both_s=10, a_both=560, b_both=440, alone_s=5, a_alone=400)
    slow = PriorityFigures(0.1, 0.21, 10, 10, 10)
    assert [t.ok for t in targets(unfair, slow, 1)] == [False, False, False, False]
    nothing = targets(FairShareFigures(0, 0, 0, 0, 0), PriorityFigures(0.1, math.nan, 10, 0, 10), 0)
    assert [t.ok for t in nothing] == [False, False, False, True]
    assert "| **no** |" in table(nothing) and "46.0%" in table(targets(fair, prio, 0))


def test_the_gateway_s_generated_tokens_by_tenant():
    text = """# TYPE pagedserve_gateway_tenant_tokens_total counter
pagedserve_gateway_tenant_tokens_total{kind="generated",tenant="a"} 120.0
pagedserve_gateway_tenant_tokens_total{kind="prompt",tenant="a"} 999.0
pagedserve_gateway_tenant_tokens_total{kind="generated",tenant="b"} 80.0
"""
    assert accounting.tenant_generated(text) == {"a": 120.0, "b": 80.0}


def test_the_keys_file_gives_two_equal_tenants_and_the_two_priority_classes(tmp_path):
    table_ = load_keys_file(keys_file(tmp_path))
    by_name = {t.name: t for t in table_.tenants}
    assert by_name["a"].weight == by_name["b"].weight == 1
    assert by_name["urgent"].priority == 0 and by_name["bulk"].priority == 10
