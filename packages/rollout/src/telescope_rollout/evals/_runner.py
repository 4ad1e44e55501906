"""In-training evals: run each eval's samples on inference servers and aggregate (docs/rollout.md,
"Evals and pass@k").

``EvalRunner(evals, tokenizer=..., client=..., settings=...)`` takes the config's ``evals``
entries (or :class:`EvalSpec`), builds each one from the environment registry (the dedicated
evals math500, aime_2024, aime_2025, gpqa_diamond are registered there too, so any environment
name works as an eval) and loads its first ``num_samples`` items. ``await runner.run(step=s)``
then, for every eval:

* renders each item through the chat template (like training prompts) and requests ``max(k)``
  completions of it (pass_k), each an ``n=1`` request, with the eval's temperature/top_p/max_tokens
  over the training ones;
* scores each completion with the environment's ``compute_eval_metrics`` (multi-turn
  environments play the whole episode, as in training);
* returns an :class:`EvalResult`: the mean of every metric over valid (error-free) completions,
  the mean over items of each pass@k/pass^k (see :mod:`._passk`), counts, and one row per completion.

Requests spread over the given servers (fewest eval requests in flight first, ties in turn) with at most
``concurrency_per_server`` in flight per server (default: the training lanes per server). All
evals of one call run concurrently. Nothing here knows about training steps beyond the number
written into the rows and the prefix-cache salt of every request: ``step`` names the weights the
servers hold (``telescope train`` evaluates step s on step s's weights, the engine's version s),
so eval requests share cached prompt blocks only with requests under the same weights.

Failures never raise out of ``run`` (cancellation does): a completion that fails is a row with
its ``error`` and is left out of the means; a server that cannot be reached
(``ServerUnavailableError``), or that lets ``HUNG_AFTER_TIMEOUTS`` (2) requests in a row time out
(``ServerTimeoutError``: it takes requests and never answers), gets no more requests in that call
(the rest go to the other servers, or are recorded as errors when none is left), and so does a
server its caller reports dead (:meth:`EvalRunner.server_lost`: restarted, it would hold newer
weights than the step evaluated); an eval that
raises or runs past ``timeout_s`` comes back as a failed :class:`EvalResult` (``error`` set, metrics
``{"failed": 1.0, "time_s": ...}``, no rows). ``timeout_s`` defaults to
``TIMEOUT_FACTOR`` (4) times the client's per-request ``timeout_s`` (4 x 1200 s = 80 min with the
CLI's client), or ``DEFAULT_TIMEOUT_S`` (4800 s) for a client without one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import structlog

from telescope_rollout._types import EvalMetricsResult, RewardResult, Sample
from telescope_rollout.engine._episode import Play, play_sample
from telescope_rollout.engine._prompts import PreparedPrompt, PromptSource
from telescope_rollout.engine._results import ScoredSample
from telescope_rollout.engine._settings import EngineSettings
from telescope_rollout.envs._env import Environment, environments_by_name, maybe_await
from telescope_rollout.envs._registry import get_environment
from telescope_rollout.evals._passk import PassKSpec, sample_pass_metrics, unit_metrics
from telescope_rollout.inference._client import CompletionClient, InferenceError, ServerTimeoutError

log = structlog.get_logger()

TIMEOUT_FACTOR = 4
"""An eval's overall time limit, in per-request client timeouts (see the module docstring)."""
DEFAULT_TIMEOUT_S = 4800.0
"""An eval's overall time limit when the client has no ``timeout_s``."""
HUNG_AFTER_TIMEOUTS = 2
"""Requests in a row that time out on one server before an eval call stops sending to it."""


@dataclass
class _ServerHealth:
    """The servers an eval call stopped sending to, and each server's timeouts in a row."""

    down: set[str] = field(default_factory=set[str])
    timeouts: dict[str, int] = field(default_factory=dict[str, int])

    def record(self, url: str, failure: InferenceError | None) -> str | None:
        """Count one finished request; return why ``url`` is now out (None: it stays in)."""
        if url in self.down:
            return None
        if isinstance(failure, ServerTimeoutError):
            self.timeouts[url] = self.timeouts.get(url, 0) + 1
            if self.timeouts[url] < HUNG_AFTER_TIMEOUTS:
                return None
            reason = f"{self.timeouts[url]} requests in a row got no answer in time"
        elif failure is not None:
            reason = "unreachable"
        else:
            self.timeouts[url] = 0
            return None
        self.down.add(url)
        return reason


