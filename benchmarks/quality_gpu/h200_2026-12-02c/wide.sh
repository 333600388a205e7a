#!/usr/bin/env bash
# After jobC.sh: auto_shallow calibrated again from the cached scores of jobC's calibration, on a grid
# above its first choice (coverage 0.9 sat at the top of the first grid), then that policy evaluated on
# seeds 4 and 5 like the others (no dense rows: jobC's are joined by sample).
. /tmp/proj/.gpujob/env.sh
cd /tmp/proj || exit 1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mkdir -p .gpujob/cal2 && cp .gpujob/auto_shallow.toml .gpujob/cal2/auto_shallow_wide.toml
$PY benchmarks/calibrate_auto.py --model $MODEL --device cpu --dtype bfloat16 --policy .gpujob/cal2/auto_shallow_wide.toml \
  --coverage 0.93 0.95 0.97 --min-rate 0.05 0.08 0.1 --min-tokens 0 512 1024 --max-rate 0.2 0.25 0.3 --no-progress \
  --workers 16 --scores-cache $RES/shallow_scores.pt --out $RES --name auto_shallow_calibration_wide \
  --write-policy .gpujob/cal2/auto_shallow_wide.toml > $RES/calib_wide.log 2>&1 || exit 1
T5="niah_single niah_multikey niah_multivalue qa_squad qa_hotpot"
for s in 4 5; do for L in 32768 16384 8192 4096; do
  $PY -m specprefill_sdk eval --model $MODEL --draft $DRAFT --device cuda --dtype bfloat16 --no-plot --no-progress \
    --out $RES --name w_${L}_s$s --no-dense --lengths $L --samples 10 --seed $s --tasks $T5 \
    --methods policy:/tmp/proj/.gpujob/cal2/auto_shallow_wide.toml > $RES/w_${L}_s$s.log 2>&1 &
  sleep 4
done; done
wait; touch $RES/jobD.done
