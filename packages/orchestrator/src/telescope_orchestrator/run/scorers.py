"""The run's frozen models beside the policy: the teacher of on-policy distillation and the reference
model of the reference KL, each served by vLLM servers of its own that score the sampled tokens, or
placed in the trainer ranks (``teacher_placement`` / ``ref_placement``: ``trainer``).

:func:`scorer_models` says which a config starts (``teacher`` with ``algorithm: opd``, ``ref`` with
``ref_kl_coef > 0`` or a ``ref_model``), :func:`in_trainer` those the trainer ranks load;
:func:`check_tokenizers` refuses, before any server starts,
one whose tokenizer maps a token of the policy's to another id (it would score other tokens than
were sampled); :func:`scorer_launches` are their servers' launches: no weight sync (they never
change), and a context one token longer than the policy's, since vLLM generates one token after
the ``prompt_logprobs`` of a whole sample. That token is never fed to the model, so the extra
position is allowed past the model's own maximum (``VLLM_ALLOW_LONG_MAX_MODEL_LEN``).
:func:`check_contexts` refuses one whose model holds fewer positions than ``max_model_len`` (vLLM's
own check is off for them). :func:`token_scorers` are the engine's scorers over their URLs.
docs/rollout.md, "Teachers and reference models"."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from pathlib import Path

    from telescope_config import TelescopeConfig
    from telescope_rollout import InferenceClient, Tokenizer
    from telescope_rollout.inference import TokenScorer


@dataclass(frozen=True)
class ScorerModel:
    """One frozen model of a run: ``name`` (``teacher`` or ``ref``), the model as configured and as
    resolved on disk (``path``), where it runs (``placement``: ``servers`` or ``trainer``) and, on
    servers, how many and their GPUs each (0 in the trainer)."""

    name: str
    model: str
    path: str
    servers: int
    tensor_parallel: int
    placement: str = "servers"

    @property
    def title(self) -> str:
        return "teacher" if self.name == "teacher" else "reference model"


def scorer_models(cfg: TelescopeConfig, model_path: str) -> list[ScorerModel]:
    """The frozen models ``cfg`` scores with (``TelescopeConfig.frozen_models``; the servers of those on
    servers: ``cluster.ray_cluster.scorer_servers``), resolved like the policy
    (``run.models.resolve_model``); the reference defaults to the policy's own start (``model_path``)."""
    from telescope_orchestrator.cluster.ray_cluster import scorer_servers
    from telescope_orchestrator.run.models import resolve_model

    served = scorer_servers(cfg)
    out: list[ScorerModel] = []
    for name, placement in cfg.frozen_models.items():
        servers, tp = served.get(name, (0, 0))
        model = cfg.teacher_model if name == "teacher" else cfg.ref_model
        if model is None:  # the reference model by default: the policy as it starts
            out.append(ScorerModel(name, cfg.model, model_path, servers, tp, placement))
        else:
            out.append(ScorerModel(name, model, resolve_model(model), servers, tp, placement))
    return out


def in_trainer(scorers: list[ScorerModel]) -> dict[str, str]:
    """``{name: local folder}`` of the frozen models placed in the trainer ranks (what the backend's
    ``create_trainer`` takes as ``frozen_models``)."""
    return {s.name: s.path for s in scorers if s.placement == "trainer"}


def tokenizer_problem(policy: Tokenizer, other: Tokenizer, *, model: str, scorer: ScorerModel) -> str | None:
    """Why ``scorer``'s tokenizer cannot score the policy's tokens, or None when every token of the
    policy's vocabulary has the same id in both."""
    ours: dict[str, int] = policy.backend.get_vocab(with_added_tokens=True)
    theirs: dict[str, int] = other.backend.get_vocab(with_added_tokens=True)
    differ = sorted((t for t, i in ours.items() if theirs.get(t) != i), key=ours.__getitem__)
    if not differ:
        return None
    shown = ", ".join(f"{t!r} (id {ours[t]} here, {theirs.get(t)} there)" for t in differ[:3])
    return (
        f"the {scorer.title} {scorer.model!r} has another tokenizer than model {model!r}: {len(differ)} of "
        f"{len(ours)} tokens have another id or none there, e.g. {shown}. It scores the token ids the "
        f"model samples, so both must share one tokenizer: choose a {scorer.title} of the same family "
        "(the same tokenizer.json)."
    )


