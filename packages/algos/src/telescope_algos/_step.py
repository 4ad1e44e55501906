"""The backend-neutral pieces of one train step, shared by the FSDP and Megatron trainers.

- :func:`loss_options`: the config's :class:`LossOptions` (a field the config lacks is an error),
  and :func:`lr_schedule`, the config's learning-rate multiplier per step;
- :func:`needs_old_logprobs`: whether the step starts with a no-grad pass for π_old;
- :func:`check_micro_batches`: a step needs at least one micro-batch;
- :func:`minibatch_groups`: micro-batches dealt round-robin into ``number_of_minibatches``
  optimizer updates, and :func:`step_counts`, each group's loss tokens and samples over the ranks
  (the ``num_tokens`` / ``num_samples`` of :class:`LossInputs`);
- :func:`micro_batch_loss`: ``compute_loss`` of one packed micro-batch of such a group;
- :class:`StepPlan`: what a step's objective changes (``rl``, the config's loss; ``sft``, a
  supervised step: the token-mean negative log-likelihood of the trained tokens, one update);
- :class:`StepLog`: the grad norms, skipped updates and timings of a step, as its metrics (and its
  timed blocks as spans of a :class:`~telescope_algos.backend.Timeline`);
- :data:`FROZEN_MODELS`: the frozen models a trainer may hold (the teacher, the reference model),
  :func:`frozen_models` checks their names, :func:`with_frozen_logprobs` puts one's logprobs in a
  micro-batch;
- :func:`row_multiple`: the length every packed row must be a multiple of for a parallel layout,
  and :func:`pad_multiple`, what the loop pads rows to;
- :func:`seed_everything`, and :func:`rng_state` / :func:`set_rng_state`: Python, NumPy, torch
  (and CUDA) RNG seeding, capture and restore for checkpoints.

Config objects are read by attribute (a ``telescope_config.TelescopeConfig`` or anything with the
same field names); this package does not import telescope-config.
"""

from __future__ import annotations

import contextlib
import functools
import math
import random
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist

from telescope_algos._objective import LossInputs, LossOptions, compute_loss, loss_tokens
from telescope_algos._packing import MicroBatch
from telescope_algos._schedule import lr_multiplier
from telescope_algos._timeline import Label, Timeline

_RATIO_ALGORITHMS = ("cispo", "gspo", "sapo")


def loss_options(config: object) -> LossOptions:
    """Every :class:`LossOptions` field, read from the ``config`` attribute of the same name."""
    names = [f.name for f in fields(LossOptions)]
    missing = [n for n in names if not hasattr(config, n)]
    if missing:
        raise ValueError(
            f"the config lacks loss fields {missing}: telescope-config and telescope-algos disagree"
        )
    return LossOptions(**{n: getattr(config, n) for n in names})


class ScheduleConfig(Protocol):
    """The config fields of the learning-rate schedule (``TelescopeConfig`` has them)."""

    @property
    def lr_scheduler(self) -> str: ...
    @property
    def warmup_steps(self) -> int: ...
    @property
    def number_of_steps(self) -> int: ...
    @property
    def min_lr_ratio(self) -> float: ...


class RatioConfig(Protocol):
    """The config fields that decide whether a step needs π_old (``TelescopeConfig`` has them)."""

    @property
    def use_ppo_clip(self) -> bool: ...
    @property
    def algorithm(self) -> str: ...
    @property
    def ppo_clip_ref_logprobs(self) -> str: ...


def lr_schedule(config: ScheduleConfig) -> Callable[[int], float]:
    """``step → lr_multiplier(step)`` for the config's ``lr_scheduler``, ``warmup_steps``,
    ``number_of_steps`` and ``min_lr_ratio``; a bad combination fails here, with its message."""
    multiplier = functools.partial(
        lr_multiplier,
        schedule=config.lr_scheduler,
        warmup_steps=config.warmup_steps,
        total_steps=config.number_of_steps,
        min_lr_ratio=config.min_lr_ratio,
    )
    multiplier(0)
    return multiplier


def needs_old_logprobs(config: RatioConfig) -> bool:
    """True when the step starts with a no-grad pass for π_old (``ppo_clip_ref_logprobs: batch``)."""
    wants_ratio = bool(config.use_ppo_clip) or config.algorithm in _RATIO_ALGORITHMS
    return config.ppo_clip_ref_logprobs == "batch" and wants_ratio


