"""The service level and the rates for job17.sh's second part, from its sweep's JSON.

Prints ``SLO MET MISSED``: the sweep's p90 TTFT level at 32K, the highest rate our server met and the
lowest it missed above that (or 1.15x the highest met when none was missed). job17.sh gives ``ours_8k.py``
MISSED, then MET: it runs the rates in that order and stops at the first one met. Where the sweep did not
finish, the fourth lease's figures of 2026-12-06 stand in: level 2,742 ms, met 1.1, missed 1.3.

    python3 ab_rates.py SWEEP.json
"""

import json
import sys
from pathlib import Path

try:
    row = json.loads(Path(sys.argv[1]).read_text())["stages"]["sweep_llama"]["lengths"]["32768"]
    slo = float(row["slo_p90_ttft_ms"])
    ours = row.get("ours") or []
    met = max(r["rate"] for r in ours if r.get("within_slo"))
    above = [r["rate"] for r in ours if not r.get("within_slo") and r["rate"] > met]
    missed = min(above) if above else met * 1.15
except (OSError, KeyError, ValueError):
    slo, met, missed = 2742.0, 1.1, 1.3
print(f"{slo:.1f} {met:.4g} {missed:.4g}")
