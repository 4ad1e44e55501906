"""The agent gateway: an OpenAI-compatible endpoint per episode whose calls become training
sequences of exactly the sampled tokens (docs/rollout.md, "Agents")."""

from telescope_rollout.gateway._messages import RequestError, canonical_messages, canonical_tools
from telescope_rollout.gateway._server import AgentCall, AgentGateway, Episode, GatewayLimits, Generate
from telescope_rollout.gateway._session import CallPlan, EpisodeTokens, PromptTokens, Segment

# the endpoint
__all__ = ["AgentCall", "AgentGateway", "Episode", "GatewayLimits", "Generate"]
# token-in/token-out
__all__ += ["CallPlan", "EpisodeTokens", "PromptTokens", "Segment"]
# requests
__all__ += ["RequestError", "canonical_messages", "canonical_tools"]
