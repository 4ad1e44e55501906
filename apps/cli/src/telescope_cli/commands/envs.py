"""``telescope envs list``: every registered environment, its kind and what it needs.

Environments come from the ``telescope.environments`` entry-point group (built-ins and any
installed package that registers its own).
"""

from __future__ import annotations

import argparse

from telescope_cli._exit import EXIT_OK


def run(args: argparse.Namespace) -> int:
    """Print the environment table."""
    from rich.console import Console
    from rich.table import Table

    from telescope_rollout import list_environments

    table = Table(title="Telescope environments (entry-point group telescope.environments)")
    for column in ("name", "kind", "needs", "status"):
        table.add_column(column)
    for row in list_environments():
        needs = ", ".join(row.get("requirements") or []) or "-"
        if row.get("error"):
            status = f"[red]cannot load: {row['error']}[/red]"
        elif not row.get("installed", True):
            status = "[yellow]missing requirements[/yellow]"
        elif row.get("missing_optional"):
            status = "ready (optional: " + ", ".join(row["missing_optional"]) + " not installed)"
        else:
            status = "ready"
        table.add_row(row["name"], row.get("kind", "?"), needs, status)
    Console(width=max(100, Console().width)).print(table)
    return EXIT_OK
