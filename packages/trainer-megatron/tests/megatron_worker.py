"""One rank of a multi-process Megatron test: train, export, checkpoint, resume; results to a file.

Run by ``run_ranks`` in ``_spawn.py`` with RANK/WORLD_SIZE/MASTER_* set. Arguments: a JSON file
with ``model_dir``, ``out``, ``overrides`` (config fields) and ``steps`` (list of sample lists).
Rank 0 writes ``out``: per step the metrics and the exported Hugging Face weights; after a
checkpoint round trip, the same for a trainer resumed from it. With ``mismatched_counts``, a
last step where the ranks get different numbers of micro-batches, and the error it raised.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

warnings.simplefilter("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import telescope_config  # noqa: E402
from telescope_algos import Sample, pack_samples  # noqa: E402
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
        samples = [Sample(**s) for s in spec["steps"][i]]
        per_rank = pack_samples(
            samples,
            seq_len=spec["seq_len"],
            pad_to_multiple_of=spec.get("pad", 8),
            num_ranks=tr.dp_world_size,
        )
        metrics = tr.train_step(per_rank[tr.dp_rank], step=i)
        weights = {n: t.detach().clone() for n, t in tr.hf_weights()}
        return {"metrics": metrics, "weights": weights}

    ckpt_dir = Path(spec["out"]).parent / "ckpt" / "step_1"
    for i in range(len(spec["steps"])):
        result["steps"].append(run_step(trainer, i))
        if i == 0 and spec.get("checkpoint"):
            trainer.save_checkpoint(ckpt_dir, step=0, extra_state={"note": "hello", "step": 0})
    result["is_broadcast_rank"] = trainer.is_broadcast_rank
    if spec.get("mismatched_counts"):  # data-parallel rank 0 gets one micro-batch more than the others
        samples = [Sample(**s) for s in spec["steps"][0]]
        per_rank = pack_samples(samples, seq_len=spec["seq_len"], num_ranks=trainer.dp_world_size)
        mine = per_rank[trainer.dp_rank]
        try:
            trainer.train_step(mine[: 1 + (trainer.dp_rank == 0)], step=len(spec["steps"]))
            result["mismatch_error"] = None
        except ValueError as e:
            result["mismatch_error"] = str(e)
    if spec.get("checkpoint"):
        fresh = create_trainer(config, **options)
        extra = fresh.load_checkpoint(ckpt_dir)
        result["extra_state"] = extra
        result["scheduler_step"] = fresh.scheduler_step
        for i in range(1, len(spec["steps"])):
            result["resumed"].append(run_step(fresh, i))
    if rank == 0:
        torch.save(result, spec["out"])
    dist.barrier()
    trainer.close()


if __name__ == "__main__":
    main()
