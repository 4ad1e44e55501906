"""Reading config files: YAML text into a mapping, or precise problems saying why not.

The loader is PyYAML's safe loader with two changes: ``1e-6`` reads as a float (as in YAML 1.2,
where PyYAML alone would read text) and a key repeated in one mapping is an error instead of
silently keeping the last. Also home of the packaged ``defaults.yaml``.
"""

from __future__ import annotations

import copy
import functools
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any, cast

import yaml

from telescope_config._errors import Problem

__all__ = ["DEFAULTS_SOURCE", "FILE_FIELD", "defaults", "read_file", "read_yaml"]

DEFAULTS_SOURCE = "defaults"
FILE_FIELD = "<file>"


class _Loader(yaml.SafeLoader):
    """Safe YAML loading, plus: ``1e-6`` is a float (as in YAML 1.2) and a repeated key is an error."""


# PyYAML's stubs leave this method's (and construct_object's) parameters untyped.
_Loader.add_implicit_resolver(  # pyright: ignore[reportUnknownMemberType]
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _mapping_without_duplicates(loader: _Loader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = cast(object, loader.construct_object(key_node, deep=True))  # pyright: ignore[reportUnknownMemberType]
        try:
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"the key {key!r} appears twice",
                    key_node.start_mark,
                )
            seen.add(key)
        except TypeError:  # an unhashable key: construct_mapping reports it
            pass
    return loader.construct_mapping(node, deep=True)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def read_yaml(text: str, source: str) -> tuple[dict[str, Any] | None, list[Problem]]:
    """Parse the text of a config file into a mapping, or say why it is not one."""
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "an unknown line"
        what = " ".join(str(p) for p in (err.context, err.problem) if p)
        return None, [
            Problem(
                FILE_FIELD,
                source,
                f"YAML syntax error at {where}: {what}",
                f"fix the YAML near {where.split(',', maxsplit=1)[0]}: check indentation, the ':' after "
                "each key, and that brackets and quotes are closed",
                source,
            )
        ]
    except yaml.YAMLError as err:
        return None, [Problem(FILE_FIELD, source, f"not valid YAML: {err}", "fix the YAML syntax", source)]
    if data is None:
        return {}, []
    if not isinstance(data, dict):
        return None, [
            Problem(
                FILE_FIELD,
                f"a {type(data).__name__}",
                "a config file must be a mapping of field: value at the top level",
                "write one `field: value` per line, e.g. learning_rate: 1.0e-6 (not a list of '-' items)",
                source,
            )
        ]
    mapping = cast(dict[object, Any], data)
    problems = [
        Problem(str(k), v, "config keys must be field names", "use the field's name, e.g. seq_len", source)
        for k, v in mapping.items()
        if not isinstance(k, str)
    ]
    return {k: v for k, v in mapping.items() if isinstance(k, str)}, problems


def read_file(path: str | os.PathLike[str], source: str) -> tuple[dict[str, Any] | None, list[Problem]]:
    """Read and parse the config file at ``path``; problems name ``source`` as their origin."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        rule, fix = "file not found", f"check the path (looked for {p.absolute()})"
    except IsADirectoryError:
        rule, fix = "is a directory, not a YAML file", "point --config at a .yaml file"
    except PermissionError:
        rule, fix = "cannot be read: permission denied", "check the file's permissions"
    except UnicodeDecodeError:
        rule, fix = "is not UTF-8 text", "save the file as UTF-8 YAML"
    except OSError as err:
        rule, fix = f"cannot be read: {err.strerror or err}", "check the path and the file"
    else:
        return read_yaml(text, source)
    return None, [Problem(FILE_FIELD, str(path), rule, fix, source)]


@functools.cache
def _packaged_defaults() -> dict[str, Any]:
    text = resources.files("telescope_config").joinpath("defaults.yaml").read_text(encoding="utf-8")
    data, problems = read_yaml(text, DEFAULTS_SOURCE)
    if data is None or problems:  # a packaging bug, not a user mistake
        raise RuntimeError(f"the packaged defaults.yaml is broken: {problems}")
    return data


def defaults() -> dict[str, Any]:
    """The packaged defaults, as a fresh dict (one entry per config field)."""
    return copy.deepcopy(_packaged_defaults())
