#!/usr/bin/env bash
# the draft is joined and converted as soon as its 11 pieces (44 MiB each) are in, the target once its 25 are;
# then $RES/conv.done
. /tmp/proj/.gpujob/env.sh
cd /tmp/proj || exit 1
s=$(date +%s)
conv() { $PY -c "import sys; from specprefill_sdk.models import resolve_model_path; print(resolve_model_path(sys.argv[1], progress=False), flush=True)" "$1" || exit 1; }
while [ "$(ls /tmp/wt | grep -c '^a')" -lt 11 ]; do sleep 1; done
cat /tmp/wt/a?? > $DRAFT && sha256sum $DRAFT | cut -c1-12 && echo "[$(date +%T)] draft joined"; conv $DRAFT
echo "[$(date +%T)] draft converted"
while [ "$(ls /tmp/wt | grep -c '^b')" -lt 25 ]; do sleep 1; done
cat /tmp/wt/b?? > $MODEL && sha256sum $MODEL | cut -c1-12 && echo "[$(date +%T)] target joined"; conv $MODEL
echo "[$(date +%T)] converted in $(( $(date +%s) - s )) s"; touch $RES/conv.done
