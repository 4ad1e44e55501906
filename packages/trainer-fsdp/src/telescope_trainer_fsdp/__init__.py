"""telescope-trainer-fsdp: the fsdp training backend of Telescope.

The backend itself arrives with its issue; this release names the backend for the
``telescope.trainers`` entry-point group.
"""

from telescope_trainer_fsdp.__about__ import __version__

BACKEND_NAME = "fsdp"

__all__ = ["BACKEND_NAME", "__version__"]
