"""Config dataclass <-> flags and PAGEDSERVE_* variables: precedence, types, sizes, nesting, help."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Literal

import pytest

from pagedserve.shared.cli_config import (
    ConfigError,
    add_config_arguments,
    check_choices,
    config_from_args,
    normalize_bool_flags,
    parse_config,
    parse_size_bytes,
)


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


@dataclass(frozen=True)
class Named:
    mode: Literal["fast", "exact"] = "fast"  # how to run
    backend: Literal["a", "b"] | None = None

    def __post_init__(self) -> None:
        check_choices(self)


def test_literal_fields_take_their_names_from_flags_and_env():
    assert parse_config(Named, ["--mode", "exact", "--backend", "b"], "") == Named("exact", "b")
    assert parse_config(Named, ["--backend", "none"], "").backend is None
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, Named)
    assert config_from_args(Named, parser.parse_args([]), {"PAGEDSERVE_MODE": "exact"}).mode == "exact"
    assert "--mode {fast,exact}" in " ".join(parser.format_help().split())


@pytest.mark.parametrize(("argv", "environ"), [(["--mode", "quick"], {}), ([], {"PAGEDSERVE_MODE": "quick"})])
def test_literal_fields_refuse_other_names(argv, environ):
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, Named)
    with pytest.raises(ConfigError, match="--mode: expected one of fast, exact, got 'quick'"):
        config_from_args(Named, parser.parse_args(argv), environ)


def test_check_choices_holds_configs_built_in_code():
    assert Named("exact", None).mode == "exact"
    with pytest.raises(ValueError, match="backend: expected one of a, b, got 'c'"):
        Named("fast", "c")  # type: ignore[arg-type]


@dataclass(frozen=True)
class Flags:
    model_dir: str = "m"
    enabled: bool = False
    model_name: str | None = field(default=None, metadata={"aliases": ("--served-model-name",)})


@pytest.mark.parametrize(("argv", "expected"), [
    (["--enabled"], True), (["--enabled", "models/a"], True), (["--enabled", "false", "models/a"], False),
    (["--enabled=on"], True), (["--no-enabled", "models/a"], False), (["models/a"], False),
])
def test_bool_flags_bare_valued_and_negated_in_every_service(argv, expected):
    config = parse_config(Flags, argv, "", positional=("model_dir",))
    assert config.enabled is expected
    assert config.model_dir == ("models/a" if "models/a" in argv else "m")


def test_aliases_name_the_same_field():
    assert parse_config(Flags, ["--served-model-name", "x"], "").model_name == "x"
    assert parse_config(Flags, ["--model-name", "y"], "").model_name == "y"


def test_bool_normalization_leaves_everything_after_a_double_dash():
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, Flags)
    assert normalize_bool_flags(parser, ["--enabled", "--", "--enabled"]) == ["--enabled=true", "--", "--enabled"]
