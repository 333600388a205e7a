#!/usr/bin/env bash
# the lease of 2026-12-04, one machine, Qwen2.5-32B / 0.5B architectures, random weights:
# 1. where a long text prompt's tokenizing goes on this machine (tokdiag.py, about 30 s);
# 2. both servers with --policy paper: unloaded runs and probes at 32K, 16K and 8K, sweeps at 16K and 8K
#    (vanilla from 0.6, ours from 0.75 of unloaded capacity); our server also unloaded under `auto`, the
#    server's default, asked for per request. Our server starts once go.sh has run (at most 240 s after
#    vanilla's end), so that a change the tokenizing check calls for can be brought in first.
D=/tmp/proj/benchmarks/serve_gpu/h200_2026-12-04
. /tmp/proj/benchmarks/serve_gpu/h200_2026-12-03/env.sh
cd /tmp/proj
timeout 150 python3 $D/tokdiag.py /tmp/proj/.gpujob/tok $RES/tokdiag.json > $RES/tokdiag.log 2>&1
echo "tokenizing check rc $?" >> $RES/job.log
python3 benchmarks/vllm_serve_gpu.py --out $RES --tokenizer /tmp/proj/.gpujob/tok --stages sweep --pair qwen \
  --lengths 32768,16384,8192 --sweep-lengths 16384,8192 --policy paper --probe-policies auto --budget 700 \
  --budget-vanilla 320 --start-vanilla 0.6 --start-ours 0.75 --vanilla-probe-reps 2 --pause-file /tmp/go \
  --name vllm_serve_gpu_qwen_16k8k
touch $RES/job.done
