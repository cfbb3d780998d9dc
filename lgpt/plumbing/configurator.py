"""
Typed configuration for every script: ``python SCRIPT.py [config_file.py ...] [--key=value ...]``.

A config file is plain Python assignments (``n_layer = 4``); later files and then ``--key=value``
overrides win. Unlike nanoGPT's exec-based configurator, every key must be a field of the
script's config dataclass and every value must have the field's type (an int is accepted for a
float); anything else raises one ``ConfigError`` naming the key, the value and what it accepts.

``-h`` / ``--help`` anywhere on the command line prints every key of the script's dataclass with its
type, its value (after the config files given before it) and the comment written beside the field,
grouped by the section comments of the dataclass: the dataclass is the one source of truth.
"""
from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import io
import math
import os
import runpy
import sys
import textwrap
import tokenize
import types
import typing
from typing import Any, TypeVar

from lgpt.plumbing.errors import ConfigError

C = TypeVar("C")
HELP_FLAGS = ("-h", "--help")


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _describe(tp: Any) -> str:
    args = typing.get_args(tp)
    if typing.get_origin(tp) is tuple and args[-1:] == (Ellipsis,):
        return f"tuple of {_describe(args[0])} (one, or several: --key=1,2)"
    if args:
        return " or ".join(_describe(a) for a in args)
    return "None" if tp is type(None) else getattr(tp, "__name__", str(tp))


INT64_LIMIT = 2**63


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
            try:
                number = float(value)
            except OverflowError:  # an int past float's range
                number = math.inf
            if not math.isfinite(number):
                raise ConfigError(f"{source}: {key}={value!r} is not a finite number; give {key} a finite value")
            return number
        elif option is int and isinstance(value, int) and not isinstance(value, bool):
            if not -INT64_LIMIT <= value < INT64_LIMIT:  # every int setting ends up in a torch/numpy int64
                raise ConfigError(f"{source}: {key}={value!r} is out of range; {key} must lie within ±2^63")
            return value
        elif option is str and isinstance(value, str):
            return value
        elif typing.get_origin(option) is tuple:
            item = typing.get_args(option)[0] if typing.get_args(option)[-1:] == (Ellipsis,) else None
            values = value if isinstance(value, (tuple, list)) else (value,) if item is not None else None
            if values is not None and (item is None or all(isinstance(v, item) and not isinstance(v, bool)
                                                           for v in values)):
                return tuple(values)  # tuple[X, ...] also takes one X: --pca_exclude=507 as --pca_exclude=507,
        elif option is dict and isinstance(value, dict):
            return dict(value)
    raise ConfigError(f"{source}: {key}={value!r} has the wrong type; {key} accepts {_describe(tp)}")


def _unknown_key(key: str, known: list[str], source: str) -> ConfigError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return ConfigError(f"{source}: unknown config key '{key}'.{hint} See --help for every key.")


