import pytest

from pagedserve.benchmarks.datasets import BenchRequest
from pagedserve.benchmarks.payload import EndpointConfig, build_payload, check_eos_suppression, mark_constrained
from pagedserve.benchmarks.tokenizer import BenchTokenizer

SHARED = BenchRequest("What is the leave policy?", 7, 32, system_prompt="Handbook text.", group=0)


def test_tokenizer_reads_eos_ids(tokenizer: BenchTokenizer):
    assert tokenizer.eos_token_ids == (2,)  # <|im_end|> in tokenizer, generation and model configs


def test_chat_payload_streams_with_usage_and_system_message():
    cfg = EndpointConfig(base_url="http://127.0.0.1:9/", model="m")
    assert cfg.url == "http://127.0.0.1:9/v1/chat/completions"
    assert build_payload(cfg, SHARED) == {
        "model": "m",
        "max_tokens": 32,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [
            {"role": "system", "content": "Handbook text."},
            {"role": "user", "content": "What is the leave policy?"},
        ],
    }


def test_completions_payload_joins_prefix_and_uses_ignore_eos():
    cfg = EndpointConfig(
        base_url="http://h:1",
        model="m",
        endpoint_type="openai-completions",
        ignore_eos=True,
        eos_suppression="ignore-eos",
        extra_body={"top_p": 0.5},
    )
    payload = build_payload(cfg, SHARED)
    assert cfg.url == "http://h:1/v1/completions"
    assert payload["prompt"] == "Handbook text.\n\nWhat is the leave policy?"
    assert payload["ignore_eos"] is True and "logit_bias" not in payload
    assert payload["top_p"] == 0.5


def test_logit_bias_bans_every_eos_token():
    cfg = EndpointConfig(
        base_url="http://h",
        model="m",
        endpoint="/x",
        ignore_eos=True,
        eos_suppression="logit-bias",
        eos_token_ids=(0, 2),
    )
    payload = build_payload(cfg, SHARED)
    assert cfg.url == "http://h/x"
    assert payload["logit_bias"] == {"0": -100.0, "2": -100.0}
    assert "ignore_eos" not in payload


def test_no_eos_fields_without_ignore_eos():
    payload = build_payload(EndpointConfig(base_url="http://h", model="m", eos_token_ids=(2,)), SHARED)
    assert "ignore_eos" not in payload and "logit_bias" not in payload


@pytest.mark.parametrize(
    "kwargs",
    [
        {"endpoint_type": "tgi"},
        {"eos_suppression": "min-tokens"},
    ],
)
def test_endpoint_config_rejects_bad_flags(kwargs):
    with pytest.raises(ValueError):
        EndpointConfig(base_url="http://h", model="m", **kwargs)


def test_logit_bias_suppression_needs_eos_ids_once_the_tokenizer_is_known():
    with pytest.raises(ValueError, match="needs a tokenizer"):
        check_eos_suppression(EndpointConfig(base_url="http://h", model="m", ignore_eos=True,
                                             eos_suppression="logit-bias"))
    check_eos_suppression(EndpointConfig(base_url="http://h", model="m", ignore_eos=True,
                                         eos_suppression="logit-bias", eos_token_ids=(2,)))


def test_constrained_body_goes_to_an_even_share_of_the_requests():
    body = {"response_format": {"type": "json_object"}}
    cfg = EndpointConfig(base_url="http://h:1", model="m", extra_body={"top_p": 0.5}, constrained_body=body,
                         constrained_fraction=0.5)
    requests = mark_constrained([SHARED] * 6, cfg.constrained_fraction)
    assert [r.constrained for r in requests] == [False, True] * 3
    payloads = [build_payload(cfg, r) for r in requests]
    assert ["response_format" in p for p in payloads] == [False, True] * 3
    assert all(p["top_p"] == 0.5 for p in payloads)
    assert [r.constrained for r in mark_constrained([SHARED] * 4, 0.25)] == [False, False, False, True]
    assert not any(r.constrained for r in mark_constrained([SHARED] * 4, 0.0))
    with pytest.raises(ValueError, match="constrained-fraction"):
        EndpointConfig(base_url="http://h:1", model="m", constrained_fraction=1.5)
