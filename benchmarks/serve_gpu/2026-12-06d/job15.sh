#!/usr/bin/env bash
# The lease of 2026-12-06, night (call 3: JOB=../2026-12-06d/job15.sh bash benchmarks/serve_gpu/h200_2026-12-03/setup.sh).
# Qwen2.5-32B / 0.5B architectures, random weights, --policy paper, on the tree that defers a text prompt's
# offsets (the pair's last run was on 6b3f7b8): both servers unloaded and probed at 32K, 16K and 8K for the
# single-request ceiling, then the 32K sweep, each server started near the rate where the last run found
# its maximum (vanilla 0.168 req/s met, ours 1.93 met and 2.41 missed), so that both maxima are bounded.
. /tmp/proj/benchmarks/serve_gpu/h200_2026-12-03/env.sh
cd /tmp/proj
python3 benchmarks/vllm_serve_gpu.py --out $RES --tokenizer /tmp/proj/.gpujob/tok --stages sweep --pair qwen \
  --lengths 32768,16384,8192 --sweep-lengths 32768 --policy paper --budget 500 --budget-vanilla 280 \
  --start-vanilla 0.75 --start-ours 0.9 --vanilla-probe-reps 1 --name vllm_serve_gpu_qwen_deferred
touch $RES/job.done
