"""The inference client: completions with token ids and logprobs from OpenAI-compatible vLLM
servers, and the small client interface (:class:`CompletionClient`) the engine and evals use."""

from telescope_rollout.inference._client import (
    Completion,
    CompletionClient,
    CompletionRequest,
    InferenceClient,
    InferenceError,
    PromptTooLongError,
    ServerTimeoutError,
    ServerUnavailableError,
)

# clients
__all__ = ["CompletionClient", "InferenceClient"]
# what goes in and out
__all__ += ["Completion", "CompletionRequest"]
# failures
__all__ += ["InferenceError", "PromptTooLongError", "ServerTimeoutError", "ServerUnavailableError"]