OBJECTIVES = ("rl", "sft")
"""What a train step optimises: the run's RL loss, or a supervised step (docs/algorithms.md#sft)."""
SFT_OPTIONS = LossOptions()
"""A supervised step's loss: REINFORCE with every trained token's advantage 1 and no modifier,
``−Σ ℓ_t / N`` over the trained tokens, the token-mean negative log-likelihood."""


@dataclass(frozen=True)
class StepPlan:
    """What a train step's objective changes: its loss options, whether it starts with a pass for
    π_old, how many optimizer updates it takes, whether it is supervised (no rollout, teacher or
    reference logprobs: :func:`micro_batch_loss` leaves them out), and the temperature of its
    logprobs (the sampling temperature for RL; 1 for SFT: the model's own likelihood)."""

    options: LossOptions
    needs_old: bool
    minibatches: int
    sft: bool
    temperature: float

    @classmethod
    def of(cls, objective: str, config: Any, options: LossOptions) -> StepPlan:
        """The plan of ``objective`` (:data:`OBJECTIVES`) for a run ``config`` whose loss is ``options``."""
        if objective == "rl":
            minibatches = int(config.number_of_minibatches)
            return cls(
                options, needs_old_logprobs(config), minibatches, sft=False, temperature=config.temperature
            )
        if objective == "sft":
            return cls(SFT_OPTIONS, needs_old=False, minibatches=1, sft=True, temperature=1.0)
        raise ValueError(f"unknown objective {objective!r}; known: {', '.join(OBJECTIVES)}")


FROZEN_MODELS = {"teacher": "teacher_logprobs", "ref": "ref_logprobs"}
"""The frozen models a trainer may hold beside the policy (``create_trainer(..., frozen_models=)``), and
the :class:`MicroBatch` field each one's logprobs fill: the teacher of on-policy distillation, the
reference model of the reference KL (docs/algorithms.md#frozen-models)."""
FROZEN_TOKEN_FIELDS = {"teacher": "teacher_logprob", "ref": "ref_logprob"}
"""The ``step_tokens`` field of each frozen model's logprobs (a trainer that holds it records them)."""
FROZEN_TEMPERATURE = 1.0
"""A frozen model's logprobs are those of its raw distribution, as its vLLM servers give them."""


def frozen_models(given: Mapping[str, str] | None) -> dict[str, str]:
    """``given`` (``{name: local folder}``) checked against :data:`FROZEN_MODELS`, in its order; a
    ValueError names an unknown one."""
    out = dict(given or {})
    if unknown := sorted(set(out) - set(FROZEN_MODELS)):
        raise ValueError(f"unknown frozen models {unknown}; a trainer holds {', '.join(FROZEN_MODELS)}")
    return out


def with_frozen_logprobs(mb: MicroBatch, name: str, logprobs: torch.Tensor) -> MicroBatch:
    """``mb`` with frozen model ``name``'s logprobs of its tokens (``[1, L]``, aligned with
    ``input_ids``) in the field :data:`FROZEN_MODELS` names, as float32 without a gradient."""
    return replace(mb, **{FROZEN_MODELS[name]: logprobs.detach().float()})


def check_micro_batches(micro_batches: Sequence[MicroBatch]) -> None:
    """A train step needs at least one micro-batch (a ValueError that says where they come from)."""
    if not micro_batches:
        raise ValueError(
            "train_step got no micro-batches; pack at least one sample (pack_samples returns empty "
            "lists only for an empty step)"
        )


def minibatch_groups(count: int, number_of_minibatches: int) -> list[list[int]]:
    """Indices of ``count`` micro-batches dealt round-robin (``i mod n``) into at most n non-empty groups."""
    if number_of_minibatches < 1:
        raise ValueError(f"number_of_minibatches must be >= 1, got {number_of_minibatches}")
    groups = [list(range(g, count, number_of_minibatches)) for g in range(number_of_minibatches)]
    return [g for g in groups if g]


def row_multiple(*, context_parallel: int = 1, tensor_parallel: int = 1) -> int:
    """The length every packed row must be a multiple of for a parallel layout.

    Tensor parallelism (with sequence parallel) splits a row over ``tp`` ranks; context parallelism
    over ``cp`` ranks splits it into ``2·cp`` equal chunks (two per rank, zig-zag), each of which is
    split over TP again: ``tp`` for ``cp = 1``, else ``cp · lcm(2, tp)``.
    """
    if context_parallel < 1 or tensor_parallel < 1:
        raise ValueError(f"parallel sizes must be >= 1, got cp={context_parallel}, tp={tensor_parallel}")
    if context_parallel == 1:
        return tensor_parallel
    return context_parallel * math.lcm(2, tensor_parallel)


