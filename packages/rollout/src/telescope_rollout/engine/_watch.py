"""When the rollout engine's input can only fail again: pure counting, and the messages that say why.

The engine reports what happens to prompts and groups; :class:`FailureWatch` counts, and answers
with the streak that proves the run cannot make progress (the engine then stops with a message
built here). Two rules:

- **unfit prompts**, per environment: a prompt fits when ``prompt tokens < max_model_len``
  (``max_tokens`` is shortened to the room left, so it never decides). Consecutive prompts of an
  environment that do not fit are counted; one that fits resets the count. The environment is
  hopeless once the count reaches ``max_unfit``, or once every one of its training prompts was
  seen unfit in the current streak. The sampler draws with replacement, so counting to
  ``len(env)`` would stop a small environment in which only some prompts are too long; covering
  all its distinct prompts proves that none fits.
- **same error**: consecutive finished groups in which every sample failed with one error kind,
  the same kind for all of them. A kept group, or one dropped for a non-error reason (max_async,
  zero_advantage), resets the count; so does a group that failed only in part or with mixed kinds
  (it is not "the same error"). Cancelled groups, and groups that failed on a server found
  unreachable, are not reported by the engine: they neither count nor reset.
  The run is hopeless once the count reaches ``max_same_error``.
- **zero advantage**: groups dropped because all their samples got one reward (no learning
  signal) with no group kept in between, counted over the run and per environment. A kept group
  starts its environment's count and the run's over; a group dropped for another reason
  (max_async, an error) or cancelled neither counts nor resets. The run is hopeless once its
  count reaches ``max_zero_advantage`` (0: never); an environment whose own count reaches a
  multiple of it is named (the others keep the run going, but it trains nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from telescope_rollout.engine._progress import RewardTally, rewards_summary

__all__ = [
    "ErrorRun",
    "FailureWatch",
    "FlatRun",
    "UnfitStreak",
    "flat_environment_message",
    "flat_run_message",
    "same_error_message",
    "unfit_environment",
    "unfit_message",
]


@dataclass
class UnfitStreak:
    """Consecutive prompts of one environment that did not fit the context."""

    count: int = 0
    indices: set[int] = field(default_factory=set[int])
    """Distinct dataset indices in the streak (at most ``max_unfit`` of them)."""
    longest: int = 0
    shortest: int = 0


@dataclass
class ErrorRun:
    """Consecutive finished groups whose every sample failed with the same error kind."""

    count: int = 0
    kind: str = ""
    envs: list[str] = field(default_factory=list[str])
    """Environments of the groups, first seen first."""
    first_detail: str = ""
    """The first sample's error text of the run's first group."""


@dataclass
class FlatRun:
    """Groups dropped for zero advantage with no group kept in between (of the run or of one
    environment), with their rewards per environment."""

    count: int = 0
    rewards: dict[str, RewardTally] = field(default_factory=dict[str, RewardTally])

    def add(self, env: str, reward: float) -> None:
        self.count += 1
        self.rewards.setdefault(env, RewardTally()).add(reward)


@dataclass
class FailureWatch:
    """The hopeless-input rules of the module docstring; memory is bounded by ``max_unfit``
    indices per environment and a few numbers per environment."""

    max_unfit: int
    """Consecutive unfit prompts of one environment that stop the run."""
    max_same_error: int
    """Consecutive all-failed groups of one error kind that stop the run."""
    max_zero_advantage: int = 0
    """Zero-advantage groups with none kept in between that stop the run; 0: never."""
    unfit: dict[str, UnfitStreak] = field(default_factory=dict[str, UnfitStreak])
    errors: ErrorRun = field(default_factory=ErrorRun)
    flat: FlatRun = field(default_factory=FlatRun)
    """The run's zero-advantage groups since the last kept group."""
    flat_by_env: dict[str, FlatRun] = field(default_factory=dict[str, FlatRun])
    """Each environment's zero-advantage groups since its last kept group."""

    def prompt_fits(self, env: str) -> None:
        """A prompt of ``env`` fits: its unfit streak starts over."""
        self.unfit.pop(env, None)

    def prompt_unfit(self, env: str, index: int, tokens: int, candidates: int) -> UnfitStreak | None:
        """A prompt of ``env`` (dataset ``index``, ``tokens`` long) does not fit; ``candidates`` is
        how many prompts the sampler can draw from ``env``. Returns the streak once it is hopeless."""
        streak = self.unfit.setdefault(env, UnfitStreak(shortest=tokens))
        streak.count += 1
        streak.indices.add(index)
        streak.longest = max(streak.longest, tokens)
        streak.shortest = min(streak.shortest, tokens)
        if streak.count >= self.max_unfit or len(streak.indices) >= candidates:
            return streak
        return None

    def group_ok(self) -> None:
        """A group was kept, or dropped for a non-error reason: the error run starts over."""
        self.errors = ErrorRun()

    def group_kept(self, env: str) -> None:
        """A group of ``env`` was kept: the run's and ``env``'s zero-advantage counts start over."""
        self.flat = FlatRun()
        self.flat_by_env.pop(env, None)

    def group_flat(self, env: str, reward: float) -> tuple[FlatRun | None, FlatRun | None]:
        """A group of ``env`` (mean reward ``reward``) was dropped for zero advantage. Returns the
        run's count once hopeless, and ``env``'s count each time it reaches a multiple of
        ``max_zero_advantage`` (None otherwise; both None when the rule is off)."""
        self.flat.add(env, reward)
        mine = self.flat_by_env.setdefault(env, FlatRun())
        mine.add(env, reward)
        limit = self.max_zero_advantage
        if limit <= 0:
            return None, None
        hopeless = self.flat if self.flat.count >= limit else None
        return hopeless, mine if mine.count % limit == 0 else None

    def group_failed(self, kinds: list[str | None], env: str, detail: str) -> ErrorRun | None:
        """A finished group was dropped for an error; ``kinds`` are its samples' error kinds (None
        where a sample succeeded), ``detail`` its first error text. Returns the run once hopeless."""
        kind = kinds[0] if kinds else None
        if kind is None or any(k != kind for k in kinds):
            self.errors = ErrorRun()
            return None
        if self.errors.count == 0 or self.errors.kind != kind:
            self.errors = ErrorRun(kind=kind, first_detail=detail)
        run = self.errors
        run.count += 1
        if env not in run.envs:
            run.envs.append(env)
        return run if run.count >= self.max_same_error else None


