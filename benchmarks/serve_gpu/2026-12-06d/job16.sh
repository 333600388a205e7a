#!/usr/bin/env bash
# The fallback where no H200 starts (an H100 cannot hold the Qwen2.5-32B target with a 32K cache):
# Llama-3.1-8B / 3.2-1B architectures, random weights, --policy paper, the tree that defers a text prompt's
# offsets; the 32K sweep with vanilla started lower than in the second lease (0.4 of its capacity, not 0.45),
# where its maximum lay between 0.30 and 0.45 req/s, so that it is bounded more tightly; 32K only (three tries found no machine).
. /tmp/proj/benchmarks/serve_gpu/h200_2026-12-03/env.sh
cd /tmp/proj
python3 benchmarks/vllm_serve_gpu.py --out $RES --tokenizer /tmp/proj/.gpujob/tok --stages sweep --pair llama \
  --lengths 32768 --policy paper --budget 520 --budget-vanilla 300 \
  --start-vanilla 0.4 --start-ours 0.6 --min-prompts 12 --vanilla-probe-reps 1 --name vllm_serve_gpu_h100_llama_sweep3
touch $RES/job.done
