"""The committed results of job18.sh (2026-12-07): our server at one Poisson rate with vLLM's engine core in the
server's process (``--engine-core auto`` on one GPU) and in vLLM's own process (``--engine-core subprocess``).

Usage: ``python benchmarks/serve_gpu/2026-12-07/engine_core.py RES OUT_DIR``. RES is job18.sh's results folder
(``auto/`` and ``subprocess/``, each an ``ours_8k.py`` run); it writes ``NAME.json``, ``.md`` and ``.png`` under
OUT_DIR. ``--render OUT_DIR/NAME.json`` rewrites the markdown and the plot from the JSON.
"""

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from _common import save_figure, write_results

NAME = "vllm_serve_gpu_h100_llama_engine_core"
LAYOUTS = {"auto": "engine core in the server's process (auto)", "subprocess": "engine core in its own process"}
#: The fourth lease of 2026-12-06 (another H100 machine, the tree of f401604, the subprocess layout), whose
#: vanilla service level this run reuses.
EARLIER = Path(__file__).resolve().parents[2] / "results" / "vllm_serve_gpu_h100_llama_sweep3.json"


def earlier_lease() -> dict[str, float]:
    """Vanilla's bracket and the draft's unloaded scoring at 32K, from the fourth lease's committed results."""
    row = json.loads(EARLIER.read_text())["stages"]["sweep_llama"]["lengths"]["32768"]
    met = max(r["rate"] for r in row["vanilla"] if r["within_slo"])
    return {
        "vanilla_max_met": met,
        "vanilla_min_missed": min(r["rate"] for r in row["vanilla"] if not r["within_slo"] and r["rate"] > met),
        "draft_alone_ms": row["components"]["score_ms"],
    }


