"""Before a run: what the server says about itself, and which EOS suppression it accepts."""

from dataclasses import replace

import aiohttp

from pagedserve.benchmarks.client import HttpError, get, send_request
from pagedserve.benchmarks.datasets import BenchRequest
from pagedserve.benchmarks.payload import EOS_NOT_SUPPRESSED, EndpointConfig
from pagedserve.benchmarks.records import RequestRecord

_PROBE = BenchRequest("Say hello.", None, 2)
_VERSION_HEADERS = ("server", "x-server-version", "x-powered-by")


async def server_info(client: aiohttp.ClientSession, cfg: EndpointConfig) -> dict:
    """Version (GET /version, as vLLM and pagedserve serve it), identifying headers and served models."""
    base = cfg.base_url.rstrip("/")
    info: dict = {"base_url": cfg.base_url, "url": cfg.url, "version": None, "headers": {}, "models": None,
                  "model_roots": {}}
    version = await _get_json(client, base + "/version")
    if isinstance(version, dict):
        info["version"] = version.get("version")
    try:
        response = await get(client, base + "/v1/models")
    except HttpError:
        return info
    info["headers"] = {k: response.headers[k] for k in _VERSION_HEADERS if k in response.headers}
    if response.status == 200:
        data = [model for model in response.json().get("data") or [] if isinstance(model, dict)]
        info["models"] = [model.get("id") for model in data]
        # `root`: where the server loaded the model from (pagedserve: its folder; vLLM: the path or hub name)
        info["model_roots"] = {model.get("id"): model["root"] for model in data if isinstance(model.get("root"), str)}
    return info


async def _get_json(client: aiohttp.ClientSession, url: str) -> object | None:
    try:
        response = await get(client, url)
        return response.json() if response.status == 200 else None
    except (*HttpError, ValueError):
        return None


async def resolve_eos_suppression(client: aiohttp.ClientSession, cfg: EndpointConfig) -> EndpointConfig:
    """Resolve --eos-suppression auto: ignore_eos if accepted, else logit_bias, else none (with a warning).

    Only a 4xx or 5xx answer moves on to the next method; a server that cannot be reached stops the benchmark.
    """
    if not cfg.ignore_eos or cfg.eos_suppression != "auto":
        return cfg
    methods = (
        ["ignore-eos", "logit-bias", EOS_NOT_SUPPRESSED] if cfg.eos_token_ids else ["ignore-eos", EOS_NOT_SUPPRESSED]
    )
    errors = []
    for method in methods:
        candidate = replace(cfg, eos_suppression=method)
        record = await send_request(client, candidate, _PROBE, RequestRecord(-1, _PROBE.num_output_tokens), None)
        if record.ok:
            if method == EOS_NOT_SUPPRESSED:
                print(f"warning: server accepts no EOS suppression ({'; '.join(errors)}); answers may stop early")
            return candidate
        errors.append(f"{method}: {record.error}: {record.error_detail}")
        if record.http_status is None or record.http_status < 400:
            break
    raise RuntimeError(f"probe requests to {cfg.url} failed: {'; '.join(errors)}")