@dataclass(frozen=True)
class EvalSpec:
    """One eval as the runner sees it (the config's ``EvalEntry`` fields)."""

    name: str
    eval_every: int = 10
    pass_k: PassKSpec = field(default_factory=PassKSpec)
    num_samples: int = -1
    separate_eval_samples: bool = False
    kwargs: Mapping[str, Any] = field(default_factory=dict[str, Any])
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None

    @classmethod
    def from_entry(cls, entry: Any) -> EvalSpec:
        """From an ``EvalEntry``, a dict with the same keys, or an ``EvalSpec``."""
        if isinstance(entry, EvalSpec):
            return entry

        def get(key: str, default: Any = None) -> Any:
            """A mapping's item or an object's attribute."""
            if isinstance(entry, Mapping):
                return cast(Mapping[str, Any], entry).get(key, default)
            return getattr(entry, key, default)

        name, num_samples = get("name"), get("num_samples", -1)
        if not isinstance(name, str) or not name:
            raise ValueError(f"eval entry without a name: {entry!r}")
        return cls(
            name=name,
            eval_every=int(get("eval_every", 10) or 10),
            pass_k=PassKSpec.parse(get("pass_k", None)),
            num_samples=int(num_samples) if num_samples is not None else -1,
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
    error: str = ""
    """Why the whole eval failed (raised, or ran past the runner's ``timeout_s``); "" when it ran."""
    samples: list[ScoredSample] = field(default_factory=list[ScoredSample])
    """The scored completion behind each row, in the rows' order (turns, tool calls, timings)."""

    @property
    def failed(self) -> bool:
        return bool(self.error)


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
        env: Any = self._env  # an eval environment: compute_eval_metrics is its own method
        r = await maybe_await(env.compute_eval_metrics(*args))
        if not isinstance(r, EvalMetricsResult):
            raise TypeError(f"compute_eval_metrics must return an EvalMetricsResult, got {type(r).__name__}")
        return r


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
        timeout_s: float | None = None,
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
        client_timeout = getattr(client, "timeout_s", None)
        default = TIMEOUT_FACTOR * float(client_timeout) if client_timeout else DEFAULT_TIMEOUT_S
        self.timeout_s = float(timeout_s) if timeout_s is not None else default
        if self.timeout_s <= 0:
            raise ValueError(f"EvalRunner: timeout_s must be > 0, got {timeout_s}")
        kwargs = dict(chat_template_kwargs or {})
        if not kwargs and settings.enable_thinking is not None:
            kwargs["enable_thinking"] = settings.enable_thinking
        self.environments: dict[str, Environment] = dict(environments or {})
        self.prompts = PromptSource(self.environments, None, tokenizer, chat_template_kwargs=kwargs)
        self.eos_token = settings.eos_token or getattr(tokenizer, "eos_token", None)
        self._in_flight: dict[str, int] = {}
        self._prepared: dict[str, list[PreparedPrompt]] = {}
        self._next_id = 0
        self._calls: list[_ServerHealth] = []
        """The server health of each :meth:`run` under way (:meth:`server_lost` marks them)."""
        self._warned: set[tuple[str, str]] = set()

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
            if env.kind == "agent":
                raise ValueError(
                    f"eval {spec.name!r} is an agent environment: agents are not evaluated yet "
                    '(docs/rollout.md, "Agents"); remove it from evals, or evaluate the task with a '
                    "single- or multi-turn environment"
                )
            if len(env) == 0:
                raise ValueError(f"eval {spec.name!r} loaded no samples; check its dataset and kwargs")
            if spec.num_samples > len(env):
                log.warning(
                    "eval dataset smaller than num_samples: evaluating all of it",
                    eval=spec.name,
                    asked=spec.num_samples,
                    available=len(env),
                )
            log.info(
                "eval ready", name=spec.name, samples=len(env), completions=spec.pass_k.completions_per_sample
            )

    def exclusions(self, training: Mapping[str, Environment] | Sequence[Any]) -> dict[str, list[int]]:
        """Training indices to hold out: ``{training entry name: indices}`` (``separate_eval_samples``).

        An eval holds out its items from every training environment of the same class and dataset
        (:func:`dataset_key`): the first ``len(eval)`` indices, the items the eval loaded. Matching
        by dataset, not by name, also catches a training entry renamed in the config.
        """
        envs = environments_by_name(training)
        held: dict[str, set[int]] = {}
        for spec in self.specs:
            if not spec.separate_eval_samples:
                continue
            ev = self.environments[spec.name]
            matched = [name for name, env in envs.items() if dataset_key(env) == dataset_key(ev)]
            if not matched:
                log.warning(
                    "separate_eval_samples has no effect: no training environment uses its dataset",
                    eval=spec.name,
                )
            for name in matched:
                held.setdefault(name, set()).update(range(min(len(ev), len(envs[name]))))
        return {name: sorted(indices) for name, indices in held.items()}

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
        health = _ServerHealth()  # servers found unreachable or hung in this call get no more requests
        runs = (self._run_guarded(spec, step, urls, slots, health) for spec in specs)
        self._calls.append(health)
        try:
            return list(await asyncio.gather(*runs))
        finally:
            self._calls.remove(health)

    def server_lost(self, url: str) -> None:
        """``url`` died (its supervisor restarts it): the calls under way send it nothing more, for
        once back it holds newer weights than the step they evaluate; later calls use it again."""
        for health in self._calls:
            if url.rstrip("/") not in health.down:
                health.down.add(url.rstrip("/"))
                log.warning("eval server lost: no more eval requests go to it in this run", server=url)

    async def _run_guarded(
        self, spec: EvalSpec, step: int, urls: list[str], slots: asyncio.Semaphore, health: _ServerHealth
    ) -> EvalResult:
        """:meth:`_run_one` within ``timeout_s``; an error or the timeout gives a failed result."""
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._run_one(spec, step, urls, slots, health)
        except TimeoutError:
            error = f"did not finish within {self.timeout_s:g} s (EvalRunner timeout_s)"
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        log.warning("eval failed", eval=spec.name, step=step, error=error)
        return EvalResult(spec.name, step, {"failed": 1.0, "time_s": time.monotonic() - t0}, [], None, error)

    def _prepared_prompts(self, spec: EvalSpec) -> list[PreparedPrompt]:
        if spec.name not in self._prepared:
            env = self.environments[spec.name]
            self._prepared[spec.name] = [
                self.prompts.prepare(env, spec.name, i, _tagged(env.get_sample(i), spec.name, i))
                for i in range(len(env))
            ]
        return self._prepared[spec.name]

    async def _run_one(
        self, spec: EvalSpec, step: int, urls: list[str], slots: asyncio.Semaphore, health: _ServerHealth
    ) -> EvalResult:
        t0 = time.monotonic()
        settings = spec.sampling(self.settings)
        prompts = self._prepared_prompts(spec)
        n = spec.pass_k.completions_per_sample
        tasks = [
            self._complete(spec, p, c, step=step, settings=settings, urls=urls, slots=slots, health=health)
            for p in prompts
            for c in range(n)
        ]
        outs: list[ScoredSample] = list(await asyncio.gather(*tasks))
        env = self.environments[spec.name]
        result = aggregate(spec, step, prompts, outs, n, success=getattr(env, "success_metrics", None))
        result.metrics["time_s"] = time.monotonic() - t0
        self._warn_unreported(spec, outs)
        return result

    def _warn_unreported(self, spec: EvalSpec, outs: Sequence[ScoredSample]) -> None:
        """Warn once per eval and metric about a pass_k metric the eval does not report."""
        reported = sorted({m for o in outs if not o.error for m in o.metrics})
        if not reported:
            return  # nothing valid to judge by
        named = (*(spec.pass_k.at_k_metrics or ()), *(spec.pass_k.pow_k_metrics or ()))
        for metric in dict.fromkeys(named):
            if metric not in reported and (spec.name, metric) not in self._warned:
                self._warned.add((spec.name, metric))
                log.warning(
                    "pass_k names a metric the eval does not report: no pass metrics for it",
                    eval=spec.name,
                    metric=metric,
                    reported=reported,
                )

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
        health: _ServerHealth,
    ) -> ScoredSample:
        async with slots:
            live = [u for u in urls if u not in health.down]
            k = self._next_id % max(len(live), 1)  # ties go round-robin
            url = min(live[k:] + live[:k], key=lambda u: self._in_flight[u]) if live else urls[0]
            out = ScoredSample(
                group_id=prompt.index,
                sample_id=self._next_id,
                env_name=spec.name,
                prompt_ids=prompt.ids,
                prompt_text=prompt.text,
                server=url,
            )
            self._next_id += 1
            out.lane = completion_index
            if not live:
                out.error = "rollout_error"
                out.error_detail = f"not sent: every eval server stopped answering ({sorted(health.down)})"
                return out
            env: Any = _EvalScoring(self.environments[spec.name])
            self._in_flight[url] += 1
            try:
                eos = self.eos_token or env.eos_token
                play = Play(  # the servers hold step's weights: its prefix-cache salt
                    self.client,
                    settings,
                    self.prompts,
                    eos,
                    request_prefix=f"eval-{spec.name}-s{step}",
                    weights=lambda: step,
                )
                failure = await play_sample(env, prompt, out, play)
            finally:
                self._in_flight[url] -= 1
            reason = health.record(url, failure)
            if reason is not None:
                log.warning(
                    "eval server unreachable: no more eval requests go to it in this run",
                    eval=spec.name,
                    server=url,
                    left=[u for u in urls if u not in health.down],
                    reason=reason,
                    error=str(failure)[:300],
                )
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


