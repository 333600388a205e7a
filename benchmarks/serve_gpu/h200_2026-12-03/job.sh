#!/usr/bin/env bash
# the Qwen2.5-32B / 0.5B architecture pair, random weights: both servers swept at 32K and 16K
D=/tmp/proj/benchmarks/serve_gpu/h200_2026-12-03
. $D/env.sh
cd /tmp/proj
python3 benchmarks/vllm_serve_gpu.py --out $RES --tokenizer /tmp/proj/.gpujob/tok --stages sweep --pair qwen \
  --lengths 32768,16384 --budget 560 --name vllm_serve_gpu_qwen
touch $RES/job.done
