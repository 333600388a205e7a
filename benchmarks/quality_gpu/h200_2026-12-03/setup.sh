#!/usr/bin/env bash
# call 1 (carry .gpujob): wheels into /tmp/site, the project into /tmp/proj, an import check; conv.sh and job.sh
# start in the background
set -e
mkdir -p /tmp/site /tmp/res /tmp/wt/in
for w in .gpujob/wheels/*.whl; do python3 -m zipfile -e "$w" /tmp/site; done
rm -rf /tmp/proj && mkdir -p /tmp/proj && cp -r specprefill_sdk benchmarks adapters policies pyproject.toml .gpujob /tmp/proj/
D=benchmarks/quality_gpu/h200_2026-12-03
cp benchmarks/quality_gpu/h200_2026-12-02/env.sh /tmp/proj/.gpujob/env.sh
cp $D/auto_text.toml /tmp/proj/.gpujob/auto_text.toml
. /tmp/proj/.gpujob/env.sh
cd /tmp/proj
$PY -c "import specprefill_sdk, gguf, pydantic, torch, transformers; print('imports ok', torch.__version__, transformers.__version__, torch.cuda.get_device_name(0))"
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv
setsid nohup bash $D/conv.sh > $RES/conv.log 2>&1 < /dev/null &
setsid nohup bash $D/job.sh > $RES/job.log 2>&1 < /dev/null &
sleep 1; echo started
