"""Incremental detokenization: never half a character, special tokens skipped, same text as a full decode."""

from __future__ import annotations

from pagedserve.services.gateway.text.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer

EOS = 2  # <|im_end|> in SmolLM2


def stream(tokenizer, prompt_ids: list[int], output_ids: list[int]) -> list[str]:
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids)
    pieces = [detokenizer.add([token_id]) for token_id in output_ids]
    pieces.append(detokenizer.flush())
    return pieces


def test_multibyte_characters_are_emitted_whole(tokenizer):
    text = "héllo 😀 世界 done"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert any(REPLACEMENT_CHAR in tokenizer.decode([i]) for i in ids), "the text must split characters"
    pieces = stream(tokenizer, tokenizer.encode("Say:", add_special_tokens=False), ids)
    assert "".join(pieces) == text
    assert all(REPLACEMENT_CHAR not in piece for piece in pieces)
    emoji_tokens = [i for i, token_id in enumerate(ids) if REPLACEMENT_CHAR in tokenizer.decode([token_id])]
    assert pieces[emoji_tokens[0]] == ""  # the first half of the emoji is held back


def test_special_tokens_give_no_text(tokenizer):
    ids = tokenizer.encode("Paris.", add_special_tokens=False) + [EOS]
    pieces = stream(tokenizer, [1, 520, 9531, 198], ids)
    assert "".join(pieces) == "Paris."
    assert pieces[-2:] == ["", ""]


def test_leading_space_of_the_first_token_is_kept(tokenizer):
    prompt = tokenizer.encode("The capital of France is", add_special_tokens=False)
    ids = tokenizer.encode(" Paris, of course", add_special_tokens=False)
    assert "".join(stream(tokenizer, prompt, ids)) == " Paris, of course"


def test_incomplete_character_at_the_end_is_flushed_as_replacement(tokenizer):
    ids = tokenizer.encode("a 😀", add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer, [])
    pieces = [detokenizer.add([token_id]) for token_id in ids[:-1]]
    assert "".join(pieces) == "a"
    assert detokenizer.flush() == " " + REPLACEMENT_CHAR


def test_many_tokens_match_a_full_decode(tokenizer):
    text = "Les élèves ont répondu: « oui » — 東京は日本の首都です。 Ça va? 🙂👍"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert "".join(stream(tokenizer, [], ids)) == tokenizer.decode(ids) == text


def test_an_output_that_completes_the_prompts_last_character_shows_it_whole(tokenizer):
    ids = tokenizer.encode("Tokyo: 東京", add_special_tokens=False)
    cut = next(i for i in range(1, len(ids)) if tokenizer.decode(ids[:i]).endswith(REPLACEMENT_CHAR))
    pieces = stream(tokenizer, ids[:cut], ids[cut:])
    assert tokenizer.decode(ids[:cut]) == "Tokyo: " + REPLACEMENT_CHAR  # the cut token holds the space too
    assert "".join(pieces) == " 東京"  # the held-back prompt token's text, whole, and no other prompt text


def test_a_stream_with_no_output_gives_no_text(tokenizer):
    ids = tokenizer.encode("東", add_special_tokens=False)
    assert len(ids) > 1 and stream(tokenizer, ids[:1], []) == [""]
