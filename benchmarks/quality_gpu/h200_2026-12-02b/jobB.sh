#!/usr/bin/env bash
# Real weights: the real-pair speed grid on the idle GPU, then accuracy on unseen seeds (4 and 5) at 4K-32K.
. /tmp/proj/.gpujob/env.sh
cd /tmp/proj || exit 1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
for i in $(seq 1 1500); do [ -e $RES/conv.done ] && [ -e $RES/jobA.done ] && break; sleep 1; done
run() { name=$1; shift; echo "[$(date +%T)] start $name"; $PY benchmarks/ttft_gpu.py "$@" --out $RES --name $name > $RES/$name.log 2>&1; echo "[$(date +%T)] end $name rc=$?"; }
R="--pairs real --real-target $MODEL --real-draft $DRAFT --lengths 4096 8192 16384 32768"
run ttft_gpu_h200_real_default_v2 --mode default $R --keep-rates 0.1 0.15 0.3 --look-aheads 8 1 --draft-layers 16 --repeats 3 --budget-s 150
ev() { name=$1; shift; $PY -m specprefill_sdk eval --model $MODEL --draft $DRAFT --device cuda --dtype bfloat16 --no-plot --no-progress --out $RES --name $name "$@" > $RES/$name.log 2>&1; echo "[$(date +%T)] $name rc=$?"; }
M="draft-chunked auto policy:/tmp/proj/.gpujob/auto_shallow.toml draft-early-16-last-layer"
T5="niah_single niah_multikey niah_multivalue qa_squad qa_hotpot"
echo "[$(date +%T)] eval wave"
for s in 4 5; do
  for L in 4096 8192 16384; do ev e_${L}_s$s --lengths $L --samples 10 --seed $s --tasks $T5 --methods $M --keep-rates 0.1 & sleep 2; done
  ev e_32768_s${s}_a --lengths 32768 --samples 10 --seed $s --tasks niah_single niah_multikey niah_multivalue --methods $M --keep-rates 0.1 & sleep 2
  ev e_32768_s${s}_b --lengths 32768 --samples 10 --seed $s --tasks qa_squad qa_hotpot --methods $M --keep-rates 0.1 & sleep 2
done
wait
echo "[$(date +%T)] eval done"; touch $RES/jobB.done
