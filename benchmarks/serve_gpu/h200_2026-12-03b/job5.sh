#!/usr/bin/env bash
# the lease of 2026-12-03 (evening), one machine, Qwen2.5-32B / 0.5B architectures, random weights:
# 1. what a new prompt length costs the draft's attention, per SDPA kernel and for the scorer in two kernel orders;
# 2. the job waits (at most 150 s) for go.sh, which may first bring the tree's draft-kernel default decided on 1.;
# 3. both servers with --policy paper: the 32K sweep (vanilla from 0.6, ours from 0.75 of unloaded capacity),
#    unloaded runs and probes at 16K and 8K for the single-request ceiling at each length.
D=/tmp/proj/benchmarks/serve_gpu/h200_2026-12-03b
. /tmp/proj/benchmarks/serve_gpu/h200_2026-12-03/env.sh
cd /tmp/proj
timeout 300 python3 benchmarks/attention_lengths_gpu.py --draft qwen2.5-0.5b --lengths 8192 16384 32768 \
  --out $RES/attn > $RES/attn.log 2>&1
echo "attention check rc $?" >> $RES/job.log
end=$((SECONDS + 150))
while [ $SECONDS -lt $end ] && [ ! -e /tmp/go ]; do sleep 2; done
cd /tmp/proj
grep -n "DEFAULT_ATTENTION_BACKENDS" specprefill_sdk/runtime/attention.py >> $RES/job.log
python3 benchmarks/vllm_serve_gpu.py --out $RES --tokenizer /tmp/proj/.gpujob/tok --stages sweep --pair qwen \
  --lengths 32768,16384,8192 --sweep-lengths 32768 --policy paper --budget 420 --budget-vanilla 200 \
  --start-vanilla 0.6 --start-ours 0.75 --vanilla-probe-reps 2 --name vllm_serve_gpu_qwen_paper
touch $RES/job.done
