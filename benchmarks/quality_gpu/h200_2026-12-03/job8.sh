#!/usr/bin/env bash
# More unseen samples for the same fixed policies: seeds 8 and 9, dense, auto and auto_text (as calibrated by job.sh).
. /tmp/proj/.gpujob/env.sh
cd /tmp/proj || exit 1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
M="auto policy:/tmp/proj/.gpujob/cal/auto_text.toml"
T5="niah_single niah_multikey niah_multivalue qa_squad qa_hotpot"
for s in 8 9; do
  $PY -m specprefill_sdk eval --model $MODEL --draft $DRAFT --device cuda --dtype bfloat16 --no-plot --no-progress --out $RES --name f_32768_s${s}_a --lengths 32768 --samples 10 --seed $s --tasks niah_single niah_multikey niah_multivalue --methods $M > $RES/f_32768_s${s}_a.log 2>&1 &
  sleep 5
  $PY -m specprefill_sdk eval --model $MODEL --draft $DRAFT --device cuda --dtype bfloat16 --no-plot --no-progress --out $RES --name f_32768_s${s}_b --lengths 32768 --samples 10 --seed $s --tasks qa_squad qa_hotpot --methods $M > $RES/f_32768_s${s}_b.log 2>&1 &
  sleep 5
  for L in 16384 8192 4096; do
    $PY -m specprefill_sdk eval --model $MODEL --draft $DRAFT --device cuda --dtype bfloat16 --no-plot --no-progress --out $RES --name f_${L}_s$s --lengths $L --samples 10 --seed $s --tasks $T5 --methods $M > $RES/f_${L}_s$s.log 2>&1 &
    sleep 5
  done
done
wait; touch $RES/job8.done
