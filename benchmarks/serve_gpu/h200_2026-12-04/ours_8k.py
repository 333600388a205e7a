"""A lease's last device minutes: our server alone at one length (8K unless told) on one random-weight pair,
at several Poisson rates.

`--policy paper` and the engine options of `vllm_serve_gpu.py`; the rates lie below the one the lease's sweep missed.

Vanilla `vllm serve` is not started (no time for a second engine): the service level is given, twice vanilla's
unloaded TTFT at 8K as the same lease measured it. By default the Qwen2.5-32B / 0.5B pair and job7.sh's level
(vanilla 900.9 ms on that lease's second machine, where it missed the level at 0.666 req/s); ``--pair llama
--slo-ms 504`` is the run of 2026-12-04b (job9.sh's vanilla, 252.1 ms); ``--pair llama --length 32768 --slo-ms 2742``
the fourth lease of 2026-12-06 (job16.sh's vanilla, 1,371 ms). Rates, highest first, stop at the first one within
the level.

    python3 ours_8k.py [--pair qwen|llama] [--length N] [--slo-ms MS] OUT TOKENIZER RATE...
    python3 ours_8k.py --render OUT.json                                          (its markdown)
"""

import argparse
import functools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import vllm_serve_gpu as m

SLO_MS = 2 * 900.9  # job7.sh's vanilla, 5 prompts of 8,192 tokens one at a time
MAX_LEN = 32768 + 256  # job7.sh's servers took every length up to 32K
#: Each pair's architectures, as its results name them.
TITLES = {"qwen": "Qwen2.5-32B / 0.5B", "llama": "Llama-3.1-8B / 3.2-1B"}


def render(result: dict) -> str:
    """The run as markdown: its notes, then one row per rate."""
    title = TITLES[result.get("pair", "qwen")]
    length = result.get("length", 8192)
    gpu = result.get("gpu", "NVIDIA H200")  # runs before the field was recorded were all on H200s
    lines = [f"# Our server alone at {length // 1024}K ({title} architectures, random weights, one {gpu})", ""]
    lines += [f"Command: `{result['command']}`", ""]
    for note in result.get("notes", []):
        lines += [f"> {note}", ""]
    lines += [
        f"Policy {result['policy']}; engine options `{' '.join(result['engine_options'])}`; service level: p90 TTFT "
        f"at most {result['slo_p90_ttft_ms']:,.1f} ms; `vllm bench serve`, random dataset, {length:,} in, 128 out, "
        f"--ignore-eos, Poisson arrivals. Start-up {result.get('startup_s_ours')} s.",
        "",
        "| rate (req/s) | prompts | TTFT p50 | TTFT p90 | within SLO | goodput (req/s) | throughput (req/s) | failed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rates"]:
        lines.append(
            f"| {r['rate']:g} | {r['prompts']} | {r['median_ttft_ms']:,.0f} | {r['p90_ttft_ms']:,.0f} | "
            f"{'yes' if r['within_slo'] else 'no'} | {r['request_goodput']:.2f} | {r['request_throughput']:.2f} | "
            f"{r['failed']} |"
        )
    return "\n".join([*lines, ""])


if sys.argv[1] == "--render":
    path = Path(sys.argv[2])
    path.with_suffix(".md").write_text(render(json.loads(path.read_text())))
    raise SystemExit(0)

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--pair", choices=sorted(TITLES), default="qwen")
parser.add_argument("--length", type=int, default=8192, help="prompt tokens")
parser.add_argument("--slo-ms", type=float, default=SLO_MS, help="the service level: p90 TTFT at most this")
parser.add_argument("out", type=Path)
parser.add_argument("tokenizer", type=Path)
parser.add_argument("rates", type=float, nargs="+")
parser.add_argument("--ours-arg", action="append", default=[], help="one more option of our server (repeatable)")
parser.add_argument("--every", action="store_true", help="run every rate (default: stop at the first one met)")
args = parser.parse_args()
m.OURS_ARGS[:] = args.ours_arg
out, tok, rates, SLO_MS, LENGTH = args.out, args.tokenizer, args.rates, args.slo_ms, args.length
out.mkdir(parents=True, exist_ok=True)
m.logging.basicConfig(level=m.logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stdout)
import vllm_gpu as base  # noqa: E402

base.install_entry_point()
if args.pair == "llama":
    target, draft = m.llama_dir("8b", tok, weights=False), m.llama_dir("1b", tok, weights=True)
else:
    target, draft = m.qwen_dir("32b", tok, weights=False), m.qwen_dir("0.5b", tok, weights=True)
served, extra = target.name, ["--load-format", "dummy"]
result: dict = {
    "command": " ".join(["python3", *sys.argv]),
    "pair": args.pair,
    "length": LENGTH,
    "gpu": m.gpu_name(),
    "engine_options": [*m.ENGINE, "--max-model-len", str(MAX_LEN), *extra],
    "ours_options": list(args.ours_arg),
    "policy": m._policy_label(),
    "slo_p90_ttft_ms": SLO_MS,
    "rates": [],
}


def save() -> None:
    (out / "ours_8k.json").write_text(json.dumps(result, indent=1, default=str))


ours = m.Server(f"{args.pair}_ours_8k", m.ours_cmd(target, draft, served, 8502, MAX_LEN, extra), 8502, out)
try:
    result["startup_s_ours"] = ours.wait()
    save()
    for rate in rates:
        prompts = int(min(160, max(m.MIN_PROMPTS, rate * m.TARGET_S)))
        tag = f"ours_{LENGTH}_{rate:g}"
        row = m.with_draft_time(
            ours, functools.partial(m.bench, ours, tok, served, LENGTH, rate, prompts, out, tag, SLO_MS)
        )
        row["within_slo"] = bool(row.get("p90_ttft_ms") is not None and row["p90_ttft_ms"] <= SLO_MS
                                 and not row.get("failed"))  # fmt: skip
        result["rates"].append(row)
        save()
        if row["within_slo"] and not args.every:
            break
    result["ours_health_after"] = m.http("GET", ours.base + "/health")[1]
    save()
finally:
    ours.stop()
