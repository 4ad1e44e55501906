"""Finding environments by name: entry points, module paths, and the config's environments block.

Names resolve, in order, to a module path (``"my_pkg.my_module:MyEnv"``), an entry point in the
group ``telescope.environments`` (built-ins are registered there too), or the built-in table (so
a source checkout works before it is installed). An unknown name is an error listing the known
ones.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import importlib.util
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from telescope_rollout.envs._env import Environment

GROUP = "telescope.environments"
BUILTINS: dict[str, str] = {
    "countdown": "telescope_rollout.envs.countdown:CountdownEnv",
    "hendrycks_math": "telescope_rollout.envs.boxed_math:HendrycksMathEnv",
    "dapo_math": "telescope_rollout.envs.boxed_math:DapoMathEnv",
    "deepscaler": "telescope_rollout.envs.boxed_math:DeepScalerEnv",
    "wordle": "telescope_rollout.envs.wordle:WordleEnv",
    "i3_code": "telescope_rollout.envs.i3_code:I3CodeEnv",
    "quickstart_add": "telescope_rollout.envs.quickstart_add:QuickstartAddEnv",
    "quickstart_agent": "telescope_rollout.envs.quickstart_agent:QuickstartAgentEnv",
    "quickstart_agent_command": "telescope_rollout.envs.quickstart_agent:QuickstartCommandAgentEnv",
    # dedicated evals (kind "eval"): benchmarks without a training set, usable in ``evals``
    "math500": "telescope_rollout.envs.evals:Math500Eval",
    "aime_2024": "telescope_rollout.envs.evals:Aime2024Eval",
    "aime_2025": "telescope_rollout.envs.evals:Aime2025Eval",
    "gpqa_diamond": "telescope_rollout.envs.evals:GpqaDiamondEval",
}


class UnknownEnvironmentError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def available_environments() -> dict[str, str]:
    """``{name: "module:attr"}`` of every registered environment (entry points win)."""
    found = dict(BUILTINS)
    for ep in md.entry_points(group=GROUP):
        found[ep.name] = ep.value
    return dict(sorted(found.items()))


def _load(target: str) -> type[Environment]:
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    if attr:
        obj: Any = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    else:
        candidates = [
            v
            for k, v in sorted(vars(module).items())
            if isinstance(v, type)
            and issubclass(v, Environment)
            and v.__module__ == module.__name__
            and not getattr(v, "__abstractmethods__", None)
            and not k.startswith("_")
        ]
        if not candidates:
            raise UnknownEnvironmentError(f"module {module_name!r} defines no concrete Environment subclass")
        obj = candidates[0]
    if not (isinstance(obj, type) and issubclass(obj, Environment)):
        raise TypeError(f"{target!r} is not an Environment subclass")
    return obj


def get_environment_class(name: str) -> type[Environment]:
    """The class registered under ``name``, or the one a ``module:Class`` path points to."""
    if ":" in name:
        return _load(name)
    known = available_environments()
    if name not in known and "." in name:
        try:
            return _load(name)  # a dotted module path: its first concrete Environment subclass
        except ModuleNotFoundError:
            pass
    if name not in known:
        raise UnknownEnvironmentError(
            f"unknown environment {name!r}; known: {', '.join(known)}. "
            "Use 'my_pkg.my_module:MyEnv' for your own, or register it under the "
            f"entry-point group {GROUP!r}."
        )
    return _load(known[name])


def get_environment(name: str, **kwargs: Any) -> Environment:
    """Instantiate the environment ``name`` with ``kwargs``; its ``name`` becomes ``name``."""
    env = get_environment_class(name)(**kwargs)
    if env._name is None and "name" not in type(env).__dict__:  # pyright: ignore[reportPrivateUsage]
        env.name = name
    return env


def _installed(dist: str) -> bool:
    try:
        md.distribution(dist)
        return True
    except md.PackageNotFoundError:
        return importlib.util.find_spec(dist.replace("-", "_")) is not None


def list_environments() -> list[dict[str, Any]]:
    """Rows for ``telescope envs list``: name, kind, requirements, installed, missing_optional.

    ``installed`` is True when every required distribution is present; a row that fails to
    import carries ``error`` instead.
    """
    rows: list[dict[str, Any]] = []
    for name, target in available_environments().items():
        try:
            cls = _load(target)
        except Exception as exc:
            rows.append(
                {"name": name, "kind": "?", "requirements": [], "installed": False, "error": str(exc)}
            )
            continue
        rows.append(
            {
                "name": name,
                "kind": cls.kind,
                "requirements": [*cls.requires, *(f"{o} (optional)" for o in cls.optional), *cls.needs],
                "installed": all(_installed(r) for r in cls.requires),
                "missing_optional": [o for o in cls.optional if not _installed(o)],
            }
        )
    return rows


@dataclass
class BuiltEnvironment:
    """One entry of the config's environments block, instantiated."""

    name: str
    weight: float
    env: Environment
    kwargs: dict[str, Any] = field(default_factory=dict[str, Any])


def _field(entry: Any, key: str, default: Any = None) -> Any:
    if isinstance(entry, Mapping):
        return cast(Mapping[str, Any], entry).get(key, default)
    return getattr(entry, key, default)


def build_environments(entries: Iterable[Any]) -> list[BuiltEnvironment]:
    """Instantiate the config's ``environments`` list (dicts or objects with name, weight, kwargs,
    reward_min, reward_max). Datasets are not loaded here; call ``env.load_dataset`` next."""
    built: list[BuiltEnvironment] = []
    seen: set[str] = set()
    for entry in entries:
        name = _field(entry, "name")
        if not name or not isinstance(name, str):
            raise ValueError(f"environment entry without a name: {entry!r}")
        if name in seen:
            raise ValueError(f"environment {name!r} is listed twice; each entry needs a distinct name")
        seen.add(name)
        weight = float(_field(entry, "weight", 1.0) if _field(entry, "weight") is not None else 1.0)
        if not weight > 0:
            raise ValueError(f"environment {name!r}: weight must be > 0, got {weight}")
        kwargs = dict(_field(entry, "kwargs") or {})
        env = get_environment(name, **kwargs)
        for bound in ("reward_min", "reward_max"):
            value = _field(entry, bound)
            if value is not None:
                setattr(env, bound, float(value))
        built.append(BuiltEnvironment(name, weight, env, kwargs))
    if not built:
        raise ValueError("`environments` is empty: list at least one environment")
    return built
