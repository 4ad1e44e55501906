"""telescope-cli: the ``telescope`` command, a thin command line over telescope-orchestrator.

Nothing imports this package; it imports the others, and only inside the commands that need
them, so ``telescope --help`` answers instantly.
"""

from telescope_cli.__about__ import __version__

__all__ = ["__version__"]
