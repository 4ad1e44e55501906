"""What the FSDP backend writes into a checkpoint folder (the caller owns the folder and its name).

Inside the folder ``save_checkpoint`` is given (the orchestrator's ``step_<N>.tmp``, renamed once every
rank returned)::

    hf_meta/                 Hugging Face config, generation config and tokenizer files
    .metadata, *.distcp      PyTorch DCP: {"model": ...} and, with the training state, "optimizer"
    trainer_state.pt         LR scheduler and trainer counters (training state only)
    rng_state_rank_<r>.pt    Python, NumPy, torch (and CUDA) RNG of rank r (training state only)
    lora.json                with LoRA: rank, alpha, dropout, targets (``_lora.lora_settings``)

Model and optimizer are sharded by DCP (each rank writes its shards, no gather), so a checkpoint
loads at another world size. ``convert_checkpoint`` turns the folder into a Hugging Face one.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["HF_META_DIR", "LORA_FILE", "TRAINER_STATE_FILE", "check_folder", "rng_file"]

HF_META_DIR = "hf_meta"
LORA_FILE = "lora.json"
TRAINER_STATE_FILE = "trainer_state.pt"
_DCP_METADATA = ".metadata"


def rng_file(rank: int) -> str:
    return f"rng_state_rank_{rank}.pt"


def check_folder(directory: str | Path) -> Path:
    """``directory`` as a Path when it holds an FSDP checkpoint, else a FileNotFoundError saying so."""
    path = Path(directory)
    if not (path / _DCP_METADATA).is_file() or not (path / HF_META_DIR / "config.json").is_file():
        raise FileNotFoundError(
            f"{path} is not a checkpoint of the FSDP backend (no {_DCP_METADATA} and "
            f"{HF_META_DIR}/config.json); pass a step_<N> folder of a run's checkpoints"
        )
    return path
