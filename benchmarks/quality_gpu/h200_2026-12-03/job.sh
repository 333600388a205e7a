#!/usr/bin/env bash
# Real weights, unseen seeds 6 and 7 at 4K-32K: dense, paper and auto; meanwhile the candidate auto_text (auto
# with text chunks) is calibrated on seeds 0/1 and then evaluated on seeds 6/7 too. Then the real-pair TTFT grid
# on the idle GPU. Launches wait for free GPU memory (retried on OOM).
. /tmp/proj/.gpujob/env.sh
cd /tmp/proj || exit 1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
for i in $(seq 1 1500); do [ -e $RES/conv.done ] && break; sleep 1; done
ev() { name=$1; shift
  for try in 1 2 3 4 5 6; do
    $PY -m specprefill_sdk eval --model $MODEL --draft $DRAFT --device cuda --dtype bfloat16 --no-plot --no-progress --out $RES --name $name "$@" > $RES/$name.log 2>&1
    rc=$?; grep -q OutOfMemoryError $RES/$name.log || break; echo "[$(date +%T)] $name out of memory, again"; sleep 15
  done; echo "[$(date +%T)] $name rc=$rc"; }
freemib() { nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1; }
launch() { while [ "$(freemib)" -lt 22000 ]; do sleep 3; done; echo "[$(date +%T)] launch $1 ($(freemib) MiB free)"; ev "$@" & sleep 15; }
mkdir -p .gpujob/cal && cp .gpujob/auto_text.toml .gpujob/cal/auto_text.toml
echo "[$(date +%T)] calibration"
( $PY benchmarks/calibrate_auto.py --model $MODEL --draft $DRAFT --device cuda --dtype bfloat16 \
    --policy .gpujob/cal/auto_text.toml --coverage 0.5 0.6 0.7 0.8 0.9 --min-rate 0.12 0.13 0.14 \
    --min-tokens 1024 1088 1152 --max-rate 0.2 0.3 --no-progress --workers 8 --scores-cache $RES/text_scores.pt \
    --out $RES --name auto_text_calibration --write-policy .gpujob/cal/auto_text.toml > $RES/calib.log 2>&1
  echo "[$(date +%T)] calibration rc=$?"; tail -5 $RES/calib.log; touch $RES/calib.done ) &
sleep 20
M="draft-chunked auto"
T5="niah_single niah_multikey niah_multivalue qa_squad qa_hotpot"
for s in 6 7; do
  launch e_32768_s${s}_a --lengths 32768 --samples 10 --seed $s --tasks niah_single niah_multikey niah_multivalue --methods $M --keep-rates 0.1
  launch e_32768_s${s}_b --lengths 32768 --samples 10 --seed $s --tasks qa_squad qa_hotpot --methods $M --keep-rates 0.1
done
for s in 6 7; do for L in 16384 8192 4096; do
  launch e_${L}_s$s --lengths $L --samples 10 --seed $s --tasks $T5 --methods $M --keep-rates 0.1
done; done
for i in $(seq 1 1500); do [ -e $RES/calib.done ] && break; sleep 1; done
sed -n '/selector/,/chunking/p' .gpujob/cal/auto_text.toml
for s in 6 7; do for L in 32768 16384 8192 4096; do
  launch t_${L}_s$s --no-dense --lengths $L --samples 10 --seed $s --tasks $T5 --methods policy:/tmp/proj/.gpujob/cal/auto_text.toml
done; done
wait
while pgrep -f "specprefill_sdk eval" >/dev/null; do sleep 3; done
echo "[$(date +%T)] eval done"; touch $RES/eval.done
$PY benchmarks/ttft_gpu.py --mode default --pairs real --real-target $MODEL --real-draft $DRAFT --lengths 4096 8192 16384 32768 \
  --keep-rates 0.1 0.15 0.3 --look-aheads 8 1 --draft-layers 16 --repeats 3 --budget-s 150 --out $RES --name ttft_gpu_h200_real_default_v4 > $RES/ttft_v4.log 2>&1
echo "[$(date +%T)] ttft rc=$?"; touch $RES/job.done
