#!/usr/bin/env bash
# The lease of 2026-12-06 (call 3: JOB=../2026-12-06/job10.sh bash benchmarks/serve_gpu/h200_2026-12-03/setup.sh).
# 1. The Llama-3.2-1B draft's scorer alone and after vLLM's import (32K, 8K), on the tree before the change that runs the
#    look-ahead steps under the scorer's attention kernels (.gpujob/scorer_before.py) and on the tree after it.
# 2. Both servers, Llama-3.1-8B / 3.2-1B architectures, random weights, --policy paper, on the tree after it:
#    unloaded runs and probes at 32K, 16K and 8K, the rate sweep at 32K.
. /tmp/proj/benchmarks/serve_gpu/h200_2026-12-03/env.sh
rm -rf /tmp/before && cp -r /tmp/proj /tmp/before
cp /tmp/proj/.gpujob/scorer_before.py /tmp/before/specprefill_sdk/scoring/draft_attention/scorer.py
for tree in before after; do
  dir=/tmp/proj; [ $tree = before ] && dir=/tmp/before
  echo "scorer $tree: start $(date +%T)"
  (cd $dir && python3 benchmarks/scorer_served_gpu.py --pair llama --lengths 32768 8192 --no-engine \
    --out $RES --name scorer_served_gpu_llama_$tree) > $RES/scorer_$tree.log 2>&1
  grep -E " n=[0-9]+: " $RES/scorer_$tree.log | sed "s/^/scorer $tree /"
done
touch $RES/scorer.done
cd /tmp/proj
python3 benchmarks/vllm_serve_gpu.py --out $RES --tokenizer /tmp/proj/.gpujob/tok --stages sweep --pair llama \
  --lengths 32768,16384,8192 --sweep-lengths 32768 --policy paper --budget 440 --budget-vanilla 200 \
  --start-vanilla 0.3 --start-ours 0.45 --vanilla-probe-reps 1 --name vllm_serve_gpu_llama_lookahead
touch $RES/job.done
