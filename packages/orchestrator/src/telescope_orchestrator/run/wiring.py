"""Build the rollout side of a run from the config: tokenizer, environments, evals, sampler, engine.

The chat template comes from the model's tokenizer files unless the config's ``chat_template``
overrides it; environments are weighted by their ``weight`` entries. The engine gets its math
from telescope-algos (:func:`engine_math`): the group stage of the advantages here (batch
whitening follows in the loop) and the overlong penalty, so training sees one implementation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import structlog

if TYPE_CHECKING:
    from telescope_config import TelescopeConfig
    from telescope_rollout import EvalRunner, InferenceClient, RolloutEngine, Tokenizer
    from telescope_rollout.engine import AdvantageFn, EngineEvent, RewardShaping
    from telescope_rollout.envs import BuiltEnvironment
    from telescope_sandbox import SandboxPool

__all__ = [
    "DatasetError",
    "EngineParts",
    "build_engine",
    "build_training_environments",
    "engine_math",
    "load_datasets",
    "pad_token_id",
    "tokenizer_dir",
]

log = structlog.get_logger()
_TOKENIZER_FILES = [
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
    "chat_template.json", "config.json", "generation_config.json",
]  # fmt: skip


class _Hub(Protocol):
    """The part of ``huggingface_hub`` this module calls (its own signature has untyped parts)."""

    def snapshot_download(self, repo_id: str, *, allow_patterns: list[str]) -> str: ...


def tokenizer_dir(model: str) -> Path:
    """A local folder with the model's tokenizer files (downloads only those for a hub id)."""
    local = Path(model).expanduser()
    if local.is_dir():
        return local
    import huggingface_hub

    hub = cast(_Hub, huggingface_hub)
    return Path(hub.snapshot_download(model, allow_patterns=_TOKENIZER_FILES))


def engine_math(cfg: TelescopeConfig) -> tuple[AdvantageFn, RewardShaping | None]:
    """The engine's ``(advantage_fn, reward_shaping)`` for the config, both from telescope-algos.

    ``advantage_fn`` is ``group_advantages`` with the config's algorithm and normalisation (for
    ``advantage_norm: batch`` and REINFORCE++ its group stage; the loop whitens over the step).
    ``reward_shaping`` adds the overlong penalty to each sample's reward when
    ``overlong_penalty_factor > 0`` (else None): model tokens against ``max_tokens``.
    """
    from telescope_algos import group_advantages, overlong_penalty

    advantage_fn = functools.partial(
        group_advantages, algorithm=cfg.algorithm, advantage_norm=cfg.advantage_norm
    )
    if not cfg.overlong_penalty_factor > 0:
        return advantage_fn, None
    penalty = functools.partial(
        overlong_penalty,
        max_tokens=cfg.max_tokens,
        buffer_tokens=cfg.overlong_buffer_tokens,
        factor=cfg.overlong_penalty_factor,
    )

    def with_overlong_penalty(sample: Any) -> float:
        return sample.reward + penalty(sample.num_model_tokens)

    return advantage_fn, with_overlong_penalty


class DatasetError(ValueError):
    """An environment's dataset cannot be used; the message names the environment."""


def build_training_environments(cfg: TelescopeConfig) -> tuple[list[BuiltEnvironment], list[SandboxPool]]:
    """The config's environments (datasets not loaded yet) and the sandbox pools given to them.

    Runs before any server starts, so an unknown environment or a sandbox provider that cannot
    work fails in seconds (``run.sandboxes.SandboxSetupError``).
    """
    from telescope_orchestrator.run.sandboxes import attach_sandboxes
    from telescope_rollout import build_environments

    built = build_environments(cfg.environments)
    return built, attach_sandboxes((b.name, b.env, b.kwargs) for b in built)


def load_datasets(
    cfg: TelescopeConfig, built: list[BuiltEnvironment], model_path: str
) -> tuple[Tokenizer, str | None]:
    """Load every environment's dataset and the tokenizer; check that prompts can fit at all.

    Returns the tokenizer and, when the first prompts of an environment can never fit
    ``max_model_len``, the message that says so (``telescope_rollout.engine.unfit_environment``); both
    before any server starts.
    """
    from telescope_rollout import Tokenizer
    from telescope_rollout.engine import unfit_environment

    for b in built:
        try:
            b.env.load_dataset()
        except Exception as exc:  # a hub name, a missing extra, bad rows: the user's to fix
            raise DatasetError(
                f"environment {b.name!r}: its dataset did not load: {type(exc).__name__}: {exc}"
            ) from exc
        if not len(b.env):
            raise DatasetError(f"environment {b.name!r} loaded no samples: check its dataset kwargs")
        log.info("environment ready", name=b.name, weight=b.weight, samples=len(b.env))
    tokenizer = Tokenizer.from_pretrained(tokenizer_dir(model_path), chat_template=cfg.chat_template)
    # typed bool in the config; None (the chat template's own default) is still honoured here
    thinking = cast("bool | None", cfg.enable_thinking)
    problem = unfit_environment(
        {b.name: b.env for b in built},
        tokenizer,
        max_model_len=int(cfg.max_model_len),
        max_tokens=int(cfg.max_tokens),
        probe=int(cfg.max_consecutive_unfit_prompts),
        chat_template_kwargs={} if thinking is None else {"enable_thinking": thinking},
    )
    return tokenizer, problem


