"""A later machine of the lease, with little device time left: our server alone on the Qwen2.5-32B / 0.5B
architecture pair at 32K (random weights), its stage-by-stage probes, its unloaded TTFT and, given a rate as the
third argument, one Poisson rate.

Vanilla `vllm serve` is not started (no time for a second engine): its unloaded TTFT and the service level come
from an earlier run on the same machine (job4.sh's vanilla server: 4,540 ms at 32K), given here. The policy is the
benchmark's (`--policy paper`, `vllm_serve_gpu.POLICY`).
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import vllm_serve_gpu as m

VANILLA_UNLOADED_MS = 4540.0  # job4.sh's vanilla server on the same machine, 5 prompts one at a time
RATE = float(sys.argv[3]) if len(sys.argv) > 3 else None

out, tok = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
m.logging.basicConfig(level=m.logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stdout)
import vllm_gpu as base  # noqa: E402

base.install_entry_point()
target, draft = m.qwen_dir("32b", tok, weights=False), m.qwen_dir("0.5b", tok, weights=True)
length, served, extra = 32768, target.name, ["--load-format", "dummy"]
slo = 2 * VANILLA_UNLOADED_MS
row: dict = {"vanilla_unloaded_ms": VANILLA_UNLOADED_MS, "slo_p90_ttft_ms": slo, "rate": RATE}
result = {"command": " ".join(["python", *sys.argv]), "engine_options": [*m.ENGINE, "--max-model-len", "33024", *extra],
          "target": "Qwen2.5-32B architecture, random weights", "draft": "Qwen2.5-0.5B architecture, random weights",
          "policy": m._policy_label(), "32768": row}  # fmt: skip


def save() -> None:
    (out / "ours_only.json").write_text(json.dumps(result, indent=1, default=str))


ours = m.Server("qwen_ours", m.ours_cmd(target, draft, served, 8502, length + 256, extra), 8502, out)
try:
    result["startup_s_ours"] = ours.wait()
    save()
    row["components"] = m.probe_components(ours, length, served, tok)
    save()
    row["ours_unloaded"] = m.bench(ours, tok, served, length, m.math.inf, 3, out, "ours_32768_unloaded", concurrency=1)
    save()
    if RATE is None:
        raise SystemExit(0)
    prompts = int(RATE * m.TARGET_S)
    row["ours_rate"] = m.bench(ours, tok, served, length, RATE, prompts, out, f"ours_32768_{RATE:g}", slo)
    row["ours_rate"]["within_slo"] = row["ours_rate"]["p90_ttft_ms"] <= slo and not row["ours_rate"].get("failed")
    row["ours_health_after"] = m.http("GET", ours.base + "/health")[1]
    save()
finally:
    ours.stop()