def _parse_cli_value(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare string such as --device=cpu


def read_config_file(path: str) -> dict[str, Any]:
    """The plain assignments of a Python config file (modules, functions and _private names skipped)."""
    if os.path.isdir(path):
        raise ConfigError(f"config file '{path}' is a directory; give a .py file such as configs/shakespeare_char.py")
    if not os.path.isfile(path):
        raise ConfigError(f"config file '{path}' does not exist "
                          "(configs live in configs/, e.g. configs/shakespeare_char.py)")
    try:
        namespace = runpy.run_path(path)
    except SyntaxError as e:
        raise ConfigError(f"config file '{path}' has a syntax error at line {e.lineno}: {e.msg}") from e
    except SystemExit as e:  # exit() in a config file would end the command with its code and nothing done
        raise ConfigError(f"config file '{path}' called exit({e.code!r}); a config file holds plain assignments "
                          "such as n_layer = 4, and the command decides when to stop") from None
    except Exception as e:
        raise ConfigError(f"config file '{path}' raised {e.__class__.__name__}: {e}; "
                          "a config file holds plain assignments such as n_layer = 4") from e
    return {k: v for k, v in namespace.items()
            if not k.startswith("_") and not isinstance(v, (types.ModuleType, types.FunctionType, type))}


def parse_args(argv: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """Split argv into (source, {key: value}) updates, in order: config files, then --key=value."""
    updates: list[tuple[str, dict[str, Any]]] = []
    for arg in argv:
        if arg.startswith("--"):
            if "=" not in arg:
                raise ConfigError(f"argument '{arg}' must have the form --key=value (see --help)")
            key, text = arg[2:].split("=", 1)
            updates.append((f"argument '{arg}'", {key: _parse_cli_value(text)}))
        else:
            updates.append((f"config file '{arg}'", read_config_file(arg)))
    return updates


class HelpRequested(Exception):  # noqa: N818 - a control-flow signal, not an error
    """-h/--help was given: ``text`` is the help to print; the script does nothing else."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


def load_config(cls: type[C], argv: list[str], base: C | None = None, prog: str | None = None) -> C:
    """Build a ``cls`` dataclass from its defaults (or ``base``), config files and --key=value overrides.

    The keys given explicitly (in files or on the command line) are kept in ``config.explicit_keys``, those given
    on the command line in ``config.cli_keys``.
    Raises ``HelpRequested`` for -h/--help, with the help of ``cls`` filled in with the values so far.
    """
    help_at = next((i for i, a in enumerate(argv) if a in HELP_FLAGS), None)
    types_by_key = _field_types(cls)
    values = dataclasses.asdict(base) if base is not None else {}
    explicit: set[str] = set()
    cli: set[str] = set()
    for source, update in parse_args(argv if help_at is None else argv[:help_at]):
        for key, value in update.items():
            if key not in types_by_key:
                raise _unknown_key(key, list(types_by_key), source)
            values[key] = coerce(key, value, types_by_key[key], source)
            explicit.add(key)
            if source.startswith("argument"):
                cli.add(key)
            else:
                cli.discard(key)  # a later config file's value is the one in force
    if help_at is not None:
        raise HelpRequested(help_text(cls, values, prog))
    try:
        config = cls(**values)
        validate = getattr(config, "validate", None)
        if validate is not None:
            validate()
    except ConfigError:
        raise
    except ValueError as e:  # model.GPTConfig raises plain ValueError (model.py imports nothing of ours)
        raise ConfigError(str(e)) from e
    config.explicit_keys = frozenset(explicit)
    config.cli_keys = frozenset(cli)
    return config


def config_from_dict(cls: type[C], values: dict[str, Any], source: str) -> C:
    """Typed construction from a dict (e.g. a checkpoint's saved config), ignoring keys ``cls`` lacks."""
    types_by_key = _field_types(cls)
    kept = {k: coerce(k, v, types_by_key[k], source) for k, v in values.items() if k in types_by_key}
    return cls(**kept)


# ----------------------------------------------------------------------------------------------
# --help, generated from the dataclass source


@dataclasses.dataclass
class FieldDoc:
    name: str
    group: str
    comment: str


def field_docs(cls: type) -> dict[str, FieldDoc]:
    """The comment beside each field and the section comment above it, read from the source of ``cls`` and
    its dataclass bases (a subclass's comment wins; a field keeps the group of the class that introduced it)."""
    docs: dict[str, FieldDoc] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        source = textwrap.dedent(inspect.getsource(klass))
        raw = {tok.start[0]: tok.string
               for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
        comments = {line: text.lstrip("#").strip() for line, text in raw.items()}
        lines = source.splitlines()
        class_def = ast.parse(source).body[0]
        body = class_def.body
        group = "settings"
        previous_end, previous = class_def.lineno, None
        for node in body:
            for line in range(previous_end + 1, node.lineno):  # standalone comments between fields: a section,
                if line not in comments or not lines[line - 1].strip().startswith("#"):
                    continue
                if raw[line].startswith("#  ") and previous is not None:  # or an indented continuation line
                    docs[previous].comment += " " + comments[line]
                else:
                    group = comments[line]
            previous_end = node.end_lineno
            if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
                continue
            name = node.target.id
            comment = comments.get(node.lineno, "") if not lines[node.lineno - 1].strip().startswith("#") else ""
            if name in docs:
                docs[name].comment = comment or docs[name].comment
            else:
                docs[name] = FieldDoc(name, group, comment)
            previous = name
        for line in range(previous_end + 1, len(lines) + 1):  # the last field's continuation lines, if any
            if line in comments and raw[line].startswith("#  ") and previous is not None:
                docs[previous].comment += " " + comments[line]
    return docs


def help_text(cls: type, values: dict[str, Any] | None = None, prog: str | None = None) -> str:
    """The --help of a config dataclass: usage, the convention, then every field grouped by section."""
    values = values or {}
    prog = prog or os.path.basename(sys.argv[0] or "script.py")
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    types_by_key = _field_types(cls)
    docs = field_docs(cls)
    module = sys.modules.get(cls.__module__)
    doc = ((module.__doc__ if module else "") or "").strip().split("\n\n")[0]
    out = [f"usage: python {prog} [config_file.py ...] [--key=value ...]", ""]
    if doc:
        out += [doc, ""]
    out += ["Config files are plain Python assignments (n_layer = 4); later files, then --key=value, win.",
            "Every key must be one of those below, with a value of its type.", ""]
    by_group: dict[str, list[FieldDoc]] = {}
    for f in dataclasses.fields(cls):
        if f.name in getattr(cls, "HELP_OMITS", ()):  # accepted, but documented by the command that uses it
            continue
        entry = docs.get(f.name, FieldDoc(f.name, "settings", ""))
        by_group.setdefault(entry.group, []).append(entry)
    for group, entries in by_group.items():
        out.append(f"{group}:")
        for entry in entries:
            value = values.get(entry.name, defaults[entry.name])
            shown = f"  --{entry.name}={value!r}"
            kind = _describe(types_by_key[entry.name])
            note = f"  [{kind}; default {defaults[entry.name]!r}]"
            out.append(f"{shown:<40}{note}" + (f"  {entry.comment}" if entry.comment else ""))
        out.append("")
    return "\n".join(out).rstrip() + "\n"