def unfit_message(
    env: str,
    streak: UnfitStreak,
    *,
    candidates: int,
    max_model_len: int,
    max_tokens: int,
    limit: int,
    drawn: bool = True,
) -> str:
    """Why environment ``env`` stops the run, and how to fix it (for :class:`RolloutError`).

    ``drawn``: the streak is of prompts the sampler drew (the engine) rather than the dataset's
    first ones (the start-up check).
    """
    n = streak.count
    what = (
        f"none of the last {n} prompts drawn from it fits" if drawn else f"none of its first {n} prompts fits"
    )
    if n == 1:
        what = "the prompt drawn from it does not fit" if drawn else "its one prompt does not fit"
    if len(streak.indices) >= candidates:
        seen = f"they are all {candidates} of its training prompts"
        if candidates == 1:
            seen = "it has only this one training prompt"
    else:
        seen = (
            f"{n} in a row, of its {candidates} training prompts; if only some are too long, "
            f"raise max_consecutive_unfit_prompts (now {limit})"
        )
    if n == 1:
        lengths = f"It has {streak.longest} prompt tokens"
    elif streak.longest == streak.shortest:
        lengths = f"Each has {streak.longest} prompt tokens"
    else:
        lengths = f"The longest has {streak.longest} prompt tokens, the shortest {streak.shortest}"
    return (
        f"environment {env!r} has no prompt that fits the context: {what} ({seen}). {lengths}; "
        f"a prompt fits when its token count is below max_model_len ({max_model_len}). "
        f"max_tokens ({max_tokens}) is not the cause: it is shortened to max_model_len minus the "
        "prompt's tokens, so lowering it does not help. Fix: raise max_model_len to at least "
        f"{streak.longest + max_tokens} (the longest prompt plus max_tokens), or shorten the "
        f"prompts or filter the dataset to prompts under {max_model_len} tokens."
    )


