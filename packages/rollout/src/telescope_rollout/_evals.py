"""In-training evals (spec §6.1): run each eval's samples on inference servers and aggregate.

``EvalRunner(evals, tokenizer=..., client=..., settings=...)`` takes the config's ``evals``
entries (or :class:`EvalSpec`), builds each one from the environment registry (the dedicated
evals math500, aime_2024, aime_2025, gpqa_diamond are registered there too, so any environment
name works as an eval) and loads its first ``num_samples`` items. ``await runner.run(step=s)``
then, for every eval:

* renders each item through the chat template (like training prompts; the original sent the
  standalone evals' prompts raw) and requests ``max(k)`` completions of it (pass_k), each an
  ``n=1`` request, with the eval's temperature/top_p/max_tokens over the training ones;
* scores each completion with the environment's ``compute_eval_metrics`` (multi-turn
  environments play the whole episode, as in training);
* returns an :class:`EvalResult`: the mean of every metric over valid (error-free) completions,
  the mean over items of each pass@k/pass^k (see ``_passk``), counts, and one row per completion.

Requests spread over the given servers (fewest eval requests in flight first, ties in turn) with at most
``concurrency_per_server`` in flight per server (default: the training lanes per server). All
evals of one call run concurrently. Nothing here knows about training steps beyond the number
written into the rows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from telescope_rollout._client import ServerUnavailableError
from telescope_rollout._env import Environment, maybe_await
from telescope_rollout._passk import PassKSpec, sample_pass_metrics
from telescope_rollout._prompts import PreparedPrompt, PromptSource
from telescope_rollout._registry import get_environment
from telescope_rollout._results import ScoredSample
from telescope_rollout._rollout import CompletionClient, SampleError, run_multi_turn, run_single_turn
from telescope_rollout._settings import EngineSettings
from telescope_rollout._types import EvalMetricsResult, RewardResult, Sample

log = structlog.get_logger()


@dataclass(frozen=True)
class EvalSpec:
    """One eval as the runner sees it (the config's ``EvalEntry`` fields)."""

    name: str
    eval_every: int = 10
    pass_k: PassKSpec = field(default_factory=PassKSpec)
    num_samples: int = -1
    separate_eval_samples: bool = False
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None

    @classmethod
    def from_entry(cls, entry: Any) -> EvalSpec:
        """From an ``EvalEntry``, a dict with the same keys, or an ``EvalSpec``."""
        if isinstance(entry, EvalSpec):
            return entry
        get = entry.get if isinstance(entry, Mapping) else lambda k, d=None: getattr(entry, k, d)
        name = get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"eval entry without a name: {entry!r}")
        return cls(
            name=name,
            eval_every=int(get("eval_every", 10) or 10),
            pass_k=PassKSpec.parse(get("pass_k", None)),
            num_samples=int(get("num_samples", -1) if get("num_samples", -1) is not None else -1),
            separate_eval_samples=bool(get("separate_eval_samples", False)),
            kwargs=dict(get("kwargs", None) or {}),
            temperature=get("temperature", None),
            top_p=get("top_p", None),
            max_tokens=get("max_tokens", None),
        )

    def sampling(self, base: EngineSettings) -> EngineSettings:
        """The training settings with this eval's temperature/top_p/max_tokens laid over them."""
        overrides = {k: getattr(self, k) for k in ("temperature", "top_p", "max_tokens")}
        return dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})


@dataclass
class EvalResult:
    """One eval at one step: aggregate ``metrics`` and one row per completion."""

    name: str
    step: int
    metrics: dict[str, float]
    rows: list[dict[str, Any]]
    main_metric: str | None = None
    """``correct`` when reported, else the first metric by name (for the console line)."""


ROW_COLUMNS = (
    "step", "eval", "sample_index", "completion_index", "prompt", "answer", "completion",
    "completion_tokens", "finish_reason", "num_turns", "server", "error", "metrics_json",
    "pass_json", "golden_answers_json", "tags_json",
)  # fmt: skip
"""Columns of :attr:`EvalResult.rows` (metrics as JSON: their names differ per eval)."""


class _EvalScoring:
    """The environment seen through ``compute_eval_metrics``: the rollout functions call
    ``score`` and get the eval metrics back as a RewardResult (total reward unused)."""

    def __init__(self, env: Environment):
        self._env = env

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    async def score(self, *args: Any) -> RewardResult:
        r = await maybe_await(self._env.compute_eval_metrics(*args))  # type: ignore[attr-defined]
        if not isinstance(r, EvalMetricsResult):
            raise TypeError(f"compute_eval_metrics must return an EvalMetricsResult, got {type(r).__name__}")
        return RewardResult(
            0.0, dict(r.metrics), dict(r.golden_answers), list(r.info_turns), dict(r.sample_tags)
        )


def dataset_key(env: Environment) -> tuple[Any, ...]:
    """What identifies an environment's dataset: its class and dataset/subset/split attributes."""
    return (
        type(env),
        getattr(env, "dataset", None),
        getattr(env, "subset", None),
        getattr(env, "split", None),
    )


