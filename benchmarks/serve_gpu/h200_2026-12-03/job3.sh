#!/usr/bin/env bash
# a later machine: our server alone (ours_only.py), no rate swept
D=/tmp/proj/benchmarks/serve_gpu/h200_2026-12-03
. $D/env.sh
cd /tmp/proj
python3 $D/ours_only.py $RES /tmp/proj/.gpujob/tok
touch $RES/job.done
