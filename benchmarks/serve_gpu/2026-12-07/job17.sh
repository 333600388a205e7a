#!/usr/bin/env bash
# Where vLLM's engine core runs, measured on one GPU: Llama-3.1-8B / 3.2-1B architectures, random weights,
# --policy paper, 32K. First the sweep of both servers with our server's default (--engine-core auto, which on
# one GPU runs the engine core in the server's process, beside the draft); then, on the same machine, our
# server with the engine core in vLLM's own process (--engine-core subprocess, the layout of every earlier
# lease) at the lowest rate the first sweep missed and, if it misses there too, at the highest that sweep met.
# Device time was short (four tries found no machine), so vanilla's sweep starts at 0.55 of its unloaded capacity
# (about 0.40 req/s on an H100, the highest rate it met on the fourth lease of 2026-12-06) and gets 160 s;
# BUDGET and BUDGET_VANILLA in the environment change the two budgets (BUDGET_VANILLA=0: vanilla's unloaded
# TTFT, which sets the service level, and no sweep). STAGES=correctness,sweep runs vllm_serve_gpu.py's
# correctness stage first (served greedy answers against TransformersBackend's, streamed, under 16 concurrent
# requests, keep 1.0 against vanilla), in the same layout; AB=0 skips the second part.
# Each server's budget counts from the moment it is up, so its unloaded runs and probes (about 55 s for vanilla,
# 40 s for ours at 32K) spend it too. Ran on 2026-12-07's second lease as BUDGET=240 BUDGET_VANILLA=90
# STAGES=sweep,correctness AB=0: too little for vanilla's sweep (one rate), see docs/benchmarks.md.
. /tmp/proj/benchmarks/serve_gpu/h200_2026-12-03/env.sh
cd /tmp/proj
D=benchmarks/serve_gpu/2026-12-07
NAME=vllm_serve_gpu_$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)_llama_inproc
python3 benchmarks/vllm_serve_gpu.py --out $RES --tokenizer /tmp/proj/.gpujob/tok --stages ${STAGES:-sweep} --pair llama \
  --lengths 32768 --policy paper --budget ${BUDGET:-460} --budget-vanilla ${BUDGET_VANILLA:-160} \
  --start-vanilla 0.55 --start-ours 0.5 --min-prompts 12 --vanilla-probe-reps 1 --name $NAME
[ "${AB:-1}" = 0 ] && { touch $RES/job.done; exit 0; }
read -r SLO MET MISSED < <(python3 $D/ab_rates.py $RES/$NAME.json)
echo "A/B at SLO $SLO: met $MET, missed $MISSED"
python3 benchmarks/serve_gpu/h200_2026-12-04/ours_8k.py --pair llama --length 32768 --slo-ms $SLO \
  --ours-arg=--engine-core=subprocess $RES/subprocess /tmp/proj/.gpujob/tok $MISSED $MET
touch $RES/job.done
