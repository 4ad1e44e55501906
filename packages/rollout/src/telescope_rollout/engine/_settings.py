"""The rollout engine's settings: a small frozen dataclass of the config fields it reads.

``EngineSettings.from_config(config)`` picks them from a ``TelescopeConfig`` (or a
``ResolvedConfig``); programs that embed the engine without Telescope's config build it by hand.
Every field read from the config keeps the config's name (``scheduling_policy`` is
``vllm_scheduling_policy`` there), unit and default (telescope_config's defaults.yaml); the few
fields the config does not have are named in ``NOT_IN_CONFIG``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from telescope_config import ResolvedConfig, TelescopeConfig


def config_object(config: TelescopeConfig | ResolvedConfig) -> TelescopeConfig:
    """A ``TelescopeConfig`` from itself or from a ``ResolvedConfig`` (which wraps it)."""
    from telescope_config import ResolvedConfig

    return config.config if isinstance(config, ResolvedConfig) else config


def config_values(
    cls: Any, config: TelescopeConfig | ResolvedConfig, overrides: dict[str, Any]
) -> dict[str, Any]:
    """Constructor arguments of the settings dataclass ``cls``: each field read from the config
    (under its ``CONFIG_NAMES`` name, if renamed), except those in ``NOT_IN_CONFIG`` and those
    given in ``overrides``, which win. A field the config lacks is an error naming both."""
    cfg = config_object(config)
    renamed: dict[str, str] = cls.CONFIG_NAMES
    values: dict[str, Any] = {}
    for f in fields(cls):
        if f.name in cls.NOT_IN_CONFIG or f.name in overrides:
            continue
        name = renamed.get(f.name, f.name)
        try:
            values[f.name] = getattr(cfg, name)
        except AttributeError:
            raise AttributeError(
                f"{cls.__name__}.from_config: the config has no field {name!r} (for {cls.__name__}.{f.name})"
            ) from None
    return {**values, **overrides}


def config_mismatches(cls: Any) -> list[str]:
    """Where the settings dataclass ``cls`` disagrees with the config schema and its packaged
    defaults (empty when it agrees; each settings class's test asserts that):

    every field is a ``TelescopeConfig`` field (under its ``CONFIG_NAMES`` name) unless it is in
    ``NOT_IN_CONFIG``, which must then really be absent; its default is the packaged one, except
    a field without a default and those in ``OWN_DEFAULTS``, which must really differ.
    """
    from dataclasses import MISSING

    from telescope_config import TelescopeConfig, defaults

    packaged, known = defaults(), set(TelescopeConfig.model_fields)
    own: dict[str, str] = getattr(cls, "OWN_DEFAULTS", {})
    names = {f.name for f in fields(cls)}
    found = [
        f"{cls.__name__}.{n} in CONFIG_NAMES/OWN_DEFAULTS is no field"
        for n in {*cls.CONFIG_NAMES, *own} - names
    ]
    for f in fields(cls):
        name = cls.CONFIG_NAMES.get(f.name, f.name)
        if f.name in cls.NOT_IN_CONFIG:
            if name in known:
                found.append(f"{f.name} is a config field: from_config must read it")
        elif name not in known:
            found.append(f"{cls.__name__}.{f.name} maps to no config field")
        elif f.name in own:  # a library default, with its reason
            if f.default == packaged[name]:
                found.append(
                    f"{cls.__name__}.{f.name} no longer differs from the config: drop it from OWN_DEFAULTS"
                )
        elif f.default is not MISSING and f.default != packaged[name]:
            found.append(f"{cls.__name__}.{f.name}: {f.default!r} != {packaged[name]!r}")
    return found


@dataclass(frozen=True)
class EngineSettings:
    """What the rollout engine needs to schedule, sample and accept groups."""

    CONFIG_NAMES: ClassVar[dict[str, str]] = {"scheduling_policy": "vllm_scheduling_policy"}
    """Fields named differently in the config."""
    NOT_IN_CONFIG: ClassVar[frozenset[str]] = frozenset({"top_k", "extra_sampling", "eos_token"})
    """Fields for programs that embed the engine; the config has no such setting."""
    OWN_DEFAULTS: ClassVar[dict[str, str]] = {
        "enable_thinking": "None passes nothing to the chat template (its own default); a run passes "
        "the config's value",
    }
    """Fields whose default differs from the packaged config on purpose, with the reason."""

    group_size: int = 8
    """Completions sampled per prompt."""
    prompts_batch_size_for_trainer: int = 16
    """Kept groups per training batch."""
    max_concurrent_prompts_per_server: int = 32
    """Groups in flight per server; a server has this times group_size lane slots."""
    enable_individual_sample_lanes: bool = True
    """One lane slot per sample (True) or a group takes group_size slots at once (False)."""
    free_lane_after_generation: bool = True
    """Release a sample's slot when generation ends, before the reward (individual lanes only)."""
    max_async_rollout: int = 2
    """Batches the rollout may run ahead of the live weights; 0 is synchronous."""
    max_off_policy_steps: int = 8
    """Cancel a group once an in-flight sample saw more weight updates than this; < 0 never."""
    discard_group_zero_advantage: bool = True
    """Drop groups whose advantages are all equal (no learning signal)."""
    enable_prompt_prefetch: bool = True
    """Format and tokenize prompts in the background."""
    eager_prepare_resources: bool = False
    """Await every environment's ``prepare_resources()`` before the first request (else lazily)."""
    prompt_prefetch_buffer_size: int = 24
    """Prompts kept ready by the prefetcher; 0 disables the buffer."""
    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    extra_sampling: dict[str, Any] | None = None
    """More /v1/completions fields (e.g. ``{"ignore_eos": True}``), sent with every request."""
    max_tokens: int = 3700
    """Most tokens per request (per turn in multi-turn environments)."""
    max_model_len: int = 4096
    """Context length of the servers; max_tokens is shortened so prompt + completion fits."""
    scheduling_policy: str = "priority"
    """vLLM's policy; with "priority" later turns of multi-turn episodes are served first."""
    enable_thinking: bool | None = None
    """Passed to the chat template (e.g. Qwen3's thinking mode); None passes nothing."""
    eos_token: str | None = None
    """Trailing text stripped by reward functions; None uses each environment's own."""
    max_consecutive_unfit_prompts: int = 32
    """Stop the run once this many prompts of one environment in a row do not fit the context
    (prompt tokens >= max_model_len), or once every training prompt of an environment was seen
    not fitting, whichever comes first. Unfit prompts never reach a server: each is dropped as a
    group with reason prompt_too_long."""
    max_zero_advantage_batches: int = 10
    """Stop the run once this many batches' worth of groups (times prompts_batch_size_for_trainer)
    in a row were dropped for zero advantage with no group kept in between; an environment alone
    in that state is named in a warning. 0 never stops. Only with discard_group_zero_advantage."""

    def __post_init__(self) -> None:
        checks = [
            (self.group_size >= 1, "group_size must be >= 1"),
            (self.prompts_batch_size_for_trainer >= 1, "prompts_batch_size_for_trainer must be >= 1"),
            (self.max_concurrent_prompts_per_server >= 1, "max_concurrent_prompts_per_server must be >= 1"),
            (self.max_async_rollout >= 0, "max_async_rollout must be >= 0"),
            (self.max_tokens >= 1, "max_tokens must be >= 1"),
            (self.max_model_len >= 2, "max_model_len must be >= 2"),
            (self.temperature >= 0, "temperature must be >= 0"),
            (self.prompt_prefetch_buffer_size >= 0, "prompt_prefetch_buffer_size must be >= 0"),
            (self.max_consecutive_unfit_prompts >= 1, "max_consecutive_unfit_prompts must be >= 1"),
            (self.max_zero_advantage_batches >= 0, "max_zero_advantage_batches must be >= 0"),
            (
                not self.free_lane_after_generation or self.enable_individual_sample_lanes,
                "free_lane_after_generation needs enable_individual_sample_lanes: true "
                "(or set free_lane_after_generation: false)",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"EngineSettings: {message}")

    @property
    def lanes_per_server(self) -> int:
        return self.max_concurrent_prompts_per_server * self.group_size

    @classmethod
    def from_config(cls, config: TelescopeConfig | ResolvedConfig, **overrides: Any) -> EngineSettings:
        """Settings from a ``TelescopeConfig``/``ResolvedConfig``; ``overrides`` win."""
        return cls(**config_values(cls, config, overrides))

    def sampling_params(self) -> dict[str, Any]:
        """The sampling part of a /v1/completions body."""
        params: dict[str, Any] = {"temperature": self.temperature}
        if self.top_p is not None:
            params["top_p"] = self.top_p
        if self.top_k is not None:
            params["top_k"] = self.top_k
        params.update(self.extra_sampling or {})
        return params
