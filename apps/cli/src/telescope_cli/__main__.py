"""``python -m telescope_cli`` runs the ``telescope`` command."""

from telescope_cli.main import entry

entry()
