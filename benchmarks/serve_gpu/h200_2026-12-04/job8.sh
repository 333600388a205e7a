#!/usr/bin/env bash
# a third machine of the lease of 2026-12-04, with its last device minutes: our server alone at 8K (ours_8k.py)
. /tmp/proj/benchmarks/serve_gpu/h200_2026-12-03/env.sh
cd /tmp/proj
python3 benchmarks/serve_gpu/h200_2026-12-04/ours_8k.py $RES /tmp/proj/.gpujob/tok 4.2 3.4 2.7 > $RES/ours_8k.log 2>&1
touch $RES/job.done
