"""``specprefill models``: list the bundled models, whether their package is installed and converted.

Any Hugging Face model folder, ``.gguf`` file or cached hub id works with ``--model`` as well.

Example::

    specprefill models --json
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``models`` options to ``parser``."""
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def main(args: argparse.Namespace) -> int:
    """Print the bundled models; returns the exit status."""
    from ..errors import ModelLoadError
    from ..models import BUNDLED_MODELS, DEFAULT_MODEL, cache_dir

    rows = []
    for model in BUNDLED_MODELS.values():
        try:
            model.locate()
            installed = True
        except ModelLoadError:
            installed = False
        rows.append(
            {
                "name": model.name,
                "description": model.description,
                "installed": installed,
                "converted": (cache_dir() / "models" / model.name / "config.json").is_file(),
                "default": model.name == DEFAULT_MODEL,
                "install": model.install,
            }
        )
    if args.json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="bundled models (use with --model NAME)", title_justify="left")
    table.add_column("name", style="bold")
    table.add_column("description")
    table.add_column("installed")
    table.add_column("converted")
    for row in rows:
        name = f"{row['name']} (default)" if row["default"] else str(row["name"])
        table.add_row(
            name,
            str(row["description"]),
            "yes" if row["installed"] else "no",
            "yes" if row["converted"] else "on first use",
        )
    console = Console()
    console.print(table)
    missing = [r for r in rows if not r["installed"]]
    if missing:
        console.print("install a missing one with, e.g.:", style="dim")
        console.print(f"  {missing[0]['install']}", style="dim", soft_wrap=True)
    return 0
