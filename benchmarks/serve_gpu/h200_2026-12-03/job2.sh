#!/usr/bin/env bash
# the second machine (the first was taken back mid-run, then no machine twice): the Qwen2.5-32B / 0.5B
# architecture pair at 32K only, with 506 s of device time left: both servers unloaded (no rate swept), ours probed
# stage by stage; 3 prompts one at a time for each unloaded TTFT
D=/tmp/proj/benchmarks/serve_gpu/h200_2026-12-03
. $D/env.sh
cd /tmp/proj
python3 benchmarks/vllm_serve_gpu.py --out $RES --tokenizer /tmp/proj/.gpujob/tok --stages sweep --pair qwen \
  --lengths 32768 --budget 0 --budget-vanilla 0 --vanilla-probe-reps 0 \
  --min-prompts 8 --unloaded-prompts 3 --name vllm_serve_gpu_qwen
touch $RES/job.done
