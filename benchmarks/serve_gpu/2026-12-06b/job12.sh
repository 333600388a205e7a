#!/usr/bin/env bash
# The second lease of 2026-12-06 (call 3: JOB=../2026-12-06b/job12.sh bash benchmarks/serve_gpu/h200_2026-12-03/setup.sh).
# Both servers, Llama-3.1-8B / 3.2-1B architectures, random weights, --policy paper, on the tree that runs every
# scoring pass under the scorer's attention kernels: unloaded runs and probes at 32K, 16K and 8K, rate sweeps at
# 32K and 16K. Vanilla starts at 0.45 of its unloaded capacity (the 32K rate the lease before met, 0.30 req/s)
# and rises by 1.25 from there, so its maximum is bounded from above; at least 16 prompts a rate; our server also
# runs unloaded under `auto`, the default policy.
. /tmp/proj/benchmarks/serve_gpu/h200_2026-12-03/env.sh
cd /tmp/proj
python3 benchmarks/vllm_serve_gpu.py --out $RES --tokenizer /tmp/proj/.gpujob/tok --stages sweep --pair llama \
  --lengths 32768,16384,8192 --sweep-lengths 32768,16384 --policy paper --budget 800 --budget-vanilla 380 \
  --start-vanilla 0.45 --start-ours 0.6 --min-prompts 16 --vanilla-probe-reps 1 --probe-policies auto --name vllm_serve_gpu_h100_llama_2
touch $RES/job.done
