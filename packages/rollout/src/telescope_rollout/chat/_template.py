"""Chat templates rendered with jinja2, the way Hugging Face renders them.

The template comes from the config's ``chat_template`` string or the model folder's
``tokenizer_config.json`` (``chat_template`` as a string or a list of named templates) or
``chat_template.jinja``. Rendering uses jinja2's immutable sandbox with ``trim_blocks``,
``lstrip_blocks``, ``raise_exception``, ``strftime_now`` and an HF-compatible ``tojson``.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

from telescope_rollout._types import Message


class TemplateError(ValueError):
    """A chat template is missing, does not compile, or raised while rendering."""


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=32)
def _compile(source: str):
    from jinja2 import TemplateError as JinjaTemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    # jinja2 infers `globals` from its default namespace; any callable is a valid global
    template_globals: dict[str, Any] = env.globals
    template_globals["raise_exception"] = _raise_exception
    template_globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except JinjaTemplateError as exc:
        raise TemplateError(f"chat template does not compile: {exc}") from exc


@lru_cache(maxsize=32)
def _reads_variable(source: str, name: str) -> bool:
    from jinja2 import meta
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    return name in meta.find_undeclared_variables(env.parse(source))


def token_text(value: Any) -> str | None:
    """A special token from tokenizer_config: a plain string or an ``AddedToken`` dict's ``content``."""
    if isinstance(value, dict):
        value = cast(dict[str, Any], value).get("content")
    return value if isinstance(value, str) else None


def read_tokenizer_config(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / "tokenizer_config.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def find_chat_template(model_dir: str | Path, name: str = "default") -> str | None:
    """The model folder's chat template: ``chat_template.jinja`` or tokenizer_config's entry."""
    jinja_file = Path(model_dir) / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    tpl: object = read_tokenizer_config(model_dir).get("chat_template")
    if isinstance(tpl, list):
        entries = [cast(dict[str, object], t) for t in cast(list[object], tpl) if isinstance(t, dict)]
        named = {t.get("name"): t.get("template") for t in entries}
        tpl = named.get(name) or next(iter(named.values()), None)
    return tpl if isinstance(tpl, str) else None


class ChatTemplate:
    """A compiled chat template plus the special tokens it may reference."""

    def __init__(
        self, source: str, *, bos_token: str | None = None, eos_token: str | None = None, **defaults: Any
    ):
        if not source or not isinstance(cast(object, source), str):  # a config value
            raise TemplateError(
                "empty chat template: set `chat_template` in the config or use a model that ships one"
            )
        self.source = source
        self._template = _compile(source)
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.defaults = defaults
        """Keyword arguments passed on every render (e.g. ``enable_thinking``)."""

    @property
    def supports_tools(self) -> bool:
        """Whether the template reads the ``tools`` variable (Hermes/Qwen-style native tool calling)."""
        return _reads_variable(self.source, "tools")

    @classmethod
    def from_pretrained(
        cls, model_dir: str | Path, chat_template: str | None = None, **defaults: Any
    ) -> ChatTemplate:
        """Load from a model folder; ``chat_template`` (the config field) overrides the folder's."""
        cfg = read_tokenizer_config(model_dir)
        source = chat_template or find_chat_template(model_dir)
        if not source:
            raise TemplateError(
                f"{model_dir} has no chat template (tokenizer_config.json `chat_template` or"
                " chat_template.jinja); set `chat_template` in the config"
            )
        return cls(
            source,
            bos_token=token_text(cfg.get("bos_token")),
            eos_token=token_text(cfg.get("eos_token")),
            **defaults,
        )

    def render(
        self,
        messages: list[Message],
        *,
        add_generation_prompt: bool = False,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """Render messages to text.

        ``continue_final_message`` leaves the last (assistant) message open, as HF does: the
        output is cut right after that message's content, so generation continues it.
        """
        if add_generation_prompt and continue_final_message:
            raise TemplateError("add_generation_prompt and continue_final_message are mutually exclusive")
        context = {
            **self.defaults,
            **kwargs,
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            "tools": tools,
            "bos_token": self.bos_token or "",
            "eos_token": self.eos_token or "",
        }
        from jinja2 import TemplateError as JinjaTemplateError

        try:
            text = self._template.render(**context)
        except TemplateError:
            raise
        except JinjaTemplateError as exc:
            raise TemplateError(f"chat template failed to render: {exc}") from exc
        if continue_final_message:
            if not messages:
                raise TemplateError("continue_final_message needs at least one message")
            final = messages[-1].get("content")
            final = final if isinstance(final, str) else ""
            cut = text.rfind(final.strip()) if final.strip() else -1
            if cut < 0:
                raise TemplateError(
                    "continue_final_message: the final message's content is not in the rendering"
                )
            text = text[: cut + len(final.strip())]
        return text

    def apply_chat_template(self, messages: list[Message], tokenize: bool = False, **kwargs: Any) -> str:
        """HF-style alias of :meth:`render` (text only)."""
        if tokenize:
            raise TemplateError(
                "ChatTemplate renders text only; use Tokenizer.apply_chat_template(tokenize=True)"
            )
        return self.render(messages, **kwargs)
