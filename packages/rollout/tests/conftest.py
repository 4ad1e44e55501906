"""Shared fixtures: a tiny ChatML byte-level BPE tokenizer built in memory (no downloads)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

# this folder's helper modules (engine_fakes) are importable by the tests
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

# Tests never touch the network, even where `datasets` is installed.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    "{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_TEXT = (
    "The quick brown fox jumps over the lazy dog. What is 12 + 30? The answer is 42.\n"
    "You are a helpful assistant. I am a user. Guess a five letter word: <guess>crane</guess>\n"
    'Tool call: <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call> résumé 東京 🙂\n'
)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        show_progress=False,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([_TEXT] * 20, trainer=trainer)
    out = tmp_path_factory.mktemp("tiny_model")
    tok.save(str(out / "tokenizer.json"))
    cfg = {
        "chat_template": CHATML,
        "eos_token": "<|im_end|>",
        "bos_token": None,
        "pad_token": "<|endoftext|>",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return out


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path):
    from telescope_rollout import Tokenizer

    return Tokenizer.from_pretrained(model_dir)


QWEN3_LIKE = (Path(__file__).parent / "fixtures" / "qwen3_like.jinja").read_text(encoding="utf-8")
QWEN_ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


@pytest.fixture(scope="session")
def qwen_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny tokenizer with Qwen3's reasoning/tool tags as added tokens and a Qwen3-like template."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN_ADDED])
    out = tmp_path_factory.mktemp("qwen_like")
    tok.save(str(out / "tokenizer.json"))
    cfg = {"chat_template": QWEN3_LIKE, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return out


@pytest.fixture(scope="session")
def qwen_tokenizer(qwen_dir: Path):
    from telescope_rollout import Tokenizer

    return Tokenizer.from_pretrained(qwen_dir)
