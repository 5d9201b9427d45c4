"""Map a frozen config dataclass to argparse flags, each also settable by a `PAGEDSERVE_*` environment variable.

Field `kv_cache_memory_bytes` becomes `--kv-cache-memory-bytes` and `PAGEDSERVE_KV_CACHE_MEMORY_BYTES`; a flag
beats the environment, which beats the field default. Nested dataclass fields are flattened (their field names
must not collide). Help text comes from `field(metadata={"help": ...})` or else the field's trailing `# comment`.
Fields ending in `_bytes` accept sizes like `512MiB` or `2GiB`, and their flag also answers without the unit
(`--kv-cache-memory 2GiB`). A bool field's flag works bare (`--enable-prefix-caching`), with a value
(`--enable-prefix-caching false`) and negated (`--no-enable-prefix-caching`). A field's
`metadata={"aliases": ("--served-model-name",)}` adds other names for its flag (vLLM's, where vLLM has the
concept). A `Literal["a", "b"]` field takes one of its names and refuses others, from a flag or the environment
alike; `check_choices` in a config's `__post_init__` holds configs built in code to the same.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

ENV_PREFIX = "PAGEDSERVE_"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_COMMENT = re.compile(r"^\s+(\w+)\s*:[^#]*#\s*(.+)$")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")

C = TypeVar("C", bound="DataclassInstance")


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


def leaf_fields(cls: type) -> list[tuple[dataclasses.Field[Any], type]]:
    """(field, resolved type) of every non-dataclass field, nested dataclasses flattened."""
    hints = typing.get_type_hints(cls)
    leaves = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            leaves.extend(leaf_fields(hints[f.name]))
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


def _converter(name: str, hint: Any) -> Callable[[str], Any]:
    scalar, optional = _scalar_type(hint)
    if scalar not in (int, float, str, bool):
        raise TypeError(f"config field {name}: unsupported type {hint}")
    names = choices(hint)
    base: Callable[[str], Any]
    if names:
        base = functools.partial(_one_of, names)
    elif scalar is bool:
        base = parse_bool
    else:
        base = parse_size_bytes if name.endswith("_bytes") and scalar is int else scalar

    def convert(text: str) -> Any:
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


class _BoolFlag(argparse.Action):
    """`--x` (true), `--x VALUE`, `--no-x` (false); the value stays text, converted later like every other."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        negated = [f"--no-{flag.removeprefix('--')}" for flag in option_strings]
        super().__init__([*option_strings, *negated], dest, nargs="?", const="true", **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if option_string is not None and option_string.startswith("--no-"):
            if values is not None:
                parser.error(f"{option_string} takes no value")
            values = "false"
        setattr(namespace, self.dest, values)


class ConfigHelpFormatter(argparse.HelpFormatter):
    """Shows a bool flag as `--x [BOOL], --no-x` (argparse would repeat the metavar after --no-x)."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, _BoolFlag):
            return ", ".join(f"{flag} [BOOL]" if not flag.startswith("--no-") else flag
                             for flag in action.option_strings)
        return super()._format_action_invocation(action)


def bool_flag_names(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string (plain and --no-) of the parser's bool config flags."""
    return {flag for action in parser._actions if isinstance(action, _BoolFlag) for flag in action.option_strings}


def normalize_bool_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """Spell each bool flag as `--x=VALUE`, so that a bare `--x` never swallows the next argument (a positional).

    `--x` followed by true/false/yes/no/on/off/1/0 takes it as its value; a bare `--x` is `--x=true`; `--no-x` is
    `--x=false`. Arguments after `--` are left alone.
    """
    out: list[str] = []
    names, items, i = bool_flag_names(parser), list(argv), 0
    while i < len(items):
        item = items[i]
        if item == "--":
            return out + items[i:]
        if item in names and item.startswith("--no-") and f"--{item.removeprefix('--no-')}" in names:
            out.append(f"--{item.removeprefix('--no-')}=false")
        elif item in names:
            following = items[i + 1].strip().lower() if i + 1 < len(items) else None
            if following in (*_TRUE, *_FALSE):
                out.append(f"{item}={items[i + 1]}")
                i += 1
            else:
                out.append(f"{item}=true")
        else:
            out.append(item)
        i += 1
    return out


def field_flags(f: dataclasses.Field[Any]) -> list[str]:
    """The flag of a field, then its aliases: `--kv-cache-memory-bytes`, `--kv-cache-memory`, ..."""
    flags = [flag_name(f.name)]
    if f.name.endswith("_bytes"):
        flags.append(flag_name(f.name.removesuffix("_bytes")))
    return flags + [alias for alias in f.metadata.get("aliases", ()) if alias not in flags]


def field_default(f: dataclasses.Field[Any]) -> Any:
    """The field's default value; dataclasses.MISSING for a required field."""
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING


def format_size(num_bytes: int) -> str:
    """4294967296 -> '4GiB'; sizes that are no whole number of a unit stay bytes."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        scale = _SIZE_UNITS[unit[0]]
        if num_bytes and num_bytes % scale == 0:
            return f"{num_bytes // scale}{unit}"
    return str(num_bytes)


def field_help(f: dataclasses.Field[Any], text: str) -> str:
    """`text [env PAGEDSERVE_X; default Y]`, the help line of a field's flag."""
    default = field_default(f)
    required = default is dataclasses.MISSING
    shown = repr(default) if isinstance(default, str) else default
    if f.name.endswith("_bytes") and isinstance(default, int) and not isinstance(default, bool):
        shown = format_size(default)
    return f"{text} [env {env_name(f.name)}" + ("" if required else f"; default {shown}") + "]"


def add_config_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type,
                         positional: Sequence[str] = (), only: Callable[[str], bool] = lambda name: True,
                         note: Mapping[str, str] | None = None) -> None:
    """One flag per leaf field; fields named in `positional` become positional arguments (optional if env-set).

    `parser` may be an argument group. `only` picks the fields to add (all by default); `note` appends text to the
    help of the fields it names.
    """
    helps, note = _help(cls), note or {}
    for f, hint in leaf_fields(cls):
        if not only(f.name):
            continue
        text = field_help(f, f"{helps.get(f.name, '')}{note.get(f.name, '')}".strip()).strip()
        if f.name in positional:
            parser.add_argument(f.name, nargs="?", default=None, help=text, metavar=f.name.upper())
        elif _scalar_type(hint)[0] is bool:
            parser.add_argument(*field_flags(f), dest=f.name, default=None, help=text, metavar="BOOL",
                                action=_BoolFlag)
        else:
            parser.add_argument(*field_flags(f), dest=f.name, default=None, help=text, metavar=_metavar(f.name, hint))


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
    parser = argparse.ArgumentParser(prog=prog, description=description, formatter_class=ConfigHelpFormatter)
    add_config_arguments(parser, cls, positional)
    args = parser.parse_args(normalize_bool_flags(parser, sys.argv[1:] if argv is None else argv))
    try:
        return config_from_args(cls, args)
    except (ConfigError, ValueError) as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits
