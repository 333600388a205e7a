#!/usr/bin/env bash
# snap.sh N: wait N s (or until the job is done), show where it is, pack the results into $OUT/res.tgz
. /tmp/proj/benchmarks/serve_gpu/h200_2026-12-03/env.sh
end=$((SECONDS + ${1:-60}))
while [ $SECONDS -lt $end ] && [ ! -e $RES/job.done ]; do sleep 5; done
date +%T; ls $RES/job.done 2>/dev/null
grep -E "healthy|rate |probe|failed|Error|error" $RES/job.log | tail -14
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
tar czf $OUT/res.tgz -C $RES . && ls -la $OUT/res.tgz | awk '{print $5}'
