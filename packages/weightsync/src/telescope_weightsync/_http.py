"""Calls into the receiver's methods through vLLM's ``POST /collective_rpc`` (dev mode).

vLLM forwards only string arguments, so each call carries one JSON string; it answers with one
result per worker (tensor-parallel rank).
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from telescope_weightsync._errors import WeightSyncError


def collective_rpc(
    client: httpx.Client, url: str, method: str, payload: dict[str, Any] | None = None, *, timeout_s: float
) -> list[Any]:
    """Run ``method`` on every worker of the server at ``url``; raise ``WeightSyncError`` naming it."""
    body: dict[str, Any] = {"method": method, "timeout": timeout_s}
    if payload is not None:
        body["args"] = [json.dumps(payload)]
    try:
        response = client.post(f"{url}/collective_rpc", json=body, timeout=timeout_s + 10.0)
    except httpx.TimeoutException as exc:
        raise WeightSyncError(f"server {url} did not answer {method} within {timeout_s:.0f}s") from exc
    except httpx.HTTPError as exc:
        raise WeightSyncError(f"server {url} failed during {method}: {type(exc).__name__}: {exc}") from exc
    if response.status_code == 404:
        raise WeightSyncError(
            f"server {url} has no /collective_rpc: start vLLM with VLLM_SERVER_DEV_MODE=1 and "
            "--worker-extension-cls telescope_weightsync.vllm_worker.WeightReceiver"
        )
    if response.status_code != 200:
        raise WeightSyncError(
            f"server {url} answered {method} with HTTP {response.status_code}: {response.text[:500]}"
        )
    results = response.json().get("results")
    if not isinstance(results, list) or not results:
        raise WeightSyncError(f"server {url} returned no worker results for {method}: {response.text[:200]}")
    return results
