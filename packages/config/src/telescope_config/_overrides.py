"""Command-line overrides: ``--name value`` pairs into a nested dict, the top layer of a config.

Accepted forms: ``--learning_rate 5e-7``, ``--learning-rate=5e-7``, ``--Learning-Rate 5e-7``
(dashes and underscores alike, any case), ``--ray_runtime_env.env_vars.FOO bar`` (a dotted
path into a dict field; the path below the field keeps its case), JSON for lists and dicts
(``--wandb_tags '["a","b"]'``) and ``--debug`` alone for a bool field meaning true. Values are
coerced JSON, then int, then float, then left as text; free-text fields (``model``,
``wandb_run_name``...) keep the text as typed. Later flags win.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from telescope_config._errors import ConfigError, Problem, did_you_mean
from telescope_config._fieldinfo import takes_bool, takes_dict, takes_nullable, takes_only_text
from telescope_config._schema import TelescopeConfig

__all__ = ["parse_overrides"]

CLI = "command line"
_FIX_FORM = "write overrides as --name value or --name=value, e.g. --learning_rate 5e-7"


def parse_overrides(args: Sequence[str]) -> dict[str, Any]:
    """Parse ``--name value`` flags into a nested dict; raise ``ConfigError`` listing every bad flag."""
    values, problems, _ = parse_collecting(args)
    if problems:
        raise ConfigError(problems, "the command-line overrides")
    return values


def coerce(raw: str) -> Any:
    """Turn a flag's text into a value: JSON, else int, else float, else the text itself."""
    try:
        return json.loads(raw)
    except ValueError:
        pass
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def parse_collecting(args: Sequence[str]) -> tuple[dict[str, Any], list[Problem], dict[str, str]]:
    """Like ``parse_overrides`` but returns ``(values, problems, flag_of_field)`` instead of raising."""
    values: dict[str, Any] = {}
    problems: list[Problem] = []
    flag_of: dict[str, str] = {}
    tokens = list(args)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("--") or len(token) == 2:
            problems.append(
                Problem(token, token, "not an override flag (flags start with --)", _FIX_FORM, source=CLI)
            )
            continue
        name, sep, raw = token[2:].partition("=")
        raw_value: str | None = raw if sep else None
        if raw_value is None and i < len(tokens) and not tokens[i].startswith("--"):
            raw_value = tokens[i]
            i += 1
        parsed = _override(name, raw_value)
        if isinstance(parsed, Problem):
            problems.append(parsed)
            continue
        path, value = parsed
        _put(values, path, value)
        flag_of[path[0]] = "--" + name
    return values, problems, flag_of


def _override(name: str, raw_value: str | None) -> tuple[list[str], Any] | Problem:
    """One ``--name [value]`` flag: the path it sets (field first) and its value, or its problem."""
    flag = "--" + name
    path = name.split(".")
    top = path[0].lower().replace("-", "_")
    if top not in TelescopeConfig.model_fields:
        hint = did_you_mean(top, list(TelescopeConfig.model_fields))
        return Problem(
            top,
            raw_value,
            f"unknown flag {flag}: no config field is called {top!r}",
            (hint + " " if hint else "") + "`telescope config show` lists every field",
            source=flag,
        )
    if len(path) > 1 and (not takes_dict(top) or not all(path[1:])):
        return Problem(
            name,
            raw_value,
            f"a dotted path needs a dict field with non-empty keys, and {top} "
            + ("is one" if takes_dict(top) else "is not a dict"),
            f"set the whole value instead, e.g. --{top} '<JSON>'; dotted paths work for "
            "ray_runtime_env, e.g. --ray_runtime_env.env_vars.NAME value",
            source=flag,
        )
    if raw_value is None:
        if len(path) == 1 and takes_bool(top):
            return [top], True
        return Problem(top, None, f"{flag} needs a value", f"write {flag} VALUE or {flag}=VALUE", flag)
    if len(path) == 1 and takes_only_text(top):
        return [top], None if raw_value == "null" and takes_nullable(top) else raw_value
    return [top, *path[1:]], coerce(raw_value)


def _put(values: dict[str, Any], path: Sequence[str], value: Any) -> None:
    """Set ``value`` at ``path`` in the nested dict ``values``, creating the dicts on the way."""
    node = values
    for seg in path[:-1]:
        if not isinstance(node.get(seg), dict):
            node[seg] = {}
        node = node[seg]
    node[path[-1]] = value
