#!/usr/bin/env bash
# the session of 2026-12-03 (afternoon), one machine: the Qwen2.5-32B / 0.5B architecture pair, random weights, both
# servers at 32K, 16K and 8K; vanilla's sweep is its first rate only (half its unloaded capacity), ours gets the rest
D=/tmp/proj/benchmarks/serve_gpu/h200_2026-12-03
. $D/env.sh
cd /tmp/proj
python3 benchmarks/vllm_serve_gpu.py --out $RES --tokenizer /tmp/proj/.gpujob/tok --stages sweep --pair qwen \
  --lengths 32768,16384,8192 --budget 451 --budget-vanilla 1 --start-vanilla 0.5 --vanilla-probe-reps 2 \
  --name vllm_serve_gpu_qwen
touch $RES/job.done
