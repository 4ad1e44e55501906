"""Questions about a field's declared type, asked by the override parser and the error reporter.

Does ``--flag`` alone make sense (the field takes a bool)? Should ``--name 2024`` stay a
string? May a dotted path go into it (it takes a dict)? Which choices does it allow, for a
"did you mean"?
"""

from __future__ import annotations

import types
import typing
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from telescope_config._entries import EnvironmentEntry, EvalEntry
from telescope_config._schema import TelescopeConfig

__all__ = [
    "choices",
    "field_info",
    "leaf_types",
    "submodel_fields",
    "takes_bool",
    "takes_dict",
    "takes_nullable",
    "takes_only_text",
]

_SUBMODELS: dict[str, type[BaseModel]] = {"environments": EnvironmentEntry, "evals": EvalEntry}


def leaf_types(annotation: Any) -> set[Any]:
    """The plain types a union/Annotated/Literal annotation can hold (Literal values give their type)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return leaf_types(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return set[Any]().union(*(leaf_types(a) for a in typing.get_args(annotation)))
    if origin is Literal:
        return {type(v) for v in typing.get_args(annotation)}
    return {origin or annotation}


def _top(name: str) -> FieldInfo:
    return TelescopeConfig.model_fields[name]


def takes_bool(name: str) -> bool:
    """True when the top-level field accepts a bool, so a bare ``--name`` means true."""
    return bool in leaf_types(_top(name).annotation)


def takes_dict(name: str) -> bool:
    """True when the top-level field can hold a mapping, so dotted paths may go into it."""
    return dict in leaf_types(_top(name).annotation)


def takes_only_text(name: str) -> bool:
    """True when the top-level field is free text (``str`` or ``str | None``): no number coercion."""
    return leaf_types(_top(name).annotation) in ({str}, {str, type(None)})


def takes_nullable(name: str) -> bool:
    """True when the top-level field accepts null."""
    return type(None) in leaf_types(_top(name).annotation)


def choices(annotation: Any) -> list[str]:
    """The string choices of a Literal (possibly inside a union), else an empty list."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return choices(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [c for a in typing.get_args(annotation) for c in choices(a)]
    if origin is Literal:
        return [v for v in typing.get_args(annotation) if isinstance(v, str)]
    return []


def field_info(loc: Sequence[str | int]) -> tuple[type[BaseModel], FieldInfo] | None:
    """The model and field a pydantic error location points at, when it is one of ours."""
    if not loc or not isinstance(loc[0], str) or loc[0] not in TelescopeConfig.model_fields:
        return None
    if len(loc) >= 3 and loc[0] in _SUBMODELS and isinstance(loc[1], int) and isinstance(loc[2], str):
        sub = _SUBMODELS[loc[0]]
        info = sub.model_fields.get(loc[2])
        return (sub, info) if info is not None else None
    return TelescopeConfig, _top(loc[0])


def submodel_fields(loc: Sequence[str | int]) -> list[str]:
    """Valid keys at ``loc`` (an unknown key's parent): top-level fields or an entry's fields."""
    if len(loc) >= 2 and loc[0] in _SUBMODELS and isinstance(loc[1], int):
        return list(_SUBMODELS[str(loc[0])].model_fields)
    return list(TelescopeConfig.model_fields)
