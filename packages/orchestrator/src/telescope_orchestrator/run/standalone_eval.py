"""``telescope eval``: evaluate checkpoints after (or beside) training, into the run's record.

Each checkpoint (a ``step_N`` folder with ``meta.json`` of either backend, a folder of them such
as ``runs/<name>/checkpoints``, or a Hugging Face folder with ``config.json``) is converted to a
Hugging Face folder when needed (``convert_checkpoint`` of its backend, into a temporary folder
deleted afterwards), served, and evaluated with the config's ``evals`` (the same runner, sampling
and pass@k as in-training evals). One vLLM server serves them in turn: it starts on the first, and
each later checkpoint of the same architecture (``config.json``) is loaded into it in place
(``telescope_weightsync.load_folder``); another architecture, or a load that fails, gets a server
of its own. Results go where a run's
evals go: ``eval_samples`` (with turns, tool calls, rollout events) of the record, tagged with
this attempt so an in-training eval of the same step is kept, and one ``metrics.jsonl`` line per
checkpoint with ``eval/step`` and ``eval/standalone: 1``. The run directory is ``--run-dir``, else
the run the checkpoints belong to (the parent of their ``checkpoints`` folder). W&B is not used.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import structlog

from telescope_orchestrator.record.rundir import RunDir

if TYPE_CHECKING:
    from telescope_config import ResolvedConfig, TelescopeConfig
    from telescope_orchestrator.cluster.vllm_server import ServerHandle
    from telescope_orchestrator.run.report import Reporter

__all__ = [
    "Checkpoint",
    "EvalError",
    "EvalResult",
    "evaluate",
    "find_checkpoints",
    "run_dir_of",
    "standalone_eval",
]

log = structlog.get_logger()

_STEP = re.compile(r"step_(\d+)$")


class EvalError(ValueError):
    """The checkpoints or the config cannot be evaluated as asked; the message says how to fix it."""


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint to evaluate: its folder, its step and its kind."""

    path: Path
    step: int
    native: bool
    """True for a Telescope checkpoint (``meta.json``), False for a Hugging Face folder."""


def _one(path: Path) -> Checkpoint | None:
    match = _STEP.search(path.name)
    if (path / "meta.json").is_file():
        meta = json.loads((path / "meta.json").read_text())
        return Checkpoint(path, int(meta.get("step", match.group(1) if match else 0)), True)
    if (path / "config.json").is_file():
        return Checkpoint(path, int(match.group(1)) if match else 0, False)
    return None


def find_checkpoints(paths: Sequence[str | os.PathLike[str]]) -> list[Checkpoint]:
    """Every checkpoint named or held (one level down) by ``paths``, by step."""
    found: list[Checkpoint] = []
    for text in paths:
        path = Path(text).expanduser()
        if not path.is_dir():
            raise EvalError(
                f"{path} is not a folder: pass checkpoints (…/checkpoints/step_N) or their folder"
            )
        one = _one(path)
        inside = (
            [c for c in (_one(p) for p in sorted(path.iterdir()) if p.is_dir()) if c]
            if one is None
            else [one]
        )
        if not inside:
            raise EvalError(
                f"{path} holds no checkpoint: a checkpoint has meta.json (telescope train) or config.json "
                "(a Hugging Face folder)"
            )
        found += inside
    return sorted(found, key=lambda c: c.step)


def run_dir_of(checkpoints: list[Checkpoint], explicit: str | os.PathLike[str] | None) -> Path:
    """``explicit`` (``--run-dir``), else the run of the checkpoints (``<run>/checkpoints/step_N``)."""
    if explicit:
        return Path(explicit).expanduser()
    parents = {c.path.parent.parent for c in checkpoints if c.path.parent.name == "checkpoints"}
    if len(parents) == 1 and (next(iter(parents)) / "config.yaml").is_file():
        return next(iter(parents))
    raise EvalError("cannot tell which run these checkpoints belong to: pass --run-dir DIR for the results")


