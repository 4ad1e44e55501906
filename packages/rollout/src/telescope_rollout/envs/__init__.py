"""Built-in environments; each module is registered under ``telescope.environments``."""
