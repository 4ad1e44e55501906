"""Sub-commands of ``telescope``; each module is imported only when its command runs."""
