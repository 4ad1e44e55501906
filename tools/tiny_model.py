"""Build a tiny Llama model folder (config, fp32 safetensors, tokenizer, ChatML template) offline.

Tests and benchmarks use it instead of a hub download: the tokenizer is a byte-level BPE trained
in memory on a few KB of text (about 10 ms), the model is random (seeded) from ``LlamaConfig``.
Head size 32 (vLLM's CPU attention rejects 16). The Llama architecture is used on purpose: a
folder saved as ``qwen2`` reloads through ``Qwen2Tokenizer``, which tokenizes differently from
the saved ``tokenizer.json``.

    python tools/tiny_model.py OUT_DIR [--tied] [--layers 2] [--hidden 64] [--seed 0]

``build_tiny_teacher(student, out)`` makes a teacher for on-policy distillation tests: the student
(same tokenizer, same shape) fine-tuned for a few seconds to write digits, so that it differs from
the student in a way a few distillation steps can close.

Tests get it through the root ``conftest.py`` fixtures ``tiny_model_dir`` / ``tiny_tied_model_dir``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_TEXT = (
    "The quick brown fox jumps over the lazy dog. What is 12 + 30? The answer is 42.\n"
    "You are a helpful assistant. I am a user. Guess a five letter word: <guess>crane</guess>\n"
    'Tool call: <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n'
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 red green blue cat dog apple\n"
    "Using numbers, create an equation that equals the target. <answer>(1 + 2) * 3</answer>\n"
)


def build_tokenizer(out: Path, vocab_size: int = 512) -> None:
    """Train a byte-level BPE tokenizer and save it as a fast tokenizer with a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        show_progress=False,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([_TEXT] * 20, trainer=trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHATML,
        "eos_token": "<|im_end|>",
        "bos_token": None,
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1), encoding="utf-8")
    specials = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    (out / "special_tokens_map.json").write_text(json.dumps(specials), encoding="utf-8")


def build_tiny_model(
    out: str | Path,
    *,
    tied: bool = False,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 2,
    kv_heads: int = 1,
    intermediate: int = 128,
    max_positions: int = 1024,
    seed: int = 0,
) -> Path:
    """Write a random tiny Llama (fp32 safetensors) plus its tokenizer into ``out``; return it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out)
    build_tokenizer(out)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tied,
        bos_token_id=ids["<|im_start|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # larger weights than the default init: greedy outputs differ per seed
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    model.save_pretrained(out, safe_serialization=True)
    gen = {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(gen), encoding="utf-8")
    return out


DIGITS = " ".join(str(i % 10) for i in range(200))
"""What :func:`build_tiny_teacher` teaches: digits separated by spaces."""


def build_tiny_teacher(student: str | Path, out: str | Path, *, steps: int = 60, seed: int = 0) -> Path:
    """The model in ``student`` fine-tuned on :data:`DIGITS` (AdamW, ``steps`` full-sequence steps of
    64 tokens), written with its tokenizer into ``out``; return ``out``."""
    import shutil

    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM

    out = Path(out)
    shutil.copytree(student, out, dirs_exist_ok=True)
    torch.manual_seed(seed)
    model = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = Tokenizer.from_file(str(out / "tokenizer.json")).encode(DIGITS).ids
    data = torch.tensor(ids[: len(ids) // 64 * 64]).view(-1, 64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for step in range(steps):
        batch = data[step % len(data)][None]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(out, safe_serialization=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--tied", action="store_true")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    path = build_tiny_model(args.out, tied=args.tied, layers=args.layers, hidden=args.hidden, seed=args.seed)
    print(path)


if __name__ == "__main__":
    main()
