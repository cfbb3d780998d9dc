"""
Typed configuration for every script: ``python SCRIPT.py [config_file.py ...] [--key=value ...]``.

A config file is plain Python assignments (``n_layer = 4``); later files and then ``--key=value``
overrides win. Unlike nanoGPT's exec-based configurator, every key must be a field of the
script's config dataclass and every value must have the field's type (an int is accepted for a
float); anything else raises one ``ConfigError`` naming the key, the value and what it accepts.
"""
from __future__ import annotations

import ast
import dataclasses
import difflib
import os
import runpy
import types
import typing
from typing import Any, TypeVar

from model import ConfigError

C = TypeVar("C")


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _describe(tp: Any) -> str:
    args = typing.get_args(tp)
    if args:
        return " or ".join(_describe(a) for a in args)
    return "None" if tp is type(None) else getattr(tp, "__name__", str(tp))


def coerce(key: str, value: Any, tp: Any, source: str) -> Any:
    """Return ``value`` as type ``tp`` or raise ConfigError. ints pass as floats; 'true'/'false' as bools."""
    options = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    for option in options:
        if option is type(None) and value is None:
            return None
        if option is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
        elif option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        elif option is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        elif option is str and isinstance(value, str):
            return value
        elif typing.get_origin(option) is tuple and isinstance(value, (tuple, list)):
            return tuple(value)
    raise ConfigError(f"{source}: {key}={value!r} has the wrong type; {key} accepts {_describe(tp)}")


def _unknown_key(key: str, known: list[str], source: str) -> ConfigError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return ConfigError(f"{source}: unknown config key '{key}'.{hint} Known keys: {', '.join(sorted(known))}")


def _parse_cli_value(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare string such as --device=cpu


def read_config_file(path: str) -> dict[str, Any]:
    """The plain assignments of a Python config file (modules, functions and _private names skipped)."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file '{path}' does not exist "
                          "(configs live in configs/, e.g. configs/shakespeare_char.py)")
    namespace = runpy.run_path(path)
    return {k: v for k, v in namespace.items()
            if not k.startswith("_") and not isinstance(v, (types.ModuleType, types.FunctionType, type))}


def parse_args(argv: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """Split argv into (source, {key: value}) updates, in order: config files, then --key=value."""
    updates: list[tuple[str, dict[str, Any]]] = []
    for arg in argv:
        if arg.startswith("--"):
            if "=" not in arg:
                raise ConfigError(f"argument '{arg}' must have the form --key=value")
            key, text = arg[2:].split("=", 1)
            updates.append((f"argument '{arg}'", {key: _parse_cli_value(text)}))
        else:
            updates.append((f"config file '{arg}'", read_config_file(arg)))
    return updates


def load_config(cls: type[C], argv: list[str], base: C | None = None) -> C:
    """Build a ``cls`` dataclass from its defaults (or ``base``), config files and --key=value overrides."""
    types_by_key = _field_types(cls)
    values = dataclasses.asdict(base) if base is not None else {}
    for source, update in parse_args(argv):
        for key, value in update.items():
            if key not in types_by_key:
                raise _unknown_key(key, list(types_by_key), source)
            values[key] = coerce(key, value, types_by_key[key], source)
    config = cls(**values)
    validate = getattr(config, "validate", None)
    if validate is not None:
        validate()
    return config


def config_from_dict(cls: type[C], values: dict[str, Any], source: str) -> C:
    """Typed construction from a dict (e.g. a checkpoint's saved config), ignoring keys ``cls`` lacks."""
    types_by_key = _field_types(cls)
    kept = {k: coerce(k, v, types_by_key[k], source) for k, v in values.items() if k in types_by_key}
    return cls(**kept)
