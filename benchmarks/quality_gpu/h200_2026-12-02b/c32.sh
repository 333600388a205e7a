#!/usr/bin/env bash
# one call: wheels, the project, then the Qwen2.5-32B / 0.5B 32K cells in default and compile mode, results into $OUT
set -e
mkdir -p /tmp/site
for w in .gpujob/wheels/*.whl; do python3 -m zipfile -e "$w" /tmp/site; done
rm -rf /tmp/proj && mkdir -p /tmp/proj && cp -r specprefill_sdk benchmarks adapters policies pyproject.toml .gpujob /tmp/proj/
export RES=$OUT
. /tmp/proj/.gpujob/env.sh
cd /tmp/proj
for m in default compile; do
  extra=""; [ $m = compile ] && extra="--no-exactness"
  $PY benchmarks/ttft_gpu.py --mode $m $extra --pairs qwen --lengths 32768 --keep-rates 0.1 0.3 --look-aheads 8 --repeats 3 --budget-s 200 \
    --out $OUT --name ttft_gpu_h200_qwen32_32k_$m > $OUT/ttft_gpu_h200_qwen32_32k_$m.log 2>&1
  echo "$m rc=$?"; grep "^| qwen | 32768" $OUT/ttft_gpu_h200_qwen32_32k_$m.md | head -4
done
