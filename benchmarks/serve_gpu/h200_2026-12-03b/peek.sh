#!/usr/bin/env bash
# peek.sh N: wait up to N s for job5.sh's attention check to end, print its tables and the job's progress
end=$((SECONDS + ${1:-60}))
while [ $SECONDS -lt $end ] && ! grep -q "attention check rc" /tmp/res/job.log 2>/dev/null; do sleep 3; done
cat /tmp/res/attn/*.md 2>/dev/null; tail -5 /tmp/res/attn.log
bash /tmp/proj/benchmarks/serve_gpu/h200_2026-12-03/snap.sh 1
