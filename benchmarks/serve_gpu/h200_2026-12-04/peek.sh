#!/usr/bin/env bash
# peek.sh N: wait up to N s for job6.sh's tokenizing check to end, print it and the job's progress
end=$((SECONDS + ${1:-60}))
while [ $SECONDS -lt $end ] && ! grep -q "tokenizing check rc" /tmp/res/job.log 2>/dev/null; do sleep 2; done
cat /tmp/res/tokdiag.log
bash /tmp/proj/benchmarks/serve_gpu/h200_2026-12-03/snap.sh 1
