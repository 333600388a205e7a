"""After job5.sh, on the same machine: a second vanilla `vllm serve` for one more Poisson rate at 32K (0.168 req/s).

job5.sh's vanilla sweep ran out of its budget after its first rate (0.134 req/s, met). This ran as the call
``. env.sh; cd /tmp/proj; timeout 290 python3 - < vanilla_second.py`` and wrote ``/tmp/res2``; the service level
is job5.sh's (twice that run's 4,469 ms unloaded TTFT). `merge.py` adds its rate to job5.sh's results.
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
m._SEEDS = itertools.count(5000)  # dataset seeds job5.sh's process did not use
tok = Path("/tmp/proj/.gpujob/tok")
out = Path("/tmp/res2")
out.mkdir(exist_ok=True)
t = m.qwen_dir("32b", tok, weights=False)
v = m.Server(
    "qwen_vanilla_second",
    m.vanilla_cmd(t, t.name, 8501, 33024, ["--load-format", "dummy"]),
    8501,
    out,
    env={"SPECPREFILL_VLLM_PLUGIN": "0"},
)
r: dict = {"slo_p90_ttft_ms": 8938.0}
try:
    r["startup_s"] = v.wait()
    r["rate"] = m.bench(v, tok, t.name, 32768, 0.168, 10, out, "vanilla_32768_0.168", 8938.0)
finally:
    v.stop()
    (out / "vanilla_second.json").write_text(json.dumps(r, indent=1))
