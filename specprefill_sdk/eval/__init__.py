"""Evaluation: RULER-style tasks from real text shipped in PyPI packages, and the harness that runs them."""
