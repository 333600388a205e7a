#!/usr/bin/env bash
# The short form of job17.sh, for when device time is short: where vLLM's engine core runs, compared at equal
# Poisson rates on one machine. Llama-3.1-8B / 3.2-1B architectures, random weights, --policy paper, 32K.
# Vanilla `vllm serve` only for its unloaded TTFT (the service level: twice it); then our server with the
# engine core in its own process (--engine-core subprocess, every earlier lease's layout) and with the default
# (--engine-core auto: on one GPU, in the server's process beside the draft), each at every rate of RATES
# (default 1.3 and 1.47 req/s: the fourth lease of 2026-12-06 missed the level at both with the first layout).
. /tmp/proj/benchmarks/serve_gpu/h200_2026-12-03/env.sh
cd /tmp/proj
D=benchmarks/serve_gpu
RATES=${RATES:-1.3 1.47}
# SLO_MS in the environment skips vanilla (an earlier lease's level: compare the two layouts' TTFTs directly)
if [ -n "${SLO_MS:-}" ]; then SLO=$SLO_MS; else
  python3 $D/2026-12-06d/vanilla_rates.py $RES/vanilla unloaded
  SLO=$(python3 -c "import json; print(json.load(open('$RES/vanilla/vanilla_rates.json'))['slo_p90_ttft_ms'])")
fi
echo "service level $SLO ms"
for core in ${CORES:-subprocess auto}; do
  python3 $D/h200_2026-12-04/ours_8k.py --pair llama --length 32768 --slo-ms $SLO --every \
    --ours-arg=--engine-core=$core $RES/$core /tmp/proj/.gpujob/tok $RATES
done
touch $RES/job.done
