#!/usr/bin/env bash
# The lease of 2026-12-06, last minutes (call 3: JOB=../2026-12-06/job11.sh bash benchmarks/serve_gpu/h200_2026-12-03/setup.sh):
# the Llama-3.2-1B draft's scorer built after vLLM's import, as the server builds it, on the tree before the change
# (.gpujob/scorer_before.py) and after it. job10.sh imported vLLM only after the scorers were built and compiled.
. /tmp/proj/benchmarks/serve_gpu/h200_2026-12-03/env.sh
rm -rf /tmp/before && cp -r /tmp/proj /tmp/before
cp /tmp/proj/.gpujob/scorer_before.py /tmp/before/specprefill_sdk/scoring/draft_attention/scorer.py
for tree in before after; do
  dir=/tmp/proj; [ $tree = before ] && dir=/tmp/before
  (cd $dir && python3 benchmarks/scorer_served_gpu.py --pair llama --lengths 32768 8192 --repeats 3 --vllm-first \
    --out $RES --name scorer_served_gpu_llama_vllm_first_$tree) > $RES/scorer_first_$tree.log 2>&1
  grep -E " n=[0-9]+: " $RES/scorer_first_$tree.log | sed "s/^/scorer $tree /"
done
touch $RES/job.done
