"""pass@k and pass^k for evals: the estimators and the ``pass_k`` config forms.

For one prompt with ``n`` scored completions of which ``c`` succeed (metric value > 0):

* pass@k = P(at least one of k completions drawn without replacement succeeds)
  = 1 - C(n-c, k) / C(n, k)   (the unbiased estimator of Chen et al. 2021, "Evaluating Large
  Language Models Trained on Code", eq. 1);
* pass^k = P(all k drawn completions succeed) = C(c, k) / C(n, k).

Every prompt is sampled ``n = max(k)`` times and the estimators use **all n completions** for
every k (using only the first k would make pass@k "any of the first k succeeded": a
high-variance estimate that wastes the other completions). When fewer than k completions are
left (some failed), the estimator is undefined; then pass@k is 1 if any succeeded else 0, and
pass^k is 1 only if at least k succeeded (so 0). See docs/rollout.md, "Evals and pass@k".

``pass_k`` config forms (validated by telescope-config, and again here):
* ``[1, 4, 8]``: pass@k for these k over the eval's **success metrics**;
* ``{at_k: {metrics: [correct], k: [1, 4]}, pow_k: {metrics: [correct], k: [2]}}``; ``at_k.k``
  defaults to ``[1]``, ``pow_k.k`` to none; ``metrics`` omitted means the success metrics.
  Every k is an integer >= 1 (a list of them, or one).

Success metrics: the environment's ``success_metrics`` when it declares them (the dedicated evals
declare ``correct``), else every metric whose values all lie in [0, 1] over the eval's valid
completions at that step (outcomes and success shares, not counts or levels). So
``pass_k: [1, 4]`` on math500 gives ``pass@k/correct`` and no meaningless ``pass@k/level`` (the
level is 1-5, not an outcome), nor ``pass@k/<length>`` for a length metric of an environment.
Name a metric in ``metrics`` to get pass metrics of any other metric (success = value > 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import comb
from typing import Any, cast


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one success among k of n completions, c of them successful)."""
    _check(n, c, k)
    if n < k:
        return 1.0 if c > 0 else 0.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_pow_k(n: int, c: int, k: int) -> float:
    """P(all k of k drawn completions succeed), n completions, c successful."""
    _check(n, c, k)
    if n < k:
        return 1.0 if c >= k else 0.0
    return comb(c, k) / comb(n, k)


def _check(n: int, c: int, k: int) -> None:
    if k < 1 or n < 0 or not 0 <= c <= n:
        raise ValueError(f"pass@k needs k >= 1 and 0 <= c <= n, got n={n} c={c} k={k}")


@dataclass(frozen=True)
class PassKSpec:
    """Which pass metrics an eval reports. ``None`` metrics = the eval's success metrics."""

    at_k: tuple[int, ...] = ()
    at_k_metrics: tuple[str, ...] | None = None
    pow_k: tuple[int, ...] = ()
    pow_k_metrics: tuple[str, ...] | None = None

    @classmethod
    def parse(cls, value: Any) -> PassKSpec:
        """From the config's ``pass_k`` (a list of k, or the at_k/pow_k mapping; empty = none)."""
        if value is None or (isinstance(value, Sequence | Mapping) and not value):
            return cls()
        if isinstance(value, PassKSpec):
            return value
        if isinstance(value, Sequence) and not isinstance(value, str):
            return cls(at_k=_ks(value, "pass_k"))
        if not isinstance(value, Mapping):
            raise ValueError(f"pass_k must be a list of k values or a mapping, got {value!r}")
        kinds = cast(Mapping[str, Any], value)
        unknown = set(kinds) - {"at_k", "pow_k"}
        if unknown:
            raise ValueError(f"pass_k: unknown kind(s) {sorted(unknown)}; the kinds are at_k and pow_k")
        at, pow_ = (_kind(kinds.get(kind), f"pass_k.{kind}") for kind in ("at_k", "pow_k"))
        return cls(
            at_k=_ks(at.get("k", [1]), "pass_k.at_k.k") if at is not None else (),
            at_k_metrics=_metrics(at, "pass_k.at_k"),
            pow_k=_ks(pow_.get("k", []), "pass_k.pow_k.k") if pow_ is not None else (),
            pow_k_metrics=_metrics(pow_, "pass_k.pow_k"),
        )

    @property
    def completions_per_sample(self) -> int:
        """How many completions each prompt gets: the largest k, or 1."""
        return max((*self.at_k, *self.pow_k), default=1)


