"""``specprefill policies``: list the policy presets, or show the settings of one.

Example::

    specprefill policies
    specprefill policies paper --json
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``policies`` options to ``parser``."""
    parser.add_argument("name", nargs="?", help="show this preset (or .toml file) in full")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def main(args: argparse.Namespace) -> int:
    """Print the presets (or one preset's settings); returns the exit status."""
    from rich.console import Console
    from rich.table import Table

    from ..policies import list_policies, load_policy

    console = Console()
    if args.name:
        policy = load_policy(args.name)
        data = policy.model_dump(mode="json")
        data["selector_built"] = policy.build_selector().name
        if args.json:
            sys.stdout.write(json.dumps(data, indent=2) + "\n")
        else:
            console.print(f"[bold]{policy.name}[/bold]: {policy.description}")
            console.print(f"selector: {data['selector_built']}")
            for section in ("scorer", "selector", "protect"):
                settings = ", ".join(f"{k}={v!r}" for k, v in data[section].items())
                console.print(f"[{section}] {settings}", markup=False)
        return 0
    policies = [load_policy(name) for name in list_policies()]
    if args.json:
        rows = [{"name": p.name, "description": p.description, "summary": p.summary()} for p in policies]
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return 0
    table = Table(title="policy presets (use with --policy NAME)", title_justify="left")
    table.add_column("name", style="bold")
    table.add_column("settings")
    table.add_column("description")
    for p in policies:
        table.add_row(p.name, p.summary(), p.description)
    console.print(table)
    return 0