def pad_multiple(pad_to_multiple_of: int, trainer_multiple: int) -> int:
    """The multiple the loop pads rows to: of the config's ``pad_to_multiple_of`` and the trainer's."""
    return math.lcm(int(pad_to_multiple_of), int(trainer_multiple))


@dataclass(frozen=True)
class StepCounts:
    """Step-wide totals over all ranks, per minibatch group."""

    tokens: list[int]
    samples: list[int]


def step_counts(
    micro_batches: Sequence[MicroBatch],
    groups: list[list[int]],
    *,
    device: torch.device | str = "cpu",
    group: Any = None,
    copies: int = 1,
) -> StepCounts:
    """Loss tokens and samples per minibatch group, summed over the ranks of ``group`` (one all-gather).

    ``groups`` are :func:`minibatch_groups` of ``micro_batches``. Every rank of ``group`` (default:
    the whole world; Megatron passes its data-parallel group) must hold as many micro-batches (else a
    ValueError on every rank). ``copies``: consecutive ranks that hold the same micro-batches (the
    context-parallel ranks of an FSDP replica); they must agree, and count once. These totals are
    the ``num_tokens`` and ``num_samples`` of :class:`LossInputs`, so each update is the group's
    exact mean (docs/algorithms.md#normalisation).
    """
    local = [len(micro_batches)]
    local += [sum(micro_batches[i].num_tokens for i in g) for g in groups]
    local += [sum(micro_batches[i].num_samples for i in g) for g in groups]
    t = torch.tensor(local, dtype=torch.int64, device=device)
    world = dist.get_world_size(group)
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t, group=group)  # pyright: ignore[reportUnknownMemberType]
    table = torch.stack(parts).cpu()
    _check_same_micro_batches(table, world, copies)
    n = len(groups)
    totals = [int(v) for v in table.sum(dim=0) // copies]
    return StepCounts(tokens=totals[1 : 1 + n], samples=totals[1 + n : 1 + 2 * n])


def _check_same_micro_batches(table: torch.Tensor, world: int, copies: int) -> None:
    counts = [int(v) for v in table[:, 0]]
    if len(set(counts)) != 1:
        raise ValueError(
            f"ranks hold different numbers of micro-batches {counts}; every rank must get "
            "pack_samples(..., num_ranks=dp_world_size)[dp_rank] of the same step"
        )
    for first in range(0, world, copies):
        peers = table[first : first + copies]
        if not bool((peers == peers[0]).all()):
            raise ValueError(
                f"the context-parallel ranks {first}..{first + copies - 1} hold different micro-batches; "
                "every rank of a replica must get pack_samples(..., num_ranks=dp_world_size)[dp_rank]"
            )


def micro_batch_loss(
    mb: MicroBatch,
    logprobs: torch.Tensor,
    entropy: torch.Tensor,
    *,
    old_logprobs: torch.Tensor | None,
    counts: StepCounts,
    group: int,
    max_len: int,
    options: LossOptions,
    sft: bool = False,
    trace: TokenTrace | None = None,
    index: int = 0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``compute_loss`` of one packed micro-batch of minibatch group ``group`` (its tensors are moved to
    the device of ``logprobs``): the denominators are the group's totals over the ranks (``counts``)
    and ``max_len`` (the generation budget). The entropy keeps its gradient only for a bonus. ``sft``:
    a supervised step's micro-batch (:class:`StepPlan`), whose other logprobs are left out. ``trace``:
    what the loss did with each token goes there, as the step's micro-batch ``index``."""
    dev = logprobs.device

    def other(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None or sft else t.to(dev)

    inputs = LossInputs(
        logprobs,
        advantages=mb.advantages.to(dev),
        loss_mask=mb.loss_mask.to(dev),
        rollout_logprobs=other(mb.rollout_logprobs),
        old_logprobs=None if sft else old_logprobs,
        teacher_logprobs=other(mb.teacher_logprobs),
        ref_logprobs=other(mb.ref_logprobs),
        entropy=entropy if options.entropy_coef > 0 else entropy.detach(),
        position_ids=mb.position_ids.to(dev),
        num_tokens=counts.tokens[group],
        num_samples=counts.samples[group],
        max_len=max_len,
    )
    if trace is not None:
        trace.add(index, loss_tokens(inputs, options))
    return compute_loss(inputs, options)


class TokenTrace:
    """What the loss did with each token of one train step's micro-batches (:func:`telescope_algos.
    loss_tokens`, :data:`~telescope_algos.TOKEN_FIELDS`), by micro-batch, each cut to the length it had
    when the step got it (a trainer pads rows to its ``row_multiple``). ``rows()`` gives them in the
    step's order, as float32 NumPy arrays: what ``TrainerBackend.step_tokens`` returns."""

    def __init__(self, lengths: Sequence[int]):
        self.lengths = list(lengths)
        self._rows: dict[int, dict[str, np.ndarray]] = {}
        self._frozen: dict[int, dict[str, np.ndarray]] = {}

    def _arrays(self, index: int, tokens: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
        n = self.lengths[index]
        return {k: v.detach().reshape(-1)[:n].float().cpu().numpy() for k, v in tokens.items()}

    def add(self, index: int, tokens: dict[str, torch.Tensor]) -> None:
        """Micro-batch ``index``'s :func:`~telescope_algos.loss_tokens`."""
        self._rows[index] = self._arrays(index, tokens)

    def add_frozen(self, index: int, name: str, logprobs: torch.Tensor) -> None:
        """Frozen model ``name``'s logprobs of micro-batch ``index`` (:data:`FROZEN_TOKEN_FIELDS`)."""
        self._frozen.setdefault(index, {}).update(self._arrays(index, {FROZEN_TOKEN_FIELDS[name]: logprobs}))

    def rows(self) -> list[dict[str, np.ndarray] | None]:
        """Each micro-batch's arrays (None for one the step did not compute the loss of)."""
        out: list[dict[str, np.ndarray] | None] = []
        for i in range(len(self.lengths)):
            row = self._rows.get(i)
            out.append(None if row is None else {**row, **self._frozen.get(i, {})})
        return out


@dataclass
class StepLog:
    """What a train step records besides the loss metrics: one grad norm per optimizer update, the
    updates skipped for a non-finite norm, and timings (seconds, summed per name). With a
    ``timeline``, each :meth:`timed` block is also a span of it."""

    norms: list[float] = field(default_factory=list[float])
    skipped: int = 0
    timings: dict[str, float] = field(default_factory=dict[str, float])
    started: float = field(default_factory=time.perf_counter)
    timeline: Timeline | None = None

    @contextlib.contextmanager
    def timed(self, name: str, *, span: bool = True, **labels: Label) -> Generator[None]:
        """Add the time spent in the block to ``timing/<name>``; with a timeline (and ``span``), also
        record the block as the span ``name`` with ``labels``."""
        t0 = time.perf_counter()
        try:
            if span and self.timeline is not None:
                with self.timeline.span(name, **labels):
                    yield
            else:
                yield
        finally:
            key = f"timing/{name}"
            self.timings[key] = self.timings.get(key, 0.0) + time.perf_counter() - t0

    def update(self, norm: float, *, applied: bool) -> None:
        """Record one optimizer update's gradient norm, and whether it was applied."""
        self.norms.append(float(norm))
        self.skipped += not applied

    def metrics(self, *, learning_rate: float, skipped_total: int, device: torch.device) -> dict[str, float]:
        """``grad_norm`` (the mean over updates), ``learning_rate``, ``skipped_steps(_total)``, and
        ``memory/peak_allocated_gb`` on CUDA."""
        out = {
            "grad_norm": sum(self.norms) / len(self.norms) if self.norms else 0.0,
            "learning_rate": float(learning_rate),
            "skipped_steps": float(self.skipped),
            "skipped_steps_total": float(skipped_total),
        }
        if device.type == "cuda":
            out["memory/peak_allocated_gb"] = torch.cuda.max_memory_allocated(device) / 1024**3
        return out

    def timing_metrics(self) -> dict[str, float]:
        """The ``timing/*`` entries, with ``timing/step``: the time since this log was made."""
        return {**self.timings, "timing/step": time.perf_counter() - self.started}


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's generators (every rank, before the model is built)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # pyright: ignore[reportUnknownMemberType] (its parameter is unannotated)


def rng_state() -> dict[str, Any]:
    """The Python, NumPy, torch (and CUDA, when present) RNG states of this process."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` captured (CUDA's only where CUDA is present)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
