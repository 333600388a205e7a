#!/usr/bin/env bash
# For a lease with the vLLM payload (call 3: JOB=../next/scorer_job.sh bash benchmarks/serve_gpu/h200_2026-12-03/setup.sh):
# the draft's scorer in the served process's conditions (scorer_served_gpu.py), both pairs' drafts; each starts its own vLLM engine (about 130-150 s), so about seven minutes in all.
. /tmp/proj/benchmarks/serve_gpu/h200_2026-12-03/env.sh
cd /tmp/proj
for pair in llama qwen; do
  python3 benchmarks/scorer_served_gpu.py --pair $pair --lengths 32768 16384 8192 --out $RES \
    --name scorer_served_gpu_h200_$pair > $RES/scorer_$pair.log 2>&1
done
touch $RES/job.done
