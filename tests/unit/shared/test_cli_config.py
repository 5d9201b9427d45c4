"""Config dataclass <-> flags and PAGEDSERVE_* variables: precedence, types, sizes, nesting, help."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import pytest

from shared.cli_config import ConfigError, add_config_arguments, config_from_args, parse_size_bytes


@dataclass(frozen=True)
class Inner:
    block_size: int = 16  # tokens per block
    cache_bytes: int = 1024


@dataclass(frozen=True)
class Outer:
    inner: Inner
    model_dir: str
    ratio: float = 0.5
    enabled: bool = True
    api_key: str | None = None
    name: str = field(default="x", metadata={"help": "the name"})


def parse(argv: list[str], environ: dict[str, str] | None = None, positional=()) -> Outer:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, Outer, positional)
    return config_from_args(Outer, parser.parse_args(argv), environ or {})


def test_flag_beats_env_beats_default():
    config = parse(["--model-dir", "m", "--ratio", "0.25"], {"PAGEDSERVE_RATIO": "0.75", "PAGEDSERVE_NAME": "y"})
    assert (config.ratio, config.name, config.enabled) == (0.25, "y", True)


def test_nested_fields_are_flat_flags_and_env():
    config = parse(["--model-dir", "m", "--block-size", "32"], {"PAGEDSERVE_CACHE_BYTES": "2GiB"})
    assert config.inner == Inner(block_size=32, cache_bytes=2 * 1024**3)


def test_positional_model_dir_and_env_fallback():
    assert parse(["models/a"], positional=("model_dir",)).model_dir == "models/a"
    assert parse([], {"PAGEDSERVE_MODEL_DIR": "models/b"}, positional=("model_dir",)).model_dir == "models/b"


def test_bools_optionals_and_errors():
    config = parse(["--model-dir", "m", "--enabled", "false", "--api-key", "k"])
    assert (config.enabled, config.api_key) == (False, "k")
    assert parse(["--model-dir", "m", "--api-key", "none"]).api_key is None
    with pytest.raises(ConfigError, match="--enabled"):
        parse(["--model-dir", "m", "--enabled", "maybe"])
    with pytest.raises(ConfigError, match="--ratio"):
        parse(["--model-dir", "m", "--ratio", "lots"])
    with pytest.raises(ConfigError, match="model_dir is required"):
        parse([])


@pytest.mark.parametrize(("text", "num_bytes"), [("512", 512), ("512MiB", 512 * 1024**2), ("1.5G", 3 * 1024**3 // 2),
                                                 ("2gib", 2 * 1024**3), ("64KB", 64 * 1024)])
def test_sizes(text, num_bytes):
    assert parse_size_bytes(text) == num_bytes


def test_help_comes_from_comments_and_metadata():
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, Outer)
    text = " ".join(parser.format_help().split())  # argparse wraps at the terminal width
    assert "tokens per block [env PAGEDSERVE_BLOCK_SIZE; default 16]" in text
    assert "the name [env PAGEDSERVE_NAME; default 'x']" in text
    assert "--cache-bytes SIZE" in text


def test_size_flags_also_answer_without_the_unit():
    assert parse(["--model-dir", "m", "--cache", "512MiB"]).inner.cache_bytes == 512 * 1024**2
    assert parse(["--model-dir", "m", "--cache-bytes", "1KiB"]).inner.cache_bytes == 1024
