"""Tokenization with the ``tokenizers`` library from a model folder's ``tokenizer.json``.

:class:`Tokenizer` pairs the fast tokenizer with a :class:`ChatTemplate` and offers the small
HF-like surface environments and the rollout loop use (``encode``, ``decode``,
``apply_chat_template``), without importing transformers.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, overload

from telescope_rollout._types import Message
from telescope_rollout.chat._template import ChatTemplate, TemplateError, read_tokenizer_config, token_text


class Tokenizer:
    """A ``tokenizers.Tokenizer`` with its chat template and special tokens."""

    def __init__(self, backend: Any, template: ChatTemplate | None = None, *, eos_token: str | None = None):
        self.backend = backend
        self.template = template
        self.eos_token = eos_token or (template.eos_token if template else None)
        self.eos_token_id = self.token_to_id(self.eos_token) if self.eos_token else None

    @classmethod
    def from_pretrained(
        cls,
        model_dir: str | Path,
        *,
        chat_template: str | None = None,
        enable_thinking: bool | None = None,
    ) -> Tokenizer:
        """Load ``tokenizer.json`` and the chat template (config override first) from a folder.

        ``enable_thinking``, when given, is passed on every render.
        """
        from tokenizers import Tokenizer as Backend

        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found: telescope-rollout needs a fast tokenizer (tokenizer.json)"
            )
        backend = Backend.from_file(str(path))
        defaults = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        try:
            template = ChatTemplate.from_pretrained(model_dir, chat_template, **defaults)
        except TemplateError:
            if chat_template:
                raise
            template = None
        eos = token_text(read_tokenizer_config(model_dir).get("eos_token"))
        return cls(backend, template, eos_token=eos)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; special tokens written in the text are recognised."""
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    @property
    def vocab_size(self) -> int:
        """Token ids it knows, added tokens included (ids are below this)."""
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @overload
    def apply_chat_template(
        self, messages: list[Message], *, tokenize: Literal[False] = False, **kwargs: Any
    ) -> str: ...

    @overload
    def apply_chat_template(
        self, messages: list[Message], *, tokenize: Literal[True], **kwargs: Any
    ) -> list[int]: ...

    def apply_chat_template(
        self, messages: list[Message], *, tokenize: bool = False, **kwargs: Any
    ) -> str | list[int]:
        """Render ``messages`` (HF signature subset); ids when ``tokenize=True``."""
        if self.template is None:
            raise TemplateError("this tokenizer has no chat template; set `chat_template` in the config")
        text = self.template.render(messages, **kwargs)
        return self.encode(text) if tokenize else text
