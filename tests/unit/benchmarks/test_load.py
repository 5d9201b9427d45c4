import math

import numpy as np
import pytest

from pagedserve.benchmarks.load import LoadPoint, arrival_offsets_s, offered_load, parse_sweep


def test_inf_rate_sends_everything_at_once():
    offsets = arrival_offsets_s(50, LoadPoint(), np.random.default_rng(0))
    assert offsets.tolist() == [0.0] * 50


def test_poisson_mean_rate_and_exponential_gaps():
    offsets = arrival_offsets_s(20_001, LoadPoint(request_rate=8.0), np.random.default_rng(0))
    gaps = np.diff(offsets)
    assert offsets[0] == 0.0
    assert np.all(gaps >= 0)
    assert 20_000 / offsets[-1] == pytest.approx(8.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential: coefficient of variation 1


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_burstiness_keeps_mean_rate_and_sets_gap_spread(burstiness):
    offsets = arrival_offsets_s(20_001, LoadPoint(request_rate=5.0, burstiness=burstiness), np.random.default_rng(1))
    gaps = np.diff(offsets)
    assert gaps.mean() == pytest.approx(1 / 5.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.06)  # gamma CV = 1/sqrt(k)


def test_schedule_is_seeded():
    point = LoadPoint(request_rate=3.0)
    a = arrival_offsets_s(100, point, np.random.default_rng(7))
    b = arrival_offsets_s(100, point, np.random.default_rng(7))
    c = arrival_offsets_s(100, point, np.random.default_rng(8))
    assert a.tolist() == b.tolist()
    assert a.tolist() != c.tolist()


def test_parse_sweep_concurrency_keeps_base_rate():
    base = LoadPoint(request_rate=10.0, burstiness=0.5)
    points = parse_sweep("max-concurrency=1,4,16", base)
    assert points == [LoadPoint(10.0, 0.5, 1), LoadPoint(10.0, 0.5, 4), LoadPoint(10.0, 0.5, 16)]
    assert [offered_load(p, "max-concurrency") for p in points] == [1.0, 4.0, 16.0]


def test_parse_sweep_rate_with_inf():
    points = parse_sweep("request-rate=1,2.5,inf", LoadPoint(max_concurrency=8))
    assert [p.request_rate for p in points] == [1.0, 2.5, math.inf]
    assert points[2].label == "request_rate=inf,max_concurrency=8"
    assert points[1].label == "request_rate=2.5,max_concurrency=8"
    assert points[2].as_dict() == {"request_rate": None, "burstiness": 1.0, "max_concurrency": 8}


@pytest.mark.parametrize("spec", ["max-concurrency", "concurrency=1,2", "request-rate=", "max-concurrency=0"])
def test_parse_sweep_rejects_bad_specs(spec):
    with pytest.raises(ValueError):
        parse_sweep(spec, LoadPoint())


@pytest.mark.parametrize("kwargs", [{"request_rate": 0.0}, {"burstiness": 0.0}, {"max_concurrency": 0}])
def test_load_point_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        LoadPoint(**kwargs)
