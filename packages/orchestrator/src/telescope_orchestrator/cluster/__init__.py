"""Processes only, no run logic: Ray, the actors, the vLLM server launcher, the reaper and guard."""
