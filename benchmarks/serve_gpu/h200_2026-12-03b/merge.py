"""The committed results of the lease of 2026-12-03 (evening): job5.sh's, with vanilla_second.py's rate added.

Usage: ``python benchmarks/serve_gpu/h200_2026-12-03b/merge.py RES RES2 OUT.json`` (RES: job5.sh's results
folder, RES2: vanilla_second.py's); then ``python benchmarks/vllm_serve_gpu.py --render OUT.json``.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import vllm_serve_gpu as m

res, res2, out = (Path(a) for a in sys.argv[1:4])
data = json.loads((res / "vllm_serve_gpu_qwen_paper.json").read_text())
second = json.loads((res2 / "vanilla_second.json").read_text())
row = data["stages"]["sweep_qwen"]["lengths"]["32768"]
rate = dict(
    second["rate"], within_slo=second["rate"]["p90_ttft_ms"] <= row["slo_p90_ttft_ms"] and not second["rate"]["failed"]
)
rate["server"] = "a second vanilla server, after ours, on the same machine (vanilla_second.py)"
row["vanilla"].append(rate)
row.update(m.rate_summary(row))
data["stages"]["sweep_qwen"]["startup_s_vanilla_second"] = second["startup_s"]
data["notes"] = [
    "**Run.** One H200 (vLLM 0.33.0, torch 2.11), 2026-12-03 15:53-16:15 UTC, random weights, default engine "
    "settings of both servers, `--policy paper`. The tree of commit 6b3f7b8: the draft's prompt attention in "
    "buckets of 256 tokens (`ExecutionSettings.attention_bucket`), the default the same lease's attention check "
    "chose (`attention_lengths_gpu_h200.md`) before the servers started "
    "(`benchmarks/serve_gpu/h200_2026-12-03b/job5.sh`).",
    "**Vanilla at 32K.** Its sweep ran out of its budget after one rate (0.134 req/s). A second vanilla server "
    f"on the same machine, after ours, ran one more (0.168 req/s; `vanilla_second.py`, healthy after "
    f"{second['startup_s']:.0f} s): the last vanilla row of the rate table.",
    "**Vanilla's ids/text probes** at 16K and 8K are void: each shorter probe prompt was a prefix of the 32K one "
    "(the same seed), so vLLM's prefix cache served part of it (8K ids: 76 ms). The probes now seed by length. "
    "Our server's probes were not affected (the draft scores every prompt; the kept prefill is a new layout). "
    "The ceiling and the unloaded TTFTs come from `vllm bench serve` runs with new seeds.",
    "**The probes' `client_ttft_ms`** include 24-31 ms of the probe's own: it built a new httpx client, "
    "TLS context and all, inside its clock for every request (on the CPU machine that alone takes about 26 ms; a "
    "raw socket there receives the first chunk 1-2 ms after the server's `server_ms`). The probe now builds "
    "its client before the clock. The load generator's unloaded TTFT is not affected (583 ms at 32K against "
    "a `server_ms` of 576.5).",
    "**Device time.** 1,467 of the session's 1,800 s, one machine: about 120 s of start and payload, 50 s of "
    "attention check, 1,050 s for both servers' stage, 209 s for the second vanilla server.",
]
out.write_text(json.dumps(data, indent=1, default=str))
print(out)
