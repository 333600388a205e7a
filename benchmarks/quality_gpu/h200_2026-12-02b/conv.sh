#!/usr/bin/env bash
# both GGUFs converted once into the project's bf16 cache folder, then $RES/conv.done
. /tmp/proj/.gpujob/env.sh
cd /tmp/proj || exit 1
s=$(date +%s)
for g in $DRAFT $MODEL; do
  $PY -c "import sys; from specprefill_sdk.models import resolve_model_path; print(resolve_model_path(sys.argv[1], progress=False), flush=True)" "$g" || exit 1
done
echo "converted in $(( $(date +%s) - s )) s"; touch $RES/conv.done
