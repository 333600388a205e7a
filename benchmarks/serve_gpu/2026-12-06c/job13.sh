#!/usr/bin/env bash
# The lease of 2026-12-06, evening (call 3: JOB=../2026-12-06c/job13.sh bash benchmarks/serve_gpu/h200_2026-12-03/setup.sh).
# Both servers unloaded, Llama-3.1-8B / 3.2-1B architectures, random weights, --policy paper, on the tree whose
# text prompts compute their token offsets on first read: one-at-a-time runs and probes at 32K and 16K, no sweep
# (--sweep-lengths 1 names no length of --lengths: nothing is swept);
# our server also runs unloaded under `auto`, the default policy, which reads the offsets.
. /tmp/proj/benchmarks/serve_gpu/h200_2026-12-03/env.sh
cd /tmp/proj
python3 benchmarks/vllm_serve_gpu.py --out $RES --tokenizer /tmp/proj/.gpujob/tok --stages sweep --pair llama \
  --lengths 32768,16384 --sweep-lengths 1 --policy paper --vanilla-probe-reps 1 --probe-policies auto \
  --name vllm_serve_gpu_h100_llama_deferred
touch $RES/job.done
