#!/usr/bin/env bash
# the second machine of the lease of 2026-12-04 (the first, job6.sh, was released after its tokenizing check):
# Qwen2.5-32B / 0.5B architectures, random weights, the tree with the tokenizer's pieces that check called for.
# Both servers with --policy paper: unloaded runs and probes at 32K, 16K and 8K, sweeps at 16K and 8K (vanilla
# from 0.6, ours from 0.75 of unloaded capacity); our server also unloaded under `auto`, the server's default,
# asked for per request.
. /tmp/proj/benchmarks/serve_gpu/h200_2026-12-03/env.sh
cd /tmp/proj
python3 benchmarks/vllm_serve_gpu.py --out $RES --tokenizer /tmp/proj/.gpujob/tok --stages sweep --pair qwen \
  --lengths 32768,16384,8192 --sweep-lengths 16384,8192 --policy paper --probe-policies auto --budget 620 \
  --budget-vanilla 300 --start-vanilla 0.6 --start-ours 0.75 --vanilla-probe-reps 2 --name vllm_serve_gpu_qwen_16k8k
touch $RES/job.done
