#!/usr/bin/env bash
# The plan for a lease that brings an H200 (call 3: JOB=../2026-12-07/job21.sh bash
# benchmarks/serve_gpu/h200_2026-12-03/setup.sh): the Qwen2.5-32B / 0.5B architectures (random weights,
# --policy paper) on the current tree, whose server scores every prompt alone by default; the pair's last runs
# were on earlier trees. Both servers unloaded and probed at 32K, 16K and 8K for the single-request ceiling, then
# the 32K sweep, each server started near the rate where the last run found its maximum (vanilla 0.168 req/s
# met, ours 1.93 met and 2.41 missed), so that both maxima are bounded. BUDGET and BUDGET_VANILLA cut it;
# LENGTHS=32768 leaves the unloaded 16K and 8K runs out, for a lease with less time.
. /tmp/proj/benchmarks/serve_gpu/h200_2026-12-03/env.sh
cd /tmp/proj
python3 benchmarks/vllm_serve_gpu.py --out $RES --tokenizer /tmp/proj/.gpujob/tok --stages sweep --pair qwen \
  --lengths ${LENGTHS:-32768,16384,8192} --sweep-lengths 32768 --policy paper --budget ${BUDGET:-500} \
  --budget-vanilla ${BUDGET_VANILLA:-280} --start-vanilla 0.75 --start-ours 0.9 --vanilla-probe-reps 1 \
  --name vllm_serve_gpu_h200_qwen_current
touch $RES/job.done
