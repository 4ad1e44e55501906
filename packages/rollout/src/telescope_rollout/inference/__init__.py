"""The inference client: completions with token ids and logprobs from OpenAI-compatible vLLM
servers, the small client interface (:class:`CompletionClient`) the engine and evals use, the
prefix-cache salt of a weight version (:func:`cache_salt`), and the token scorers of teachers and
reference models (:class:`TokenScorer`, :class:`ServedScorer`)."""

from telescope_rollout.inference._client import (
    Completion,
    CompletionClient,
    CompletionRequest,
    InferenceClient,
    InferenceError,
    PromptTooLongError,
    ServerTimeoutError,
    ServerUnavailableError,
    cache_salt,
)
from telescope_rollout.inference._scorer import ServedScorer, TokenScorer

# clients
__all__ = ["CompletionClient", "InferenceClient", "ServedScorer", "TokenScorer"]
# what goes in and out
__all__ += ["Completion", "CompletionRequest", "cache_salt"]
# failures
__all__ += ["InferenceError", "PromptTooLongError", "ServerTimeoutError", "ServerUnavailableError"]
