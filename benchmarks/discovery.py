"""What the bench learns from the server when the command line does not say: the model name and its tokenizer.

`--model` defaults to the first model the server's /v1/models lists (as vLLM's bench does). The tokenizer is, in
order: --tokenizer, --model when it is a folder, then the `root` that /v1/models reports for the model when it is
a folder on this machine (pagedserve reports its model folder's absolute path there; vLLM the path it loaded).
"""

from dataclasses import replace
from pathlib import Path

from pagedserve.benchmarks.payload import EndpointConfig, check_eos_suppression
from pagedserve.benchmarks.tokenizer import BenchTokenizer, load_tokenizer


def resolve_model(endpoint: EndpointConfig, server: dict) -> EndpointConfig:
    """The endpoint with a model name: the one given, else the first the server lists."""
    if endpoint.model:
        return endpoint
    models = [model for model in server.get("models") or [] if model]
    if not models:
        raise ValueError(f"pass --model: the server at {endpoint.base_url} lists no models at /v1/models")
    print(f"model: {models[0]} (the first of the server's /v1/models)")
    return replace(endpoint, model=models[0])


def server_tokenizer(server: dict, model: str) -> BenchTokenizer | None:
    """The tokenizer in the folder the server reports as the model's `root`, when that folder is on this machine."""
    root = (server.get("model_roots") or {}).get(model)
    if not root or not (Path(root) / "tokenizer.json").is_file():
        return None
    tokenizer = load_tokenizer(root)
    print(f"tokenizer: {root} (the model's root in the server's /v1/models)")
    return tokenizer


def resolve(endpoint: EndpointConfig, tokenizer: BenchTokenizer | None, server: dict
            ) -> tuple[EndpointConfig, BenchTokenizer | None]:
    """Model name, tokenizer and EOS ids filled in from the server where the command line left them out."""
    endpoint = resolve_model(endpoint, server)
    tokenizer = tokenizer or server_tokenizer(server, endpoint.model)
    if tokenizer is not None and not endpoint.eos_token_ids:
        endpoint = replace(endpoint, eos_token_ids=tokenizer.eos_token_ids)
    check_eos_suppression(endpoint)
    return endpoint, tokenizer
