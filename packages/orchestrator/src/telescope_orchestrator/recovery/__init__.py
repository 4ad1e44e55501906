"""Keeping a run alive when a part dies: the vLLM server supervisor and trainer restarts."""
