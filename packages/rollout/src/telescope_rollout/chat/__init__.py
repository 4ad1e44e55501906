"""Chat templates and tokens: rendering conversations the way Hugging Face does (jinja2, no
transformers), tokenizing with ``tokenizers``, and multi-turn token sequences that reuse the
model's own ids with a loss mask (see docs/rollout.md, "Multi-turn tokens"), and whole conversations
with their assistant mask for supervised fine-tuning."""

from telescope_rollout.chat._conversation import ConversationTokens, conversation_tokens
from telescope_rollout.chat._multiturn import MultiTurnTokens, TokenTrajectory, TurnTokenizer
from telescope_rollout.chat._template import ChatTemplate, TemplateError
from telescope_rollout.chat._tokens import Tokenizer

# one prompt
__all__ = ["ChatTemplate", "TemplateError", "Tokenizer"]
# many turns
__all__ += ["MultiTurnTokens", "TokenTrajectory", "TurnTokenizer"]
# a whole conversation to train on (supervised fine-tuning)
__all__ += ["ConversationTokens", "conversation_tokens"]
