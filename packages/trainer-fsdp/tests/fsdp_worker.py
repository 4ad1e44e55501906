"""One rank of the multi-rank tests (run as a script by ``fsdp_spawn.run_ranks``, never collected).

    python fsdp_worker.py JOB_DIR      with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set

Reads ``JOB_DIR/job.pt`` ({"config": dict, "micro_batches": [per data-parallel rank], "steps": int}),
trains (the context-parallel ranks of a replica share its micro-batches), and
writes ``JOB_DIR/rank_<r>.pt`` with the metrics of every step and (rank 0) the gathered HF weights;
then saves a checkpoint into ``JOB_DIR/ckpt``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

import telescope_config
from telescope_trainer_fsdp import create_trainer


def main(job_dir: Path) -> None:
    job = torch.load(job_dir / "job.pt", weights_only=False)
    config = telescope_config.TelescopeConfig.model_validate(job["config"])
    trainer = create_trainer(config, dist_timeout_s=240)
    rank = trainer.rank
    try:
        mine = job["micro_batches"][trainer.dp_rank]
        metrics = [trainer.train_step(mine, step=s) for s in range(job["steps"])]
        weights = {name: t.clone() for name, t in trainer.hf_weights()}  # every rank exhausts it
        (job_dir / "ckpt").mkdir(exist_ok=True)  # the caller's folder (every rank sees it)
        assert trainer.save_checkpoint(job_dir / "ckpt")["world_size"] == trainer.world_size
        result = {"metrics": metrics, "dp": (trainer.dp_rank, trainer.dp_world_size), "cp": trainer.cp_size}
        if rank == 0:
            result["weights"] = weights
        torch.save(result, job_dir / f"rank_{rank}.pt")
    finally:
        trainer.close()


if __name__ == "__main__":
    assert "RANK" in os.environ, "run by fsdp_spawn.run_ranks with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT"
    main(Path(sys.argv[1]))
