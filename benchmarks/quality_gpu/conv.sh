#!/usr/bin/env bash
# conv.sh GGUF...: convert each GGUF once into the project's bf16 cache folder; touch $RES/conv_<stem>.done
. /tmp/job/env.sh
cd /tmp/proj || exit 1
for g in "$@"; do
  s=$(date +%s)
  $PY -c "import sys; from specprefill_sdk.models import resolve_model_path; print(resolve_model_path(sys.argv[1], progress=False), flush=True)" "$g" \
    && touch "$RES/conv_$(basename "$g" .gguf).done" && echo "converted $g in $(( $(date +%s) - s )) s"
done
