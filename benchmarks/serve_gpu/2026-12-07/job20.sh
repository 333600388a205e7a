#!/usr/bin/env bash
# The next lease's plan (about 1,400 s of device time with the payload's calls; BUDGET and BUDGET_VANILLA in the
# environment cut it): what the third lease of 2026-12-07 left unshown for the Llama-3.1-8B / 3.2-1B pair, our
# server with its defaults (one GPU: the engine core in the server's process; every prompt scored alone).
# First the correctness stage (about 120 s with a compile cache, 210 s without), whose "beside 16 running
# streams" rows ran with the scoring queue batching before, and which now checks the server's kept positions
# against the reference's (return_kept_positions); then both servers swept at 16K and 8K, which the pair has
# not had on the current tree (vanilla's maxima there were never found): vanilla starts at 0.6 of its
# capacity, ours at 0.6 of its own, and each length gets an equal share of a server's budget.
. /tmp/proj/benchmarks/serve_gpu/h200_2026-12-03/env.sh
cd /tmp/proj
NAME=vllm_serve_gpu_$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)_llama_16k8k
python3 benchmarks/vllm_serve_gpu.py --out $RES --tokenizer /tmp/proj/.gpujob/tok --stages correctness,sweep \
  --pair llama --lengths 16384,8192 --policy paper --budget ${BUDGET:-900} --budget-vanilla ${BUDGET_VANILLA:-400} \
  --start-vanilla 0.6 --start-ours 0.6 --min-prompts 12 --vanilla-probe-reps 1 --name $NAME
touch $RES/job.done
