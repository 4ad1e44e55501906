"""The two list-entry models of a run config: ``EnvironmentEntry`` and ``EvalEntry``.

Unlike the top-level fields, entry fields have Python defaults: an entry only names what differs
(``- name: math500``). Both forbid unknown keys, like the top level.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from telescope_config._errors import rule_error

__all__ = ["EnvironmentEntry", "EvalEntry"]


_PASS_K_FIX = (
    "write a list of k values such as [1, 4, 8], or {at_k: {metrics: [correct], k: [1, 4]}, pow_k: {...}}"
)


def _is_k(k: object) -> bool:
    return isinstance(k, int) and not isinstance(k, bool) and k >= 1


def _pass_k(value: object) -> object:
    if isinstance(value, list):
        ks = cast(list[object], value)
        if all(_is_k(k) for k in ks):
            return ks
        raise rule_error("every k must be an integer >= 1", _PASS_K_FIX)
    if isinstance(value, dict):
        kinds = cast(dict[object, object], value)
        for kind, spec in kinds.items():
            _check_pass_k_kind(kind, spec)
        return kinds
    raise rule_error("must be a list of k values or a mapping", _PASS_K_FIX)


def _check_pass_k_kind(kind: object, spec: object) -> None:
    """One ``kind: {metrics, k}`` entry of a ``pass_k`` mapping."""
    if kind not in ("at_k", "pow_k"):
        raise rule_error(f"unknown pass_k kind {kind!r}; the kinds are at_k and pow_k", _PASS_K_FIX)
    entry = cast(dict[object, object], spec) if isinstance(spec, dict) else None
    if entry is None or not set(entry) <= {"metrics", "k"}:
        raise rule_error(f"pass_k.{kind} must be a mapping with keys metrics and k", _PASS_K_FIX)
    ks = entry.get("k", [1])
    if not (_is_k(ks) or (isinstance(ks, list) and ks and all(_is_k(k) for k in cast(list[object], ks)))):
        raise rule_error(
            f"pass_k.{kind}.k must be an integer >= 1 or a list of them, got {ks!r}", _PASS_K_FIX
        )
    metrics = entry.get("metrics")
    names = [metrics] if isinstance(metrics, str) else metrics
    if metrics is not None and not (
        isinstance(names, list) and names and all(isinstance(m, str) and m for m in cast(list[object], names))
    ):
        problem = f"pass_k.{kind}.metrics must be a metric name or a list of them, got {metrics!r}"
        raise rule_error(problem, _PASS_K_FIX)


def _num_samples(value: object) -> object:
    if value == 0 and not isinstance(value, bool):
        raise rule_error("0 samples would make an empty eval", "use -1 for the whole dataset or N >= 1")
    return value


PassKKinds = dict[Literal["at_k", "pow_k"], dict[str, Any]]
PassK = Annotated[list[Annotated[int, Field(ge=1)]] | PassKKinds, BeforeValidator(_pass_k)]


class EnvironmentEntry(BaseModel):
    """One training environment of ``environments``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="Registered name of the environment, e.g. countdown.")
    weight: float = Field(
        default=1.0,
        gt=0,
        description="Relative sampling weight among the environments, > 0; weights are normalised to sum 1.",
    )
    reward_min: float | None = Field(
        default=None, description="Lowest reward the environment gives; only scales the UI charts."
    )
    reward_max: float | None = Field(
        default=None, description="Highest reward the environment gives; only scales the UI charts."
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments passed to the environment's constructor."
    )


class EvalEntry(BaseModel):
    """One eval of ``evals``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="Registered eval (e.g. math500) or environment name.")
    eval_every: int = Field(default=10, ge=1, description="Run this eval every N training steps, >= 1.")
    pass_k: PassK = Field(
        default_factory=PassKKinds,
        description="pass@k settings: a list of k values, or {at_k: {metrics, k}, pow_k: {metrics, k}}; "
        "each prompt is sampled max(k) times.",
    )
    num_samples: Annotated[int, BeforeValidator(_num_samples)] = Field(
        default=-1, ge=-1, description="Evaluate the first N dataset items; -1 evaluates all of them."
    )
    separate_eval_samples: bool = Field(
        default=False,
        description="Remove the evaluated items from the training set of the environment of the same name.",
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the eval.")
    temperature: float | None = Field(
        default=None,
        gt=0,
        description="Sampling temperature for this eval, > 0; null uses the training value.",
    )
    top_p: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Nucleus sampling for this eval, in (0, 1]; null uses the training value.",
    )
    max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Token budget per completion for this eval; null uses the training value.",
    )
