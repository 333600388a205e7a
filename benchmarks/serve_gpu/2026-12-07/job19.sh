#!/usr/bin/env bash
# The next lease's plan (about 1,250 s of device time with the payload's calls): what the second lease of
# 2026-12-07 left unshown, on one GPU, our server with its defaults (one GPU: the engine core in the server's
# process). First vllm_serve_gpu.py's correctness stage, which since records the reference's logit lead at each
# divergence and builds its reference as the server compresses (about 210 s); then the Llama-3.1-8B / 3.2-1B
# pair's 32K sweep of both servers with budgets that leave each room for its rates: a budget counts from the
# server being up, and vanilla's unloaded run and probe take about 55 s of its 260, ours about 40 of its 440;
# a rate takes about 70 s. BUDGET and BUDGET_VANILLA in the environment change them.
. /tmp/proj/benchmarks/serve_gpu/h200_2026-12-03/env.sh
cd /tmp/proj
NAME=vllm_serve_gpu_$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)_llama_inproc2
python3 benchmarks/vllm_serve_gpu.py --out $RES --tokenizer /tmp/proj/.gpujob/tok --stages correctness,sweep \
  --pair llama --lengths 32768 --policy paper --budget ${BUDGET:-700} --budget-vanilla ${BUDGET_VANILLA:-260} \
  --start-vanilla 0.55 --start-ours 0.6 --min-prompts 12 --vanilla-probe-reps 1 --name $NAME
touch $RES/job.done
