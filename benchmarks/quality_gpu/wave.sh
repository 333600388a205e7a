#!/usr/bin/env bash
# wave.sh TAG SAMPLES "METHODS" "RATES" LENGTH... : one eval process per (length, seed in 0 1), all in parallel.
# Waits for both converted models first (conv.sh). Each process writes $RES/<TAG>_<L>_s<seed>.{json,md,partial.json,log}.
. /tmp/job/env.sh
tag=$1; samples=$2; methods=$3; rates=$4; shift 4
cd /tmp/proj || exit 1
for i in $(seq 1 240); do [ -e "$RES/conv_qwen05.done" ] && [ -e "$RES/conv_qwen15.done" ] && break; sleep 1; done
echo "wave $tag start $(date +%T)"
for L in "$@"; do
  for seed in ${SEEDS:-0 1}; do
    name=${tag}_${L}_s${seed}
    $PY -m specprefill_sdk eval --model "$MODEL" --draft "$DRAFT" --lengths "$L" --samples "$samples" --seed "$seed" \
      ${TASKS:+--tasks $TASKS} --methods $methods --keep-rates $rates --device "$DEVICE" --dtype bfloat16 --no-plot --no-progress \
      --out "$RES" --name "$name" > "$RES/$name.log" 2>&1 &
  done
done
wait
echo "wave $tag done $(date +%T)"
touch "$RES/wave_$tag.done"
