"""Map a frozen config dataclass to argparse flags, each also settable by a `PAGEDSERVE_*` environment variable.

Field `kv_cache_memory_bytes` becomes `--kv-cache-memory-bytes` and `PAGEDSERVE_KV_CACHE_MEMORY_BYTES`; a flag
beats the environment, which beats the field default. Nested dataclass fields are flattened (their field names
must not collide). Help text comes from `field(metadata={"help": ...})` or else the field's trailing `# comment`.
Fields ending in `_bytes` accept sizes like `512MiB` or `2GiB`, and their flag also answers without the unit
(`--kv-cache-memory 2GiB`). A `Literal["a", "b"]` field takes one of its names and refuses others, from a flag or
the environment alike; `check_choices` in a config's `__post_init__` holds configs built in code to the same.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import os
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

ENV_PREFIX = "PAGEDSERVE_"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_COMMENT = re.compile(r"^\s+(\w+)\s*:[^#]*#\s*(.+)$")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")

C = TypeVar("C")


class ConfigError(ValueError):
    """A flag or environment value that cannot be parsed into its field's type."""


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"expected a boolean (true/false), got {text!r}")


def parse_size_bytes(text: str) -> int:
    """'2GiB' -> 2147483648; a plain number is bytes. K/M/G/T are powers of 1024 with or without 'iB'."""
    match = _SIZE.match(text)
    if match is None:
        raise ConfigError(f"expected a size like 512MiB or 2GiB, got {text!r}")
    unit = (match.group(2) or "").upper().replace("IB", "").replace("B", "")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _leaf_fields(cls: type) -> list[tuple[dataclasses.Field, type]]:
    """(field, resolved type) of every non-dataclass field, nested dataclasses flattened."""
    hints = typing.get_type_hints(cls)
    leaves = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            leaves.extend(_leaf_fields(hints[f.name]))
        else:
            leaves.append((f, hints[f.name]))
    return leaves


def _unwrapped(hint: Any) -> tuple[Any, bool]:
    """(the type inside, optional) of a field type such as `int | None`."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) != 1:
            raise TypeError(f"unsupported config field type {hint}")
        return non_none[0], True
    return hint, False


def choices(hint: Any) -> tuple[str, ...] | None:
    """The names of a `Literal["a", "b"]` field type (optional or not); None for any other type."""
    inner = _unwrapped(hint)[0]
    if typing.get_origin(inner) is not typing.Literal:
        return None
    names = typing.get_args(inner)
    if not all(isinstance(name, str) for name in names):
        raise TypeError(f"config Literal fields take strings, not {inner}")
    return names


def _scalar_type(hint: Any) -> tuple[type, bool]:
    """(int | float | str | bool, optional) of a field type; a Literal of names is a str."""
    inner, optional = _unwrapped(hint)
    return (str if choices(hint) else inner), optional


def _not_one_of(names: tuple[str, ...], value: Any) -> str:
    return f"expected one of {', '.join(names)}, got {value!r}"


def _one_of(names: tuple[str, ...], text: str) -> str:
    if text not in names:
        raise ConfigError(_not_one_of(names, text))
    return text


def check_choices(config: Any) -> None:
    """A ValueError naming the field when a Literal field of the dataclass `config` holds another value."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        names, value = choices(hints[f.name]), getattr(config, f.name)
        if not names or value in names:
            continue
        if value is not None or not _unwrapped(hints[f.name])[1]:  # None stays allowed where the field is optional
            raise ValueError(f"{f.name}: {_not_one_of(names, value)}")


def _converter(name: str, hint: Any):
    scalar, optional = _scalar_type(hint)
    if scalar not in (int, float, str, bool):
        raise TypeError(f"config field {name}: unsupported type {hint}")
    names = choices(hint)
    if names:
        base = functools.partial(_one_of, names)
    elif scalar is bool:
        base = parse_bool
    else:
        base = parse_size_bytes if name.endswith("_bytes") and scalar is int else scalar

    def convert(text: str):
        if optional and text.strip().lower() in ("", "none"):
            return None
        try:
            return base(text)
        except ValueError as exc:
            raise ConfigError(f"{flag_name(name)}: {exc}") from None

    return convert


def _comments(cls: type) -> dict[str, str]:
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    return {m.group(1): m.group(2).strip() for m in map(_COMMENT.match, source.splitlines()) if m}


def _help(cls: type) -> dict[str, str]:
    helps: dict[str, str] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            helps.update(_help(hints[f.name]))
    helps.update(_comments(cls))
    helps.update({f.name: f.metadata["help"] for f in dataclasses.fields(cls) if "help" in f.metadata})
    return helps


def _metavar(name: str, hint: Any) -> str:
    names = choices(hint)
    if names:
        return "{" + ",".join(names) + "}"
    scalar = _scalar_type(hint)[0]
    return "SIZE" if name.endswith("_bytes") and scalar is int else scalar.__name__.upper()


def add_config_arguments(parser: argparse.ArgumentParser, cls: type, positional: Sequence[str] = ()) -> None:
    """One flag per leaf field; fields named in `positional` become positional arguments (optional if env-set)."""
    helps = _help(cls)
    for f, hint in _leaf_fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = None if required else (f.default if f.default is not dataclasses.MISSING else f.default_factory())
        shown = repr(default) if isinstance(default, str) else default
        text = f"{helps.get(f.name, '')} [env {env_name(f.name)}" + ("" if required else f"; default {shown}") + "]"
        if f.name in positional:
            parser.add_argument(f.name, nargs="?", default=None, help=text.strip(), metavar=f.name.upper())
        else:
            flags = [flag_name(f.name)]
            if f.name.endswith("_bytes"):
                flags.append(flag_name(f.name.removesuffix("_bytes")))
            parser.add_argument(*flags, dest=f.name, default=None, help=text.strip(), metavar=_metavar(f.name, hint))


def config_from_args(cls: type[C], args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> C:
    """Build the frozen config: flag, else environment, else the field default. Missing required -> ConfigError."""
    environ = os.environ if environ is None else environ
    return _build(cls, vars(args), environ)


def _build(cls: type[C], values: Mapping[str, Any], environ: Mapping[str, str]) -> C:
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            kwargs[f.name] = _build(hints[f.name], values, environ)
            continue
        text = values.get(f.name)
        text = environ.get(env_name(f.name)) if text is None else text
        if text is not None:
            kwargs[f.name] = _converter(f.name, hints[f.name])(str(text))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{f.name} is required: pass {flag_name(f.name)} or set {env_name(f.name)}")
    return cls(**kwargs)


def parse_config(cls: type[C], argv: Sequence[str] | None, description: str, prog: str | None = None,
                 positional: Sequence[str] = ()) -> C:
    """The one call a service's `__main__` makes: flags + environment -> frozen config (exits 2 on bad input)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_config_arguments(parser, cls, positional)
    args = parser.parse_args(argv)
    try:
        return config_from_args(cls, args)
    except (ConfigError, ValueError) as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits
