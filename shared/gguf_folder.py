"""A GGUF file served as a model folder: the config, generation config and tokenizer that transformers derives
from the file's metadata, written once beside a link to the file (no weights are converted).

`served_folder(path)` is what every process that reads the model folder calls first: a folder that already has
its config.json and tokenizer comes back unchanged; a `.gguf` file, or a folder holding one without those files,
comes back as a folder under ~/.cache/pagedserve/gguf/ (one per file path, size and modification time).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}  # GGUF general.architecture -> transformers class
CACHE = Path(os.environ.get("PAGEDSERVE_GGUF_CACHE", Path.home() / ".cache" / "pagedserve" / "gguf"))
_WRITTEN = ("config.json", "generation_config.json", "tokenizer_config.json")


def find_gguf(path: str | Path) -> Path | None:
    """The GGUF file `path` names: itself, or a folder's one *.gguf (ValueError for several); else None."""
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        return path
    files = sorted(path.glob("*.gguf")) if path.is_dir() else []
    if len(files) > 1:
        raise ValueError(f"model folder {path} holds several GGUF files ({', '.join(f.name for f in files)}); "
                         "give the one to serve")
    return files[0] if files else None


def served_folder(path: str | Path) -> str:
    """`path` as a model folder the services can read (see the module docstring)."""
    gguf = find_gguf(path)
    if gguf is None or (Path(path).is_dir() and all((Path(path) / n).is_file() for n in _WRITTEN)):
        return str(path)
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    folder = CACHE / f"{gguf.stem}-{key}"
    if not all((folder / n).is_file() for n in _WRITTEN):
        partial = folder.with_name(folder.name + f".partial{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        write_folder(gguf, partial)
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)  # atomic: a reader sees no folder or a complete one
    return str(folder)


def write_folder(gguf: Path, out: Path) -> None:
    """config.json, generation_config.json and the tokenizer files from `gguf`'s metadata, and a link to it."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    folder, name = str(gguf.parent), gguf.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name).to_dict()
    if config["model_type"] not in ARCHITECTURES:
        raise ValueError(f"GGUF architecture {config['model_type']!r} is not served "
                         f"(supported: {', '.join(ARCHITECTURES)})")
    config["architectures"] = [ARCHITECTURES[config["model_type"]]]
    config["dtype"] = "float32"  # what its blocks dequantize to
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    out.mkdir(parents=True)
    tokenizer.save_pretrained(out)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id).save_pretrained(out)
    (out / "model.gguf").symlink_to(gguf.resolve())
