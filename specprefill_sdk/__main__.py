"""``python -m specprefill_sdk``: the same as the ``specprefill`` command."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())