def _kind(spec: Any, where: str) -> Mapping[str, Any] | None:
    if spec is None:
        return None
    mapping = cast(Mapping[str, Any], spec) if isinstance(spec, Mapping) else None
    if mapping is None or not set(mapping) <= {"metrics", "k"}:
        raise ValueError(f"{where} must be a mapping with keys metrics and k, got {spec!r}")
    return mapping


_K_FIX = "write k as an integer >= 1 or a list of them, e.g. k: [1, 4]"


def _ks(values: Any, where: str) -> tuple[int, ...]:
    items: object = [values] if isinstance(values, int) and not isinstance(values, bool) else values
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Sequence):
        raise ValueError(f"{where}: expected an integer >= 1 or a list of them, got {values!r}; {_K_FIX}")
    ks = cast(Sequence[object], items)
    bad = [k for k in ks if not isinstance(k, int) or isinstance(k, bool) or k < 1]
    if bad:
        raise ValueError(f"{where}: every k must be an integer >= 1, got {list(ks)} ({bad} not); {_K_FIX}")
    return tuple(sorted(set(cast(Sequence[int], ks))))


def _metrics(spec: Mapping[str, Any] | None, where: str) -> tuple[str, ...] | None:
    if spec is None:
        return None
    names: object = spec.get("metrics")
    if names is None:
        return None
    if isinstance(names, str):
        names = [names]
    items = cast(Sequence[object], names) if isinstance(names, Sequence) else None
    if items is None or not all(isinstance(m, str) and m for m in items):
        raise ValueError(f"{where}.metrics must be a metric name or a list of them, got {names!r}")
    return tuple(cast(Sequence[str], items))


def unit_metrics(completion_metrics: Sequence[Mapping[str, float]]) -> list[str]:
    """The metrics whose every reported value lies in [0, 1], sorted by name (the default success
    metrics: pass/fail outcomes and success shares)."""
    seen: dict[str, bool] = {}
    for cm in completion_metrics:
        for name, value in cm.items():
            seen[name] = seen.get(name, True) and 0.0 <= float(value) <= 1.0
    return sorted(name for name, ok in seen.items() if ok)


def sample_pass_metrics(
    spec: PassKSpec,
    completion_metrics: Sequence[Mapping[str, float]],
    success: Sequence[str] | None = None,
) -> dict[str, float]:
    """pass@k/pass^k of one prompt from its valid completions' metrics (success = value > 0).

    ``success`` are the metrics used where ``spec`` names none (the eval's success metrics, see
    the module docstring); default: :func:`unit_metrics` of these completions. A metric missing
    from a completion counts as a failure for it; a named metric no completion reports is left
    out. With no completion at all the result is empty (the prompt is left out of the eval's means).
    """
    n = len(completion_metrics)
    if n == 0:
        return {}
    reported = {m for cm in completion_metrics for m in cm}
    default = list(success) if success is not None else unit_metrics(completion_metrics)
    out: dict[str, float] = {}
    for ks, wanted, name, fn in (
        (spec.at_k, spec.at_k_metrics, "pass@", pass_at_k),
        (spec.pow_k, spec.pow_k_metrics, "pass^", pass_pow_k),
    ):
        metrics = [m for m in (default if wanted is None else wanted) if m in reported]
        for metric in metrics:
            c = sum(1 for cm in completion_metrics if float(cm.get(metric, 0.0)) > 0)
            for k in ks:
                out[f"{name}{k}/{metric}"] = fn(n, c, k)
    return out