def collect(res: Path) -> dict[str, Any]:
    runs = {core: json.loads((res / core / "ours_8k.json").read_text()) for core in LAYOUTS}
    first = runs["auto"]
    rows = []
    for core, run in runs.items():
        health = run.get("ours_health_after") or {}
        for rate in run["rates"]:
            rows.append(
                {
                    "layout": core,
                    "engine_core": health.get("engine_core"),
                    "startup_s": run["startup_s_ours"],
                    **{k: rate.get(k) for k in ("rate", "prompts", "failed", "request_goodput", "request_throughput")},
                    **{k: rate.get(k) for k in ("median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "mean_ttft_ms")},
                    "median_tpot_ms": rate.get("median_tpot_ms"),
                    "within_slo": rate["within_slo"],
                    "draft_ms_per_prompt": rate.get("draft_ms_per_prompt"),
                }
            )
    return {
        "gpu": first["gpu"],
        "pair": "Llama-3.1-8B / Llama-3.2-1B architectures, random weights (--load-format dummy), bf16",
        "length": first["length"],
        "policy": first["policy"],
        "engine_options": first["engine_options"],
        "slo_p90_ttft_ms": first["slo_p90_ttft_ms"],
        "commands": {core: run["command"] for core, run in runs.items()},
        "earlier": earlier_lease(),
        "rows": rows,
    }


def render(result: dict[str, Any]) -> str:
    slo = result["slo_p90_ttft_ms"]
    lines = [
        f"# Where vLLM's engine core runs: our server at 32K ({result['gpu']})",
        "",
        f"{result['pair']}; `--policy paper`; engine options `{' '.join(result['engine_options'])}`; "
        f"`vllm bench serve`, random dataset, {result['length']:,} in, 128 out, `--ignore-eos`, Poisson arrivals. "
        f"Service level: p90 TTFT at most {slo:,.1f} ms, twice vanilla `vllm serve`'s unloaded TTFT on the fourth "
        "lease of 2026-12-06 (another H100 machine; vanilla was not run here). Both layouts ran one after the other "
        "on the same machine, 2026-12-07, from `benchmarks/serve_gpu/2026-12-07/job18.sh`.",
        "",
        "| engine core | rate (req/s) | prompts | TTFT p50 | TTFT p90 | TTFT p99 | within the level | "
        "goodput (req/s) | TPOT p50 | draft ms per prompt | start-up (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {LAYOUTS[r['layout']]} | {r['rate']:g} | {r['prompts']} | {r['median_ttft_ms']:,.0f} | "
            f"{r['p90_ttft_ms']:,.0f} | {r['p99_ttft_ms']:,.0f} | {'yes' if r['within_slo'] else 'no'} | "
            f"{r['request_goodput']:.2f} | {r['median_tpot_ms']:.1f} | {r['draft_ms_per_prompt']:.0f} | "
            f"{r['startup_s']:.0f} |"
        )
    rows = {r["layout"]: r for r in result["rows"]}
    inproc, sub = rows["auto"], rows["subprocess"]
    earlier = result["earlier"]
    lines += [
        "",
        f"- With the engine core beside the draft, p50 TTFT is {inproc['median_ttft_ms'] / sub['median_ttft_ms']:.2f}x "
        f"and p90 {inproc['p90_ttft_ms'] / sub['p90_ttft_ms']:.2f}x the other layout's, and the draft scores a 32K "
        f"prompt in {inproc['draft_ms_per_prompt']:.0f} ms under load against {sub['draft_ms_per_prompt']:.0f} "
        f"(alone: {earlier['draft_alone_ms']:.1f} ms on the earlier lease's machine).",
        f"- Against the earlier lease's vanilla (highest rate met {earlier['vanilla_max_met']:g} req/s, lowest missed "
        f"{earlier['vanilla_min_missed']:.3g}), {inproc['rate']:g} req/s within the level is "
        f"{inproc['rate'] / earlier['vanilla_max_met']:.2f}x; two runs on two machines, so not a ratio measured in one "
        "run, and our server's maximum in this layout was not bracketed (one rate only).",
        "",
        "Commands:",
        "",
        *[f"- {LAYOUTS[core]}: `{cmd}`" for core, cmd in result["commands"].items()],
        "",
    ]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, (ttft, draft) = plt.subplots(1, 2, figsize=(10, 4.2))
    width = 0.38
    for i, key in enumerate(("median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms")):
        for j, r in enumerate(rows):
            color = "tab:blue" if r["layout"] == "auto" else "tab:gray"
            ttft.bar(i + (j - 0.5) * width, r[key], width, color=color, label=LAYOUTS[r["layout"]] if i == 0 else None)
    ttft.axhline(result["slo_p90_ttft_ms"], color="tab:red", ls=":", lw=1, label="service level (p90)")
    ttft.set_xticks(range(3), ["p50", "p90", "p99"])
    ttft.set_ylabel("TTFT (ms)")
    ttft.set_title(f"TTFT at {rows[0]['rate']:g} req/s, {result['length']:,}-token prompts", fontsize=10)
    ttft.legend(fontsize=7, loc="upper left")
    for j, r in enumerate(rows):
        draft.bar(j, r["draft_ms_per_prompt"], color="tab:blue" if r["layout"] == "auto" else "tab:gray")
    draft.axhline(result["earlier"]["draft_alone_ms"], color="black", ls="--", lw=1, label="alone (earlier lease)")
    draft.set_xticks(range(len(rows)), ["server's process" if r["layout"] == "auto" else "own process" for r in rows])
    draft.set_xlabel("vLLM's engine core")
    draft.set_ylabel("draft scoring per 32K prompt under load (ms)")
    draft.set_title(f"{result['gpu']}, Llama-3.1-8B / 3.2-1B", fontsize=10)
    draft.legend(fontsize=7)
    save_figure(fig, path)


if __name__ == "__main__":
    if sys.argv[1] == "--render":
        data = json.loads(Path(sys.argv[2]).read_text())
        out = Path(sys.argv[2]).parent
    else:
        data, out = collect(Path(sys.argv[1])), Path(sys.argv[2])
    write_results(out, NAME, data, render, plot)
