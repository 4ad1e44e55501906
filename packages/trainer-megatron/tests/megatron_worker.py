"""One rank of a multi-process Megatron test: train, export, checkpoint, resume; results to a file.

Run by ``run_ranks`` in ``megatron_spawn.py`` with RANK/WORLD_SIZE/MASTER_* set. Arguments: a JSON
file with ``model_dir``, ``out``, ``overrides`` (config fields) and ``steps`` (list of sample lists).
``train_step`` gets ``step`` 1-based, as the CLI passes it. Rank 0 writes ``out``: per step the
metrics and the exported Hugging Face weights; with ``checkpoint``, the same for a trainer resumed
from ``ckpt/step_K`` (saved after step ``K`` = ``save_after`` + 1, default 1, into a folder made
beforehand, as the CLI does) and every rank's returned facts, and the Python and NumPy draws right
after the first trainer was created. With ``weights_only_checks``, also a weights-only save
(``ckpt/weights_K``), what loading it raises without ``weights_only``, a fresh trainer's weights and
counters after a weights-only load, what a full load raises when ``layout.json`` names another
layout (``ckpt/other_layout``, a copy with a different ``tp_size``), and the first step trained
after the weights-only load next to the same step of a trainer built on ``weights_K/hf``. With
``mismatched_counts``, a last step where the ranks get different numbers of micro-batches, and the
error it raised. With ``frozen``, the first step again on a fresh trainer that holds the model itself
as its frozen reference model (``frozen_models``, ``ref_kl_coef`` 0.1): its metrics and every rank's
``step_tokens`` (``frozen_tokens``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

warnings.simplefilter("ignore")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import telescope_config  # noqa: E402
from telescope_algos import TrainingSample, pack_samples  # noqa: E402
from telescope_trainer_megatron import create_trainer  # noqa: E402


def make_config(model_dir: str, overrides: dict) -> telescope_config.TelescopeConfig:
    data = {
        **telescope_config.defaults(),
        "environments": [{"name": "countdown"}],
        "model": model_dir,
        "train_backend": "megatron",
        "trainer_num_workers": int(os.environ.get("WORLD_SIZE", "1")),
        **overrides,
    }
    return telescope_config.TelescopeConfig.model_validate(data)


def _local_experts(trainer) -> list[int]:
    """This rank's expert indices, as its parameters number them (from 0 on every EP rank)."""
    names = [n for n, _ in trainer.model.module.named_parameters() if ".local_experts." in n]
    return sorted({int(n.split(".local_experts.")[1].split(".")[0]) for n in names})


def weights_of(tr) -> dict:
    return {n: t.detach().clone() for n, t in tr.hf_weights()}


def _error(fn) -> str | None:
    try:
        fn()
    except ValueError as e:
        return str(e)
    return None


