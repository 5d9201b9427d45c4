"""The step-time model: a step's expected time by its tokens, from recent steps."""

from __future__ import annotations

import pytest

from pagedserve.services.scheduler.step_time_model import StepTimeModel


def test_nothing_is_predicted_before_a_step_was_recorded():
    assert StepTimeModel().predict_s(10) is None


def test_prompt_steps_are_predicted_longer_than_decode_steps():
    model = StepTimeModel()
    for _ in range(5):  # decode steps of 4 tokens take 10 ms, a 44-token prompt step 30 ms
        for _ in range(3):
            model.record(4, 0.010)
        model.record(44, 0.030)
    assert model.predict_s(4) == pytest.approx(0.010, rel=1e-6)
    assert model.predict_s(44) == pytest.approx(0.030, rel=1e-6)
    assert model.predict_s(24) == pytest.approx(0.020, rel=1e-6)


def test_steps_of_one_size_give_their_recent_average_whatever_the_size_asked():
    model = StepTimeModel(decay=0.5)
    for duration_s in (0.1, 0.1, 0.1, 0.02, 0.02, 0.02, 0.02, 0.02, 0.02, 0.02):
        model.record(8, duration_s)
    assert model.predict_s(8) == pytest.approx(0.02, abs=0.001)  # the recent steps outweigh the old ones
    assert model.predict_s(100) == model.predict_s(8)  # no spread in sizes: no slope to extrapolate


def test_a_falling_line_is_taken_flat():
    model = StepTimeModel()
    for tokens, duration_s in ((1, 0.05), (50, 0.01)) * 5:  # bigger steps faster: noise, not a cost
        model.record(tokens, duration_s)
    assert model.predict_s(1) == model.predict_s(50) > 0