class EvalRunner:
    """Runs evals on inference servers; see the module docstring.

    ``environments`` (name -> loaded environment) skips the registry, e.g. for tests;
    ``chat_template_kwargs`` reach the template (``enable_thinking``), as in training.
    """

    def __init__(
        self,
        evals: Iterable[Any],
        *,
        tokenizer: Any,
        client: CompletionClient,
        settings: EngineSettings,
        environments: Mapping[str, Environment] | None = None,
        concurrency_per_server: int | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ):
        self.specs = [EvalSpec.from_entry(e) for e in evals]
        names = [s.name for s in self.specs]
        if len(set(names)) != len(names):
            raise ValueError(f"evals {names} list a name twice; each eval needs a distinct name")
        self.tokenizer = tokenizer
        self.client = client
        self.settings = settings
        self.concurrency = concurrency_per_server or settings.lanes_per_server
        if self.concurrency < 1:
            raise ValueError("EvalRunner: concurrency_per_server must be >= 1")
        kwargs = dict(chat_template_kwargs or {})
        if not kwargs and settings.enable_thinking is not None:
            kwargs["enable_thinking"] = settings.enable_thinking
        self.environments: dict[str, Environment] = dict(environments or {})
        self.prompts = PromptSource(self.environments, None, tokenizer, chat_template_kwargs=kwargs)
        self.eos_token = settings.eos_token or getattr(tokenizer, "eos_token", None)
        self._in_flight: dict[str, int] = {}
        self._prepared: dict[str, list[PreparedPrompt]] = {}
        self._next_id = 0

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    def spec(self, name: str) -> EvalSpec:
        for s in self.specs:
            if s.name == name:
                return s
        raise KeyError(f"no eval named {name!r}; configured: {self.names}")

    def load(self) -> None:
        """Build every eval's environment (unless given) and load its first ``num_samples`` items."""
        for spec in self.specs:
            if spec.name not in self.environments:
                env = get_environment(spec.name, **dict(spec.kwargs))
                env.load_dataset(spec.num_samples)
                self.environments[spec.name] = env
            env = self.environments[spec.name]
            if len(env) == 0:
                raise ValueError(f"eval {spec.name!r} loaded no samples; check its dataset and kwargs")
            log.info(
                "eval ready", name=spec.name, samples=len(env), completions=spec.pass_k.completions_per_sample
            )

    def exclusions(self, training: Mapping[str, Environment] | Sequence[Any]) -> dict[str, list[int]]:
        """Training indices to hold out: ``{training entry name: indices}`` (``separate_eval_samples``).

        An eval holds out its items from every training environment of the same class and dataset
        (:func:`dataset_key`): the first ``len(eval)`` indices, the items the eval loaded. The
        original matched the eval's name against ``env.name`` and missed renamed environments.
        """
        envs = dict(training) if isinstance(training, Mapping) else {b.name: b.env for b in training}
        out: dict[str, list[int]] = {}
        for spec in self.specs:
            if not spec.separate_eval_samples:
                continue
            ev = self.environments[spec.name]
            matched = [name for name, env in envs.items() if dataset_key(env) == dataset_key(ev)]
            if not matched:
                log.warning("separate_eval_samples has no effect: no training environment uses its dataset",
                            eval=spec.name)  # fmt: skip
            for name in matched:
                held = out.setdefault(name, [])
                held.extend(i for i in range(min(len(ev), len(envs[name]))) if i not in held)
        return out

    # ------------------------------------------------------------------------------------------ run
    async def run(
        self, *, step: int, names: Iterable[str] | None = None, servers: Sequence[str] | None = None
    ) -> list[EvalResult]:
        """Run the named evals (default: all) concurrently on ``servers`` (default: the client's)."""
        urls = [u.rstrip("/") for u in (servers or self.client.server_urls)]
        if not urls:
            raise ValueError("EvalRunner.run needs at least one server")
        specs = [self.spec(n) for n in names] if names is not None else list(self.specs)
        missing = [s.name for s in specs if s.name not in self.environments]
        if missing:
            raise RuntimeError(f"evals {missing} are not loaded: call EvalRunner.load() before run()")
        slots = asyncio.Semaphore(self.concurrency * len(urls))
        for u in urls:
            self._in_flight.setdefault(u, 0)
        return list(await asyncio.gather(*(self._run_one(spec, step, urls, slots) for spec in specs)))

    def _prepared_prompts(self, spec: EvalSpec) -> list[PreparedPrompt]:
        if spec.name not in self._prepared:
            env = self.environments[spec.name]
            self._prepared[spec.name] = [
                self.prompts.prepare(env, spec.name, i, _tagged(env.get_sample(i), spec.name, i))
                for i in range(len(env))
            ]
        return self._prepared[spec.name]

    async def _run_one(
        self, spec: EvalSpec, step: int, urls: list[str], slots: asyncio.Semaphore
    ) -> EvalResult:
        t0 = time.monotonic()
        settings = spec.sampling(self.settings)
        prompts = self._prepared_prompts(spec)
        n = spec.pass_k.completions_per_sample
        tasks = [
            self._complete(spec, p, c, step=step, settings=settings, urls=urls, slots=slots)
            for p in prompts
            for c in range(n)
        ]
        outs: list[ScoredSample] = list(await asyncio.gather(*tasks))
        result = aggregate(spec, step, prompts, outs, n)
        result.metrics["time_s"] = time.monotonic() - t0
        return result

    async def _complete(
        self,
        spec: EvalSpec,
        prompt: PreparedPrompt,
        completion_index: int,
        *,
        step: int,
        settings: EngineSettings,
        urls: list[str],
        slots: asyncio.Semaphore,
    ) -> ScoredSample:
        async with slots:
            k = self._next_id % len(urls)  # ties go round-robin
            url = min(urls[k:] + urls[:k], key=lambda u: self._in_flight[u])
            self._in_flight[url] += 1
            out = ScoredSample(group_id=prompt.index, sample_id=self._next_id, env_name=spec.name,
                               prompt_ids=prompt.ids, prompt_text=prompt.text, server=url)  # fmt: skip
            self._next_id += 1
            out.lane = completion_index
            env: Any = _EvalScoring(self.environments[spec.name])
            eos = self.eos_token or env.eos_token
            common = dict(client=self.client, settings=settings, eos_token=eos, on_generated=lambda: None,
                          request_prefix=f"eval-{spec.name}-s{step}")  # fmt: skip
            try:
                if env.is_multi_turn:
                    await run_multi_turn(env, prompt, out, prompts=self.prompts, **common)
                else:
                    await run_single_turn(env, prompt, out, **common)
            except SampleError as exc:
                out.error, out.error_detail = exc.kind, exc.detail
            except ServerUnavailableError as exc:
                out.error, out.error_detail = "rollout_error", str(exc)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                out.error, out.error_detail = "rollout_error", f"{type(exc).__name__}: {exc}"
            finally:
                self._in_flight[url] -= 1
            if out.error:
                log.warning(
                    "eval completion failed", eval=spec.name, error=out.error, detail=out.error_detail[:300]
                )
            return out