def _hf_folder(ckpt: Checkpoint, scratch: Path) -> Path:
    if not ckpt.native:
        return ckpt.path
    from telescope_orchestrator.run.checkpoints import CheckpointError, convert_checkpoint

    try:  # a LoRA run's checkpoint is served merged
        return convert_checkpoint(ckpt.path, scratch / f"step_{ckpt.step}", merge=True).path
    except CheckpointError as err:
        raise EvalError(str(err)) from None


async def _evaluate(
    cfg: TelescopeConfig, run: RunDir, console: Reporter, model: Path, step: int, url: str
) -> dict[str, float]:
    from telescope_orchestrator.run.evals import run_scheduled_evals
    from telescope_orchestrator.run.wiring import tokenizer_dir
    from telescope_rollout import EngineSettings, EvalRunner, InferenceClient, Tokenizer

    tokenizer = Tokenizer.from_pretrained(tokenizer_dir(str(model)), chat_template=cfg.chat_template)
    client = InferenceClient([url], timeout_s=1200.0)
    runner = EvalRunner(
        cfg.evals, tokenizer=tokenizer, client=client, settings=EngineSettings.from_config(cfg)
    )
    runner.load()
    names = [spec.name for spec in runner.specs]
    async with client:
        return await run_scheduled_evals(runner, run, console, step=step, names=names, servers=[url])


def _serve(cfg: TelescopeConfig, model: Path, run: RunDir, step: int) -> ServerHandle:
    from telescope_orchestrator.cluster.ray_cluster import has_cuda
    from telescope_orchestrator.cluster.vllm_server import ServerSettings, free_port_run, launch_server
    from telescope_orchestrator.run.startup import WEIGHTSYNC_EXTENSION

    device = "cuda" if has_cuda() else "cpu"
    settings = ServerSettings.from_config(  # a LoRA run's checkpoint is served merged: no adapter here
        cfg, model=str(model), device=device, seed=cfg.seed, host="127.0.0.1", lora_rank=0
    )
    log_path = run.path / "logs" / "inference" / f"eval_step_{step}.log"
    # its own port: beside a training run too; the receiver loads the later checkpoints
    port = free_port_run(span=1)
    handle = launch_server(settings, port=port, log_path=log_path, extension_cls=WEIGHTSYNC_EXTENSION)
    try:
        handle.wait_healthy(float(cfg.ray_placement_timeout_s))
    except BaseException:
        handle.stop()
        raise
    return handle


_NOT_ARCHITECTURE = frozenset({"_name_or_path", "transformers_version", "torch_dtype", "dtype"})
"""``config.json`` keys two checkpoints of one model may differ in."""