def _row(
    spec: EvalSpec, step: int, prompt: PreparedPrompt, index: int, o: ScoredSample, passed: dict[str, float]
) -> dict[str, Any]:
    """One completion of an eval as a row (``pass_json``: its item's pass metrics, unless it failed)."""
    return {
        "step": step,
        "eval": spec.name,
        "sample_index": prompt.index,
        "completion_index": index,
        "prompt": prompt.text,
        "answer": str(prompt.sample.answer),
        "completion": o.completion_text,
        "completion_tokens": o.num_model_tokens,
        "finish_reason": str(o.finish_reason or ""),
        "num_turns": o.num_turns,
        "server": o.server,
        "error": str(o.error or ""),
        "metrics_json": json.dumps(o.metrics),
        "pass_json": json.dumps(passed if not o.error else {}),
        "golden_answers_json": json.dumps(o.golden_answers, default=str),
        "tags_json": json.dumps(o.sample_tags, default=str),
    }


def aggregate(
    spec: EvalSpec,
    step: int,
    prompts: Sequence[PreparedPrompt],
    outs: Sequence[ScoredSample],
    per_sample: int,
    *,
    success: Sequence[str] | None = None,
) -> EvalResult:
    """Means over valid completions, pass metrics per item (then averaged), and the rows.

    ``outs`` holds ``per_sample`` completions per prompt, prompt by prompt. ``success``: the
    metrics pass_k uses when it names none; default: the metrics that lie in [0, 1] in every valid
    completion of the eval (:func:`~telescope_rollout.evals._passk.unit_metrics`).
    """
    if success is None:
        success = unit_metrics([o.metrics for o in outs if not o.error])
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
        passed = sample_pass_metrics(spec.pass_k, [o.metrics for o in valid], success)
        for k, v in passed.items():
            pass_sums[k] = pass_sums.get(k, 0.0) + v
            pass_counts[k] = pass_counts.get(k, 0) + 1
        rows += [_row(spec, step, prompt, c_i, o, passed) for c_i, o in enumerate(group)]
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
    return EvalResult(spec.name, step, metrics, rows, main_metric(sums), samples=list(outs[:n_all]))
