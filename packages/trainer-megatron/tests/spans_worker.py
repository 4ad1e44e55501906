"""One rank of the Megatron timeline test: a step, a checkpoint round trip and an export; every
rank's drained spans (as rows) to ``out`` as ``{"ranks": [...]}`` (rank 0 gathers them).

Run by ``run_ranks(spec, world, tmp, worker=...)`` (``megatron_spawn.py``). The spec: ``model_dir``,
``out``, ``overrides`` (config fields), ``samples`` (one step's samples), ``seq_len``.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

warnings.simplefilter("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from megatron_worker import make_config  # noqa: E402

from telescope_algos import TrainingSample, pack_samples  # noqa: E402
from telescope_algos.backend import nesting_problems  # noqa: E402
from telescope_trainer_megatron import create_trainer  # noqa: E402


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    trainer = create_trainer(make_config(spec["model_dir"], spec["overrides"]), params_dtype="float32")
    samples = [TrainingSample(**s) for s in spec["samples"]]
    per_rank = pack_samples(samples, seq_len=spec["seq_len"], num_ranks=trainer.dp_world_size)
    mine = per_rank[trainer.dp_rank]
    trainer.train_step(mine, step=3)
    step_spans = trainer.timeline.drain()
    again = trainer.timeline.drain()
    folder = Path(spec["out"]).parent / "ckpt"
    if dist.get_rank() == 0:
        folder.mkdir()
    dist.barrier()
    trainer.save_checkpoint(folder)
    trainer.load_checkpoint(folder)
    trainer.load_checkpoint(folder, weights_only=True)
    for _ in trainer.hf_weights():
        pass
    later = trainer.timeline.drain()
    mine_out = {
        "micro_batches": len(mine),
        "step": [s.to_row() for s in step_spans],
        "labels": [s.labels for s in step_spans],
        "again": len(again),
        "later": [s.to_row() for s in later],
        "problems": nesting_problems(step_spans) + nesting_problems(later),
    }
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine_out)
    if dist.get_rank() == 0:
        torch.save({"ranks": everyone}, spec["out"])
    dist.barrier()
    trainer.close()


if __name__ == "__main__":
    main()
