#!/usr/bin/env bash
# The lease of 2026-12-06, evening, call 5: run as the command of one `run` call, in the foreground, right
# after job13.sh had finished on the same machine (the payload and /tmp/proj already in place).
# Both servers started again and unloaded at 8K: the Llama-3.1-8B / 3.2-1B architectures, random weights,
# --policy paper, and `auto` per request.
. benchmarks/serve_gpu/h200_2026-12-03/env.sh && cd /tmp/proj && timeout 480 python3 benchmarks/vllm_serve_gpu.py \
  --out $RES --tokenizer /tmp/proj/.gpujob/tok --stages sweep --pair llama --lengths 8192 --sweep-lengths 1 \
  --policy paper --vanilla-probe-reps 1 --probe-policies auto --name vllm_serve_gpu_h100_llama_deferred_8k \
  > $RES/job8k.log 2>&1
echo rc $?
grep -E "healthy|rate |probe|failed|Error|error" $RES/job8k.log | tail -14
tar czf $OUT/res8k.tgz -C $RES . && ls -la $OUT/res8k.tgz | awk '{print $5}'
