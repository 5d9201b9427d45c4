"""Stop strings: exact cut, nothing of a stop string ever emitted, held text released when it cannot match."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pagedserve.services.gateway.text.stop_strings import StopStringMatcher


def feed_all(stops: list[str], pieces: list[str]) -> tuple[list[str], bool]:
    matcher = StopStringMatcher(stops)
    emitted = [matcher.feed(piece, final=i == len(pieces) - 1) for i, piece in enumerate(pieces)]
    return emitted, matcher.stopped


def test_stop_inside_one_piece_cuts_before_it():
    assert feed_all(["STOP"], ["Hello world STOP more"]) == (["Hello world "], True)


def test_stop_split_over_pieces_is_held_back_then_cut():
    emitted, stopped = feed_all(["STOP"], ["Hel", "lo ST", "OP tail", " more"])
    assert emitted == ["Hel", "lo ", "", ""]
    assert stopped


def test_partial_match_that_fails_is_released_with_the_next_piece():
    matcher = StopStringMatcher(["Stop"])
    assert matcher.feed("ab St") == "ab "
    assert matcher.feed("x") == "Stx"
    assert not matcher.stopped


def test_final_piece_releases_held_text():
    matcher = StopStringMatcher(["Stop"])
    assert matcher.feed("a Sto") == "a "
    assert matcher.feed("", final=True) == "Sto"


def test_first_stop_to_complete_wins():
    assert feed_all(["world", "lo w"], ["hello world"]) == (["hel"], True)
    assert feed_all([".", "a.a"], ["aa.a"]) == (["aa"], True)  # "." completes before "a.a" would
    assert feed_all([".", "a.a"], ["aa.", "a"]) == (["aa", ""], True)


def test_no_text_after_stopping():
    matcher = StopStringMatcher(["."])
    assert matcher.feed("One. Two") == "One"
    assert matcher.feed(" three.") == ""


def test_empty_stop_strings_are_ignored():
    assert feed_all(["", "x"], ["abc"]) == (["abc"], False)


@given(text=st.text(alphabet="ab c.", max_size=40), stops=st.lists(st.text(alphabet="ab c.", min_size=1,
       max_size=4), min_size=1, max_size=3), cuts=st.lists(st.integers(0, 40), max_size=8))
def test_any_chunking_gives_the_exact_cut(text: str, stops: list[str], cuts: list[int]):
    bounds = sorted({0, len(text), *[min(c, len(text)) for c in cuts]})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)] or [""]
    emitted, stopped = feed_all(stops, pieces)
    hits = [(i + len(s), i) for s, i in ((s, text.find(s)) for s in stops) if i >= 0]
    expected = text[:min(hits)[1]] if hits else text  # before the stop that completes first
    assert "".join(emitted) == expected
    assert stopped == bool(hits)
    for stop in stops:  # nothing of a stop string leaks, even across pieces
        assert stop not in "".join(emitted)
