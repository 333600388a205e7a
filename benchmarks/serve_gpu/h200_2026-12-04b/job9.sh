#!/usr/bin/env bash
# the lease of 2026-12-04, second session: Llama-3.1-8B / 3.2-1B architectures, random weights, the current tree.
# Both servers with --policy paper: unloaded runs, probes and sweeps at 32K, 16K and 8K (vanilla from 0.3 of its
# unloaded capacity, as in the 32K run of 2026-12-02, ours from 0.45).
. /tmp/proj/benchmarks/serve_gpu/h200_2026-12-03/env.sh
cd /tmp/proj
python3 benchmarks/vllm_serve_gpu.py --out $RES --tokenizer /tmp/proj/.gpujob/tok --stages sweep --pair llama \
  --lengths 32768,16384,8192 --policy paper --budget 900 --budget-vanilla 400 --start-vanilla 0.3 \
  --start-ours 0.45 --vanilla-probe-reps 1 --name vllm_serve_gpu_llama_3len
touch $RES/job.done
