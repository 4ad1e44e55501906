"""The inference client: completions with token ids and logprobs from OpenAI-compatible vLLM
servers, the small client interface (:class:`CompletionClient`) the engine and evals use, and the
prefix-cache salt of a weight version (:func:`cache_salt`)."""

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

# clients
__all__ = ["CompletionClient", "InferenceClient"]
# what goes in and out
__all__ += ["Completion", "CompletionRequest", "cache_salt"]
# failures
__all__ += ["InferenceError", "PromptTooLongError", "ServerTimeoutError", "ServerUnavailableError"]
