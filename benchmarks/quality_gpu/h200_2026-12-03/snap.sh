#!/usr/bin/env bash
# snap.sh N: wait N s, show where the jobs are, pack the results (no score caches) into $OUT/res.tgz
sleep "${1:-60}"
. /tmp/proj/.gpujob/env.sh
date +%T; ls $RES/*.done 2>/dev/null | xargs -n1 basename 2>/dev/null | tr '\n' ' '; echo
tail -3 $RES/conv.log; tail -8 $RES/job.log
for f in $RES/*.log; do case $f in *job*|*conv*) ;; *) echo "$(basename $f): $(tail -c 300 $f | tr '\r' '\n' | tail -1)";; esac; done | tail -24
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
tar czf $OUT/res.tgz --exclude='*.pt' -C $RES . && ls -la $OUT/res.tgz | awk '{print $5}'
