#!/usr/bin/env bash
# The eval processes that ran out of GPU memory, started again one by one as memory frees (retried on OOM);
# then, once no eval runs any more, the real-pair speed grid on the idle GPU.
. /tmp/proj/.gpujob/env.sh
cd /tmp/proj || exit 1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
M="draft-chunked auto draft-structured draft-chunked-qmax llmlingua"
T5="niah_single niah_multikey niah_multivalue qa_squad qa_hotpot"
ev() { name=$1; shift
  for try in 1 2 3 4 5 6; do
    $PY -m specprefill_sdk eval --model $MODEL --draft $DRAFT --device cuda --dtype bfloat16 --no-plot --no-progress --out $RES --name $name "$@" > $RES/$name.log 2>&1
    rc=$?; grep -q OutOfMemoryError $RES/$name.log || break; echo "[$(date +%T)] $name out of memory, again"; sleep 15
  done; echo "[$(date +%T)] $name rc=$rc"; }
freemib() { nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1; }
launch() { while [ "$(freemib)" -lt 16000 ]; do sleep 3; done; echo "[$(date +%T)] launch $1 ($(freemib) MiB free)"; ev "$@" & sleep 25; }
launch e_16384_s2 --lengths 16384 --samples 10 --seed 2 --tasks $T5 --methods $M --keep-rates 0.1
launch e_16384_s3 --lengths 16384 --samples 10 --seed 3 --tasks $T5 --methods $M --keep-rates 0.1
for s in 2 3; do
  launch e_32768_s${s}_a --lengths 32768 --samples 10 --seed $s --tasks niah_single niah_multikey niah_multivalue --methods $M --keep-rates 0.1
  launch e_32768_s${s}_b --lengths 32768 --samples 10 --seed $s --tasks qa_squad qa_hotpot --methods $M --keep-rates 0.1
done
wait
while pgrep -f "specprefill_sdk eval" >/dev/null || pgrep -f "jobB.sh" >/dev/null; do sleep 3; done
echo "[$(date +%T)] eval done"; touch $RES/eval.done
run() { name=$1; shift; echo "[$(date +%T)] start $name"; $PY benchmarks/ttft_gpu.py "$@" --out $RES --name $name > $RES/$name.log 2>&1; echo "[$(date +%T)] end $name rc=$?"; }
R="--pairs real --real-target $MODEL --real-draft $DRAFT --lengths 4096 8192 16384 32768"
run ttft_gpu_h200_real_default --mode default $R --keep-rates 0.1 0.15 0.2 0.3 --look-aheads 8 1 --draft-layers 16 12 --repeats 3 --budget-s 120
run ttft_gpu_h200_real_compile --mode compile --no-exactness $R --keep-rates 0.1 0.3 --look-aheads 8 --repeats 3 --budget-s 60
touch $RES/jobB.done
