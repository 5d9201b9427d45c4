"""The check every process that reads the model folder makes before it starts anything: a one-line reason or None."""

from __future__ import annotations

from pathlib import Path

_HINT = "give a local Hugging Face model folder (config.json, tokenizer files, *.safetensors or one *.gguf) or a " \
        "*.gguf file; `make model` fetches " \
        "the default one to models/SmolLM2-135M-Instruct"


def model_dir_problem(model_dir: str, weights: bool = True, tokenizer: bool = True) -> str | None:
    """Why `model_dir` cannot be served (one line), or None when it has a config and the weights and tokenizer
    asked for (the worker reads no tokenizer, the gateway no weights)."""
    path = Path(model_dir)
    if not path.exists():
        return f"model folder {model_dir!r} does not exist: {_HINT}"
    if not path.is_dir():
        return f"model folder {model_dir!r} is not a folder: {_HINT}"
    missing = [name for name, found in (
        ("config.json", (path / "config.json").is_file()),
        ("*.safetensors or *.gguf weights", not weights or any(path.glob("*.safetensors"))
         or any(path.glob("*.gguf"))),
        ("tokenizer (tokenizer.json or tokenizer_config.json)", not tokenizer
         or (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file()),
    ) if not found]
    if missing:
        return f"model folder {model_dir!r} has no {', no '.join(missing)}: {_HINT}"
    return None
