"""An OpenAI request -> SamplingParams, with the model folder's generation_config.json as defaults.

Every range error becomes a 400 naming the request field (`param`) the client actually used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pagedserve.services.gateway.api.protocol import SamplingFields
from pagedserve.services.gateway.http.errors import OpenAIError
from pagedserve.shared.sampling_params import INT64_MAX, INT64_MIN, SamplingParams, SamplingParamsError
from pagedserve.shared.structured_output import StructuredOutput

# generation_config.json key -> SamplingParams field it provides a default for
_GENERATION_CONFIG_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                           "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}
_OPTIONAL_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                    "repetition_penalty")
MAX_LOGPROBS = 20


def load_generation_defaults(model_dir: str | Path) -> dict[str, float | int]:
    """The sampling defaults the model folder ships (only keys SamplingParams knows)."""
    path = Path(model_dir) / "generation_config.json"
    raw = json.loads(path.read_text()) if path.is_file() else {}
    return {field: raw[key] for key, field in _GENERATION_CONFIG_KEYS.items() if raw.get(key) is not None}


@dataclass(frozen=True)
class ModelLimits:
    max_model_len: int
    vocab_size: int


@dataclass(frozen=True)
class RequestShape:
    """How this endpoint names things, for error messages."""

    prompt_param: str  # "messages" or "prompt"
    max_tokens_param: str  # "max_tokens" or "max_completion_tokens"
    logprobs_param: str  # "top_logprobs" (chat) or "logprobs" (completions)


def prompt_too_long(num_prompt_tokens: int, max_model_len: int, prompt_param: str, at_least: bool = False
                    ) -> OpenAIError:
    count = f"at least {num_prompt_tokens}" if at_least else str(num_prompt_tokens)
    return OpenAIError(400, f"This model's maximum context length is {max_model_len} tokens. However, your request "
                            f"has {count} input tokens. Please reduce the length of the {prompt_param}.",
                       param=prompt_param, code="context_length_exceeded")


def check_prompt_fits(num_prompt_tokens: int, limits: ModelLimits, shape: RequestShape) -> None:
    if num_prompt_tokens == 0:
        raise OpenAIError(400, f"the {shape.prompt_param} tokenize to an empty prompt", param=shape.prompt_param)
    if num_prompt_tokens >= limits.max_model_len:
        raise prompt_too_long(num_prompt_tokens, limits.max_model_len, shape.prompt_param)


def build_sampling_params(request: SamplingFields, max_tokens: int | None, logprobs: int | None,
                          num_prompt_tokens: int, choice_index: int, defaults: dict, limits: ModelLimits,
                          shape: RequestShape, structured_output: StructuredOutput | None = None,
                          prompt_logprobs: int | None = None) -> SamplingParams:
    """Raises OpenAIError (400) for values out of range or a request that does not fit the context.
    `prompt_logprobs`: the top-N of each prompt position to compute (see prompt_logprobs_count)."""
    check_prompt_fits(num_prompt_tokens, limits, shape)
    if max_tokens is None:
        max_tokens = min(defaults.get("max_tokens", limits.max_model_len), limits.max_model_len - num_prompt_tokens)
    optional = {name: getattr(request, name) for name in _OPTIONAL_FIELDS}
    optional = {name: value if value is not None else defaults[name]
                for name, value in optional.items() if value is not None or name in defaults}
    try:
        params = SamplingParams(
            max_tokens=max_tokens, min_tokens=request.min_tokens, **optional,
            seed=_choice_seed(request.seed, choice_index),
            logit_bias=_logit_bias(request.logit_bias, limits.vocab_size), logprobs=logprobs,
            stop_token_ids=tuple(dict.fromkeys(  # duplicates dropped: at most vocab_size ids
                check_token_ids(request.stop_token_ids or [], limits.vocab_size, "stop_token_ids"))),
            ignore_eos=request.ignore_eos, structured_output=structured_output, prompt_logprobs=prompt_logprobs)
    except SamplingParamsError as exc:
        param = {"max_tokens": shape.max_tokens_param, "logprobs": shape.logprobs_param}.get(exc.param, exc.param)
        raise OpenAIError(400, str(exc).replace(exc.param, param, 1), param=param, code="invalid_value") from None
    if num_prompt_tokens + params.max_tokens > limits.max_model_len:
        raise OpenAIError(400, f"This model's maximum context length is {limits.max_model_len} tokens. However, you "
                               f"requested {num_prompt_tokens + params.max_tokens} tokens ({num_prompt_tokens} in the "
                               f"{shape.prompt_param}, {params.max_tokens} in the completion). Please reduce the "
                               f"length of the {shape.prompt_param} or completion.",
                          param=shape.max_tokens_param, code="context_length_exceeded")
    return params


def _choice_seed(seed: int | None, choice_index: int) -> int | None:
    """Choice i of a seeded request samples with seed + i (so n choices differ), wrapped to stay a 64-bit seed."""
    if seed is None or not INT64_MIN <= seed <= INT64_MAX:
        return seed  # None, or out of range: SamplingParams refuses it with param "seed"
    return (seed + choice_index - INT64_MIN) % 2**64 + INT64_MIN


def _logit_bias(raw: dict[str, float] | None, vocab_size: int) -> dict[int, float]:
    bias = {}
    for key, value in (raw or {}).items():
        try:
            token_id = int(key)
        except ValueError:
            raise OpenAIError(400, f"logit_bias keys must be token ids, got {key!r}", param="logit_bias") from None
        bias[token_id] = value
    check_token_ids(list(bias), vocab_size, "logit_bias")
    return bias


def check_token_ids(token_ids: list[int], vocab_size: int, param: str) -> list[int]:
    """The ids as they are when all lie in [0, vocab_size); else a 400 naming the first bad one."""
    if token_ids and (min(token_ids) < 0 or max(token_ids) >= vocab_size):
        bad = next(t for t in token_ids if not 0 <= t < vocab_size)
        raise OpenAIError(400, f"{param}: token id {bad} is out of the vocabulary (size {vocab_size})", param=param,
                          code="invalid_value")
    return token_ids