def served_model(cfg: TelescopeConfig) -> str | None:
    """The ``model`` generation requests name: with LoRA the adapter the servers serve (the trained
    policy), else None (each server's own model)."""
    if cfg.lora_rank <= 0:
        return None
    from telescope_weightsync import ADAPTER_NAME

    return ADAPTER_NAME


@dataclass(frozen=True)
class EngineParts:
    """What :func:`build_engine` builds."""

    engine: RolloutEngine
    client: InferenceClient
    pad_token_id: int
    evals: EvalRunner | None
    """The evals' runner (datasets loaded), or None when the config lists no evals."""
    eval_sandboxes: list[SandboxPool]
    """The eval environments' sandbox pools (the caller closes them)."""
    scorer_clients: list[InferenceClient]
    """The clients of the teacher's and reference model's servers (the caller closes them)."""


def _evals(
    cfg: TelescopeConfig, tokenizer: Tokenizer, client: Any, settings: Any, built: list[BuiltEnvironment]
) -> tuple[EvalRunner | None, list[SandboxPool], dict[str, Any]]:
    """The evals' runner (datasets loaded), their sandbox pools, and the items they hold out of
    training; nothing when the config lists no evals."""
    from telescope_orchestrator.run.sandboxes import attach_sandboxes
    from telescope_rollout import EvalRunner

    if not cfg.evals:
        return None, [], {}
    evals = EvalRunner(cfg.evals, tokenizer=tokenizer, client=client, settings=settings)
    evals.load()
    specs = {spec.name: spec for spec in evals.specs}
    pools = attach_sandboxes(
        (n, env, specs[n].kwargs if n in specs else {}) for n, env in evals.environments.items()
    )
    held_out = evals.exclusions(built)
    for name, indices in held_out.items():
        log.info("eval samples held out of training", environment=name, samples=len(indices))
    return evals, pools, held_out


def build_engine(
    cfg: TelescopeConfig,
    tokenizer: Tokenizer,
    urls: list[str],
    built: list[BuiltEnvironment],
    *,
    on_event: Callable[[EngineEvent], None] | None = None,
    scorer_urls: dict[str, list[str]] | None = None,
) -> EngineParts:
    """The rollout engine of a run, its client, the pad token id, its evals and their sandboxes.

    ``on_event`` receives the engine's timeline events (``telescope_rollout.engine.EngineEvent``).
    ``scorer_urls`` are the servers of the teacher and reference model by name (``run.scorers``):
    the engine scores each sample's tokens with them.

    ``built`` comes from :func:`build_training_environments`, ``tokenizer`` from
    :func:`load_datasets` (the datasets are loaded). The caller enters ``client`` then ``engine``
    and closes the sandbox pools at the end (``close_sandboxes``). Eval datasets are loaded here
    too, so that ``separate_eval_samples`` can hold their items out of the training sampler; eval
    environments that run code get their sandbox pools here.
    """
    from telescope_orchestrator.run.scorers import token_scorers
    from telescope_rollout import (
        EngineSettings,
        InferenceClient,
        MultiEnvSampler,
        RolloutEngine,
        SamplerEntry,
    )

    client = InferenceClient(urls, timeout_s=1200.0, model=served_model(cfg))
    settings = EngineSettings.from_config(cfg)
    evals, pools, held_out = _evals(cfg, tokenizer, client, settings, built)
    entries = [SamplerEntry(b.name, b.weight, len(b.env)) for b in built]
    sampler = MultiEnvSampler(entries, seed=cfg.seed, exclude=held_out)
    advantage_fn, reward_shaping = engine_math(cfg)
    scorers, scorer_clients = token_scorers(scorer_urls or {})
    engine = RolloutEngine(
        settings,
        environments=built,
        sampler=sampler,
        tokenizer=tokenizer,
        client=client,
        advantage_fn=advantage_fn,
        reward_shaping=reward_shaping,
        scorers=scorers,
        on_event=on_event,
    )
    return EngineParts(engine, client, pad_token_id(tokenizer), evals, pools, scorer_clients)


def pad_token_id(tokenizer: Tokenizer) -> int:
    """The id packing pads rows with: the tokenizer's pad token, else 0."""
    pad = getattr(tokenizer, "pad_token_id", None)
    return int(pad) if isinstance(pad, int) else 0