def _tagged(sample: Sample, name: str, index: int) -> Sample:
    return Sample(sample.prompt, sample.answer, {**sample.metadata, "_env_name": name, "_index": index})


def main_metric(metrics: Iterable[str]) -> str | None:
    """``correct`` when present, else the first metric name in sorted order."""
    names = sorted(metrics)
    return "correct" if "correct" in names else (names[0] if names else None)


def aggregate(
    spec: EvalSpec,
    step: int,
    prompts: Sequence[PreparedPrompt],
    outs: Sequence[ScoredSample],
    per_sample: int,
) -> EvalResult:
    """Means over valid completions, pass metrics per item (then averaged), and the rows.

    ``outs`` holds ``per_sample`` completions per prompt, prompt by prompt.
    """
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    pass_sums: dict[str, float] = {}
    pass_counts: dict[str, int] = {}
    rows: list[dict[str, Any]] = []
    valid_total = 0
    tokens = 0
    truncated = 0
    for p_i, prompt in enumerate(prompts):
        group = list(outs[p_i * per_sample : (p_i + 1) * per_sample])
        valid = [o for o in group if not o.error]
        valid_total += len(valid)
        for o in valid:
            tokens += o.num_model_tokens
            truncated += int(o.is_truncated)
            for k, v in o.metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v)
                counts[k] = counts.get(k, 0) + 1
        passed = sample_pass_metrics(spec.pass_k, [o.metrics for o in valid])
        for k, v in passed.items():
            pass_sums[k] = pass_sums.get(k, 0.0) + v
            pass_counts[k] = pass_counts.get(k, 0) + 1
        for c_i, o in enumerate(group):
            rows.append({
                "step": step, "eval": spec.name, "sample_index": prompt.index, "completion_index": c_i,
                "prompt": prompt.text, "answer": str(prompt.sample.answer), "completion": o.completion_text,
                "completion_tokens": o.num_model_tokens, "finish_reason": str(o.finish_reason or ""),
                "num_turns": o.num_turns, "server": o.server, "error": str(o.error or ""),
                "metrics_json": json.dumps(o.metrics), "pass_json": json.dumps(passed if not o.error else {}),
                "golden_answers_json": json.dumps(o.golden_answers, default=str),
                "tags_json": json.dumps(o.sample_tags, default=str),
            })  # fmt: skip
    n_all = len(prompts) * per_sample
    metrics: dict[str, float] = {
        "samples": float(len(prompts)),
        "completions": float(n_all),
        "errors": float(n_all - valid_total),
        "completion_tokens_mean": tokens / valid_total if valid_total else float("nan"),
        "truncated_frac": truncated / valid_total if valid_total else float("nan"),
    }
    metrics.update({k: sums[k] / counts[k] for k in sorted(sums)})
    metrics.update({k: pass_sums[k] / pass_counts[k] for k in sorted(pass_sums)})
    return EvalResult(spec.name, step, metrics, rows, main_metric(sums))
