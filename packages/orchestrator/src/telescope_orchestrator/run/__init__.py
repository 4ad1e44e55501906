"""The run's life: start-up phases, the loop, evals, checkpoints, and the wiring of the packages."""
