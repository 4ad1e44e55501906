"""What a run writes and measures: the run directory, its records, derived metrics, infra, setup."""
