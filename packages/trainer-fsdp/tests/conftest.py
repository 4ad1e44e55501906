"""Fixtures of the FSDP trainer tests: configs, seeded samples, trainers that always close.

Every trainer here runs in the test process on one gloo rank (``create_trainer`` opens a
single-process group on a free port and closes it in ``close()``); the two-rank tests spawn their
own processes (test_two_ranks.py).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import telescope_config
from telescope_algos import TrainingSample
from telescope_config import testing as config_testing

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:  # the helper modules (fsdp_spawn) of the multi-rank tests
    sys.path.insert(0, _HERE)


def make_config(model_dir: Path | str, **overrides) -> telescope_config.TelescopeConfig:
    """A valid config on a tiny local model: 1 rank, fp32 throughout, no LR schedule, grad clip 1."""
    values = {
        "model": str(model_dir),
        "trainer_num_workers": 1,
        "mixed_precision_dtype": None,
        "learning_rate": 1e-3,
        "weight_decay": 0.01,
        "lr_scheduler": "none",
        "number_of_steps": 10,
        "max_tokens": 64,
        "temperature": 1.0,
    }
    values.update(overrides)
    return config_testing.make_config(**values)


def make_samples(n: int, *, seed: int, vocab: int = 400, max_completion: int = 14) -> list[TrainingSample]:
    """``n`` random samples (prompt 2-8 tokens, completion 1-``max_completion``) with rollout logprobs."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        p = int(torch.randint(2, 9, (1,), generator=g))
        c = int(torch.randint(1, max_completion + 1, (1,), generator=g))
        out.append(
            TrainingSample(
                prompt_ids=torch.randint(3, vocab, (p,), generator=g).tolist(),
                completion_ids=torch.randint(3, vocab, (c,), generator=g).tolist(),
                advantage=float(torch.randn((), generator=g)),
                rollout_logprobs=(-torch.rand(c, generator=g) * 6 - 1).tolist(),
            )
        )
    return out


@contextlib.contextmanager
def open_trainer(config, **options) -> Iterator:
    from telescope_trainer_fsdp import create_trainer

    trainer = create_trainer(config, **options)
    try:
        yield trainer
    finally:
        trainer.close()


def hf_state(trainer) -> dict[str, torch.Tensor]:
    return {name: t.detach().cpu().clone() for name, t in trainer.hf_weights()}


@pytest.fixture
def helpers() -> SimpleNamespace:
    """The helpers above, for test modules (conftest modules are not importable by name)."""
    return SimpleNamespace(
        make_config=make_config, make_samples=make_samples, open_trainer=open_trainer, hf_state=hf_state
    )
