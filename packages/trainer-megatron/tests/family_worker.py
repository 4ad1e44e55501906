"""Single-rank check of every supported family: build the Megatron twin, load, compare logits.

Argument: a JSON file ``{"models": [dirs], "out": path}``. For each model: GPTModel from the
config, weights from the safetensors, one packed row of two samples through Megatron, each
sample alone through the transformers model; writes the max absolute logit difference per model.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

warnings.simplefilter("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from telescope_trainer_megatron import ParallelLayout, install_cpu_shim  # noqa: E402
from telescope_trainer_megatron._arch import Architecture, padded_vocab_size  # noqa: E402
from telescope_trainer_megatron._model import build_gpt_model, load_hf_weights, transformer_config  # noqa: E402


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    dist.init_process_group("gloo", rank=0, world_size=1)
    install_cpu_shim()
    from megatron.core import parallel_state as ps
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    ps.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(0)
    out = {}
    for d in spec["models"]:
        arch = Architecture.from_pretrained(d)
        cfg = transformer_config(
            arch,
            ParallelLayout(world=1),
            params_dtype=torch.float32,
            sequence_parallel=False,
            recompute=False,
            fp8=False,
            cpu=True,
        )
        pv = padded_vocab_size(arch.vocab_size, 1)
        model = build_gpt_model(arch, cfg, padded_vocab=pv, use_te=False).eval()
        load_hf_weights(model, arch, d, padded_vocab=pv)
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, arch.vocab_size, (1, 20), generator=gen)
        pos = torch.cat([torch.arange(9), torch.arange(11)])[None]
        cu = torch.tensor([0, 9, 20], dtype=torch.int32)
        packed = PackedSeqParams(
            qkv_format="sbhd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=20, max_seqlen_kv=20
        )
        hf = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        with torch.no_grad():
            got = model(ids, pos, None, packed_seq_params=packed)[..., : arch.vocab_size]
            ref = torch.cat([hf(ids[:, :9]).logits, hf(ids[:, 9:]).logits], dim=1)
        out[d] = {"max_diff": (got - ref).abs().max().item(), "scale": ref.abs().max().item()}
    torch.save(out, spec["out"])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