def _weights_only_checks(
    config, options: dict, *, ckpt_dir: Path, weights_dir: Path, run_step, result: dict
) -> None:
    fresh = create_trainer(config, **options)
    result["no_state_error"] = _error(lambda: fresh.load_checkpoint(weights_dir))
    fresh.load_checkpoint(weights_dir, weights_only=True)
    result["weights_only"] = {
        "weights": weights_of(fresh),
        "scheduler_step": fresh.scheduler_step,
        "skipped_steps_total": fresh.skipped_steps_total,
    }
    other = ckpt_dir.parent / "other_layout"
    if dist.get_rank() == 0:  # the full checkpoint, as if written under TP = 2
        shutil.copytree(ckpt_dir, other)
        layout = json.loads((other / "layout.json").read_text())
        (other / "layout.json").write_text(json.dumps({**layout, "tp_size": 2}))
    dist.barrier()
    result["layout_error"] = _error(lambda: fresh.load_checkpoint(other))
    fresh.load_checkpoint(other, weights_only=True)  # the weights alone load under any layout
    result["other_layout_weights"] = weights_of(fresh)
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(other)  # the test then sees only what save_checkpoint wrote
    # Training on after a weights-only load = a new trainer built on the hf/ folder (the optimizer's
    # fp32 main parameters follow the loaded weights, not the ones the trainer was built with).
    result["after_weights_only"] = run_step(fresh, 0)
    result["built_on_hf"] = run_step(create_trainer(config, model_path=weights_dir / "hf", **options), 0)


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    config = make_config(spec["model_dir"], spec["overrides"])
    options = spec.get("options", {})
    trainer = create_trainer(config, **options)
    rank = dist.get_rank()
    result: dict = {
        "steps": [],
        "resumed": [],
        "dp_world_size": trainer.dp_world_size,
        "params_dtype": str(trainer.params_dtype),
        "local_experts": _local_experts(trainer),
    }

    def run_step(tr, i: int) -> dict:
        samples = [TrainingSample(**s) for s in spec["steps"][i]]
        per_rank = pack_samples(
            samples,
            seq_len=spec["seq_len"],
            pad_to_multiple_of=spec.get("pad", 8),
            num_ranks=tr.dp_world_size,
        )
        metrics = tr.train_step(per_rank[tr.dp_rank], step=i + 1)
        return {"metrics": metrics, "weights": weights_of(tr)}

    def save(tr, directory: Path, **kw) -> list[dict]:
        """Make the folder (as the caller does), save into it; every rank's returned facts."""
        if rank == 0:
            directory.mkdir(parents=True)
        dist.barrier()
        facts = tr.save_checkpoint(directory, **kw)
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, facts)
        return everyone

    result["rng_after_create"] = {"python": random.random(), "numpy": float(np.random.rand())}
    ckpt_root = Path(spec["out"]).parent / "ckpt"
    save_after = spec.get("save_after", 0)
    ckpt_dir = ckpt_root / f"step_{save_after + 1}"
    weights_dir = ckpt_root / f"weights_{save_after + 1}"
    for i in range(len(spec["steps"])):
        result["steps"].append(run_step(trainer, i))
        if i == save_after and spec.get("checkpoint"):
            result["checkpoint_facts"] = save(trainer, ckpt_dir)
            result["scheduler_step_saved"] = trainer.scheduler_step
        if i == save_after and spec.get("weights_only_checks"):
            result["weights_only_facts"] = save(trainer, weights_dir, training_state=False)
    result["is_broadcast_rank"] = trainer.is_broadcast_rank
    if spec.get("mismatched_counts"):  # data-parallel rank 0 gets one micro-batch more than the others
        samples = [TrainingSample(**s) for s in spec["steps"][0]]
        per_rank = pack_samples(samples, seq_len=spec["seq_len"], num_ranks=trainer.dp_world_size)
        mine = per_rank[trainer.dp_rank]
        try:
            trainer.train_step(mine[: 1 + (trainer.dp_rank == 0)], step=len(spec["steps"]))
            result["mismatch_error"] = None
        except ValueError as e:
            result["mismatch_error"] = str(e)
    if spec.get("weights_only_checks"):
        _weights_only_checks(
            config, options, ckpt_dir=ckpt_dir, weights_dir=weights_dir, run_step=run_step, result=result
        )
    if spec.get("checkpoint"):
        fresh = create_trainer(config, **options)
        result["returned"] = fresh.load_checkpoint(ckpt_dir)
        result["scheduler_step"] = fresh.scheduler_step
        for i in range(save_after + 1, len(spec["steps"])):
            result["resumed"].append(run_step(fresh, i))
    if spec.get("frozen"):
        result["frozen"] = _frozen_step(spec, options, run_step)
    if rank == 0:
        torch.save(result, spec["out"])
    dist.barrier()
    trainer.close()


def _frozen_step(spec: dict, options: dict, run_step) -> dict:
    """Step 1 on a trainer holding the model itself as its reference: metrics and every rank's tokens."""
    config = make_config(
        spec["model_dir"], {**spec["overrides"], "ref_kl_coef": 0.1, "ref_placement": "trainer"}
    )
    tr = create_trainer(config, frozen_models={"ref": spec["model_dir"]}, **options)
    out = run_step(tr, 0)
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, tr.step_tokens())
    tr.close()
    return {"metrics": out["metrics"], "tokens": everyone}


if __name__ == "__main__":
    main()
