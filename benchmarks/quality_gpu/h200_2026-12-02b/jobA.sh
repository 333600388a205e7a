#!/usr/bin/env bash
# Qwen2.5-32B / 0.5B architectures, random weights, while the real weights travel: the GPU runs nothing else meanwhile.
. /tmp/proj/.gpujob/env.sh
cd /tmp/proj || exit 1
run() { name=$1; shift; echo "[$(date +%T)] start $name"; $PY benchmarks/ttft_gpu.py "$@" --out $RES --name $name > $RES/$name.log 2>&1; echo "[$(date +%T)] end $name rc=$?"; }
L="4096 8192 16384 32768"
run ttft_gpu_h200_qwen32_default --mode default --pairs qwen --lengths $L --keep-rates 0.1 0.3 --look-aheads 8 --draft-layers 16 12 --repeats 3 --budget-s 240
run ttft_gpu_h200_qwen32_compile --mode compile --no-exactness --pairs qwen --lengths $L --keep-rates 0.1 0.3 --look-aheads 8 --repeats 3 --budget-s 120
touch $RES/jobA.done