def _architecture(model: Path) -> dict[str, Any]:
    """What of ``model``'s ``config.json`` a server started on it is bound to."""
    try:
        config: object = json.loads((model / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise EvalError(f"{model}/config.json cannot be read: {err}") from None
    if not isinstance(config, dict):
        raise EvalError(f"{model}/config.json is not a JSON object")
    return {str(k): v for k, v in cast(dict[Any, Any], config).items() if k not in _NOT_ARCHITECTURE}


@dataclass
class _Serving:
    """The server of ``telescope eval`` and the architecture it serves; ``serve`` has it serve the
    next checkpoint, loaded in place when it can be (module docstring)."""

    cfg: TelescopeConfig
    run: RunDir
    handle: ServerHandle | None = None
    architecture: dict[str, Any] | None = None

    def serve(self, model: Path, step: int) -> str:
        """The URL of a server holding ``model`` as version ``step``."""
        from telescope_weightsync import WeightSyncError, load_folder

        architecture = _architecture(model)
        if self.handle is not None and architecture == self.architecture:
            try:
                seconds = load_folder(self.handle.url, str(model), version=step)
            except WeightSyncError as err:
                log.warning("eval.load_failed", step=step, error=str(err), then="a server of its own")
            else:
                log.info("eval.loaded", step=step, seconds=round(seconds, 2), url=self.handle.url)
                return self.handle.url
        self.stop()
        self.handle = _serve(self.cfg, model, self.run, step)
        self.architecture = architecture
        return self.handle.url

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.stop()
            self.handle = None


def standalone_eval(
    cfg: TelescopeConfig, checkpoints: list[Checkpoint], run: RunDir, console: Reporter
) -> list[dict[str, float]]:
    """Evaluate each checkpoint (see the module docstring); returns each one's metrics line."""
    if not cfg.evals:
        raise EvalError("the config lists no evals: add `evals` to it or pass --evals '[{\"name\": ...}]'")
    records = run.records
    records.open(None)
    records.eval_tag = f"a{records.attempt:03d}"
    lines: list[dict[str, float]] = []
    scratch = Path(tempfile.mkdtemp(prefix="telescope-eval-"))
    serving = _Serving(cfg, run)
    try:
        for ckpt in checkpoints:
            with console.phase(f"step {ckpt.step}: convert and serve {ckpt.path}"):
                model = _hf_folder(ckpt, scratch)
                url = serving.serve(model, ckpt.step)
            try:
                metrics = asyncio.run(_evaluate(cfg, run, console, model, ckpt.step, url))
            finally:
                if ckpt.native:
                    shutil.rmtree(model, ignore_errors=True)
            line = {"step": ckpt.step, **metrics, "eval/step": ckpt.step, "eval/standalone": 1}
            run.append_metrics(line)
            lines.append(line)
    finally:
        serving.stop()
        shutil.rmtree(scratch, ignore_errors=True)
        records.close()
    return lines


@dataclass(frozen=True)
class EvalResult:
    """What ``evaluate`` hands back."""

    run_dir: Path
    """The run directory the results went to (``records/``, ``metrics.jsonl``)."""
    metrics: list[dict[str, float]]
    """One ``metrics.jsonl`` line per checkpoint, by step."""


def evaluate(
    checkpoints: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    config: TelescopeConfig | ResolvedConfig | Mapping[str, Any] | str | os.PathLike[str] | None = None,
    *,
    overrides: Sequence[str] = (),
    run_dir: str | os.PathLike[str] | None = None,
    default_config: str | os.PathLike[str] | None = None,
    reporter: Reporter | None = None,
) -> EvalResult:
    """Evaluate checkpoints into their run's record (module docstring), what ``telescope eval`` runs.

    ``checkpoints``: ``step_N`` folders, folders of them, or Hugging Face folders (one path or a
    list); ``config`` (as
    for ``train``), else the ``config.yaml`` of the run they belong to, else ``default_config``;
    ``overrides``: command-line style flags on top (e.g. ``["--evals", '[{"name": "gsm8k"}]']``);
    ``run_dir``: where the results go (default: the checkpoints' run). Errors: ``EvalError`` (the
    checkpoints, or a config without evals), ``ConfigError``, ``ServerStartError`` (the vLLM
    server), ``RecordError``. SIGTERM stops it like Ctrl-C, its server included.
    """
    from telescope_orchestrator.run.api import resolve_config
    from telescope_orchestrator.run.report import SilentReporter
    from telescope_orchestrator.run.startup import sigterm_as_interrupt

    if isinstance(checkpoints, str | os.PathLike):  # one path, not its characters
        checkpoints = [checkpoints]
    found = find_checkpoints(checkpoints)
    target = run_dir_of(found, run_dir)
    if config is None:
        own = target / "config.yaml"
        config = own if own.is_file() else default_config
    if config is None:
        raise EvalError(f"{target} has no config.yaml: pass the run's config (--config FILE)")
    resolved = resolve_config(config, overrides)
    shown = reporter if reporter is not None else SilentReporter()
    shown.info(f"{len(found)} checkpoint(s) -> {target}")
    with sigterm_as_interrupt():
        lines = standalone_eval(resolved.config, found, RunDir(target), shown)
    return EvalResult(target, lines)
