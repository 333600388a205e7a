#!/usr/bin/env bash
# Real weights: calibrate auto (seeds 0 and 1), evaluate on other seeds (2 and 3), then the real-pair speed grid.
. /tmp/proj/.gpujob/env.sh
cd /tmp/proj || exit 1
for i in $(seq 1 1500); do [ -e $RES/conv.done ] && [ -e $RES/jobA.done ] && break; sleep 1; done
echo "[$(date +%T)] calibration"
ACC=""; for p in "" keep023_; do for l in 4k 8k 16k 32k; do ACC="$ACC benchmarks/results/quality_gpu_qwen_real_${p}${l}.json"; done; done
$PY benchmarks/calibrate_auto.py --model $MODEL --draft $DRAFT --device cuda --dtype bfloat16 --accuracy $ACC \
  --coverage 0.6 0.7 0.8 0.9 0.95 --min-rate 0.05 0.08 0.1 0.12 --min-tokens 0 512 1024 1536 2048 --max-rate 0.2 0.3 \
  --no-progress --scores-cache $RES/calib_scores.pt --out $RES --name auto_calibration --write-policy policies/auto.toml > $RES/calibration.log 2>&1
echo "[$(date +%T)] calibration rc=$?"; cat policies/auto.toml | grep -E "^(coverage|min_rate|min_tokens|max_rate) ="
ev() { name=$1; shift; $PY -m specprefill_sdk eval --model $MODEL --draft $DRAFT --device cuda --dtype bfloat16 --no-plot --no-progress --out $RES --name $name "$@" > $RES/$name.log 2>&1; echo "[$(date +%T)] $name rc=$?"; }
M="draft-chunked auto draft-structured draft-chunked-qmax llmlingua"
T5="niah_single niah_multikey niah_multivalue qa_squad qa_hotpot"
echo "[$(date +%T)] eval wave"
for s in 2 3; do
  for L in 4096 8192 16384; do ev e_${L}_s$s --lengths $L --samples 10 --seed $s --tasks $T5 --methods $M --keep-rates 0.1 & done
  ev e_32768_s${s}_a --lengths 32768 --samples 10 --seed $s --tasks niah_single niah_multikey niah_multivalue --methods $M --keep-rates 0.1 &
  ev e_32768_s${s}_b --lengths 32768 --samples 10 --seed $s --tasks qa_squad qa_hotpot --methods $M --keep-rates 0.1 &
  ev d_8192_s$s --no-dense --lengths 8192 --samples 10 --seed $s --tasks $T5 --methods draft-chunked-la1 draft-early-16 draft-early-16-mean draft-early-16-last-layer draft-early-12-mean target-early-14-last-layer --keep-rates 0.1 &
done
# why shallow scoring collapses: evidence recall by depth and aggregation, recall only, on the calibration seeds
DM=""; for n in 4 8 12 16 20 24; do DM="$DM draft-early-$n draft-early-$n-mean draft-early-$n-content-mean draft-early-$n-last-layer"; done
TM=""; for n in 7 14 21 28; do TM="$TM target-early-$n target-early-$n-mean target-early-$n-last-layer"; done
for s in 0 1; do ev r_8192_s$s --lengths 8192 --samples 10 --seed $s --tasks $T5 --methods $DM $TM --keep-rates 0.1 --no-generate & done
# the frontier's other keep shares, on the same samples (seeds 2 then 3 in one chain per length)
for L in 4096 8192 16384 32768; do
  ( for s in 2 3; do ev k_${L}_s$s --no-dense --lengths $L --samples 10 --seed $s --tasks $T5 --methods draft-chunked --keep-rates 0.2 0.3; done ) &
done
wait
echo "[$(date +%T)] eval done"; touch $RES/eval.done
run() { name=$1; shift; echo "[$(date +%T)] start $name"; $PY benchmarks/ttft_gpu.py "$@" --out $RES --name $name > $RES/$name.log 2>&1; echo "[$(date +%T)] end $name rc=$?"; }
L="4096 8192 16384 32768"
R="--pairs real --real-target $MODEL --real-draft $DRAFT --lengths $L"
run ttft_gpu_h200_real_default --mode default $R --keep-rates 0.1 0.15 0.2 0.3 --look-aheads 8 1 --draft-layers 16 12 --repeats 3 --budget-s 120
run ttft_gpu_h200_real_compile --mode compile --no-exactness $R --keep-rates 0.1 0.3 --look-aheads 8 --repeats 3 --budget-s 60
touch $RES/jobB.done
