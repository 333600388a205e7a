"""After job16.sh, on the same machine: vanilla `vllm serve` again, for Poisson rates between the last one its
sweep met and the first one it missed, so that its maximum is bounded more tightly.

Ran as ``. env.sh; cd /tmp/proj; python3 vanilla_rates.py OUT SLO_MS RATE...`` with job16.sh's service level
(twice its vanilla unloaded TTFT) and 12 prompts a rate, as job16.sh's sweep; the Llama pair at 32K.
``SLO_MS`` given as ``unloaded`` measures the level first, as the sweep does (twice the median TTFT of prompts
sent one at a time); with no RATE that is all it runs.
"""

import itertools
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, "benchmarks")
import vllm_gpu as base
import vllm_serve_gpu as m

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stdout)
base.install_entry_point()
m._SEEDS = itertools.count(7000)  # dataset seeds job16.sh's process did not use
out, slo_arg, rates = Path(sys.argv[1]), sys.argv[2], [float(r) for r in sys.argv[3:]]
tok = Path("/tmp/proj/.gpujob/tok")
out.mkdir(parents=True, exist_ok=True)
t = m.llama_dir("8b", tok, weights=False)
v = m.Server(
    "llama_vanilla_rates",
    m.vanilla_cmd(t, t.name, 8501, 32768 + 256, ["--load-format", "dummy"]),
    8501,
    out,
    env={"SPECPREFILL_VLLM_PLUGIN": "0"},
)
r: dict = {"gpu": m.gpu_name(), "rates": []}
try:
    r["startup_s"] = v.wait()
    if slo_arg == "unloaded":
        r["vanilla_unloaded"] = m.bench_unloaded(v, tok, t.name, 32768, out, "vanilla_32768_unloaded")
        slo_ms = 2 * float(r["vanilla_unloaded"]["median_ttft_ms"])
    else:
        slo_ms = float(slo_arg)
    r["slo_p90_ttft_ms"] = slo_ms
    for rate in rates:
        r["rates"].append(m.bench(v, tok, t.name, 32768, rate, 12, out, f"vanilla_32768_{rate:g}", slo_ms))
finally:
    v.stop()
    (out / "vanilla_rates.json").write_text(json.dumps(r, indent=1))
