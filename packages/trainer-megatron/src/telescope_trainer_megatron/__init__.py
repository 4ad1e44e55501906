"""telescope-trainer-megatron: the megatron training backend of Telescope.

The backend itself arrives with its issue; this release names the backend for the
``telescope.trainers`` entry-point group.
"""

from telescope_trainer_megatron.__about__ import __version__

BACKEND_NAME = "megatron"

__all__ = ["BACKEND_NAME", "__version__"]