def same_error_message(run: ErrorRun, *, detail_chars: int = 500) -> str:
    """Why the run stops after ``run``: the kind, the environment(s), the first error text."""
    noun = "environment" if len(run.envs) == 1 else "environments"
    detail = " ".join(run.first_detail.split())
    if len(detail) > detail_chars:
        detail = detail[: detail_chars - 3] + "..."
    return (
        f"every sample of the last {run.count} groups failed with {run.kind} "
        f"({noun} {', '.join(run.envs)}): {detail or run.kind}; the run cannot make progress. "
        "Fix the cause above (the environment, its resources or the servers) and start again."
    )


_FLAT_FIXES = (
    "Check the reward on a few samples: `telescope ui` shows each dropped group's completions and "
    "rewards (page Discarded, reason zero_advantage). If the reward is right, the task is too hard "
    "or too easy for the model: use easier (or harder) prompts, a stronger model or more max_tokens. "
    "Or set discard_group_zero_advantage: false to train on such groups"
)


def flat_run_message(run: FlatRun, *, limit_batches: int, batch_size: int) -> str:
    """Why the run stops after ``run``: the groups, their rewards per environment, the fixes."""
    return (
        f"no group was kept in the last {run.count} groups: every one was dropped for zero "
        "advantage (all its samples got the same reward, so it carries nothing to learn), "
        f"{limit_batches} batches' worth of {batch_size} groups; {rewards_summary(run.rewards)}. "
        "The run cannot make progress. "
        f"{_FLAT_FIXES}, or raise max_zero_advantage_batches (now {limit_batches}; 0 waits forever)."
    )


def flat_environment_message(env: str, run: FlatRun) -> str:
    """Why ``env`` trains nothing although the run goes on (a warning, not a stop)."""
    return (
        f"environment {env!r} trains nothing: its last {run.count} groups were all dropped for zero "
        f"advantage ({run.rewards[env].describe()}) while other environments' groups were kept. "
        f"{_FLAT_FIXES}."
    )


def unfit_environment(
    environments: Mapping[str, Any],
    tokenizer: Any,
    *,
    max_model_len: int,
    max_tokens: int,
    probe: int = 64,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> str | None:
    """Before any server starts: the message for the first environment none of whose first
    ``probe`` prompts fits ``max_model_len`` (rendered and tokenized as the engine does), or None.

    A cheap check of the unfit rule above on the dataset's first prompts, so that a run whose
    prompts can never fit stops in seconds; the engine still applies the rule to every prompt.
    """
    from telescope_rollout.engine._prompts import PromptSource

    source = PromptSource(
        environments, None, tokenizer, chat_template_kwargs=dict(chat_template_kwargs or {})
    )
    for name, env in environments.items():
        n = min(len(env), probe)
        watch = FailureWatch(max_unfit=probe, max_same_error=1)  # hopeless once all n probed are unfit
        for i in range(n):
            tokens = len(source.prepare(env, name, i, env.get_sample(i)).ids)
            if tokens < max_model_len:
                break
            streak = watch.prompt_unfit(name, i, tokens, candidates=n)
            if streak is not None:
                return unfit_message(
                    name,
                    streak,
                    candidates=len(env),
                    max_model_len=max_model_len,
                    max_tokens=max_tokens,
                    limit=probe,
                    drawn=False,
                )
    return None