def check_tokenizers(cfg: TelescopeConfig, policy: Tokenizer, scorers: list[ScorerModel]) -> str | None:
    """The first scorer whose tokenizer differs from the policy's, as a message (None: all agree)."""
    from telescope_orchestrator.run.wiring import tokenizer_dir
    from telescope_rollout import Tokenizer

    for scorer in scorers:
        if scorer.name == "ref" and cfg.ref_model is None:
            continue  # the policy itself
        try:
            other = Tokenizer.from_pretrained(tokenizer_dir(scorer.path))
        except (OSError, ValueError) as exc:
            return f"the {scorer.title} {scorer.model!r} has no tokenizer that loads: {exc}"
        if (problem := tokenizer_problem(policy, other, model=cfg.model, scorer=scorer)) is not None:
            return problem
    return None


def model_positions(path: str) -> int | None:
    """The most positions the model in folder ``path`` was built for: ``max_position_embeddings`` of
    its ``config.json`` (or of its ``text_config``) times its ``rope_scaling`` factor (YaRN and the
    like), None when it does not say."""
    import json
    from pathlib import Path

    try:
        config: Any = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    sections: list[Any] = [config]
    while sections:
        section = sections.pop(0)
        if not isinstance(section, dict):
            continue
        fields = cast("dict[str, Any]", section)
        value = fields.get("max_position_embeddings")
        if isinstance(value, int) and value > 0:
            return int(value * _rope_factor(fields.get("rope_scaling")))
        sections.append(fields.get("text_config"))
    return None


def _rope_factor(scaling: Any) -> float:
    """How much a ``rope_scaling`` stretches the context, as vLLM counts it (1: none; ``su``,
    ``longrope`` and ``llama3`` leave ``max_position_embeddings`` as the model's length)."""
    if not isinstance(scaling, dict):
        return 1.0
    fields = cast("dict[str, Any]", scaling)
    kind = fields.get("rope_type", fields.get("type"))
    factor = fields.get("factor")
    if kind in ("su", "longrope", "llama3") or not isinstance(factor, int | float) or factor <= 1:
        return 1.0
    return float(factor)


def check_contexts(cfg: TelescopeConfig, scorers: list[ScorerModel]) -> str | None:
    """The first scorer whose model holds fewer positions than ``max_model_len``, as a message (None: all
    fit). Its servers allow one position past the model's own maximum for the token vLLM generates
    and discards (module docstring), which turns off vLLM's own check of the context: this is it."""
    for scorer in scorers:
        positions = model_positions(scorer.path)
        if positions is not None and positions < cfg.max_model_len:
            return (
                f"the {scorer.title} {scorer.model!r} holds at most {positions} positions "
                "(max_position_embeddings in its config.json), fewer than max_model_len "
                f"{cfg.max_model_len}: it could not score the end of the longest samples. Set max_model_len "
                f"to at most {positions}, or choose a {scorer.title} with a longer context."
            )
    return None


def scorer_launches(
    cfg: TelescopeConfig, scorers: list[ScorerModel], settings: Any, run_path: Path, first_port: int
) -> list[dict[str, Any]]:
    """The servers of ``scorers``, from the policy servers' ``settings`` (``ServerSettings``), on the
    ports after ``first_port``; each launch names its scorer in ``scorer``."""
    launches: list[dict[str, Any]] = []
    for scorer in (s for s in scorers if s.placement == "servers"):
        own = dataclasses.replace(
            settings,
            model=scorer.path,
            tensor_parallel_size=scorer.tensor_parallel,
            max_model_len=int(cfg.max_model_len) + 1,
            lora_rank=0,
        )
        fields = dataclasses.asdict(own)
        fields["extra_args"] = tuple(fields["extra_args"])
        for i in range(scorer.servers):
            launches.append(
                {
                    "settings": fields,
                    "port": first_port + len(launches),
                    "log_path": str(run_path / "logs" / scorer.name / f"server_{i}.log"),
                    "extension_cls": None,
                    "env": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"},
                    "scorer": scorer.name,
                }
            )
    return launches


def token_scorers(urls: dict[str, list[str]]) -> tuple[list[TokenScorer], list[InferenceClient]]:
    """The engine's scorers over each scorer's server URLs, and their clients (closed by the caller)."""
    from telescope_rollout import InferenceClient
    from telescope_rollout.inference import ServedScorer

    clients = {name: InferenceClient(u, timeout_s=1200.0) for name, u in urls.items() if u}
    return [ServedScorer(c, name=name) for name, c in clients.items()], list(clients.values())
