"""The device script's cold-L2 rule: 4 rotated buffer sets, fewer only where one set alone dwarfs the L2."""

from __future__ import annotations

import pytest

from pagedserve.benchmarks.device.timing import MAX_SETS, SET_MEMORY_CAP, num_buffer_sets

GIB, L2 = 1024**3, 50 * 1024**2


def test_small_and_medium_sets_rotate_four():
    assert num_buffer_sets(32 * 1024**2, L2) == MAX_SETS == 4  # 1 x 8k decode: one set fits the L2
    assert num_buffer_sets(GIB, L2) == 4


def test_huge_sets_rotate_as_many_as_fit():
    assert num_buffer_sets(5 * GIB, L2) == SET_MEMORY_CAP // (5 * GIB) == 3
    assert num_buffer_sets(17 * GIB, L2) == 1  # 256 x 8k: one set is ~350 L2s


def test_fewer_sets_for_a_set_near_the_l2_is_refused():
    with pytest.raises(AssertionError):
        num_buffer_sets(5 * GIB, 2 * GIB)
