#!/usr/bin/env bash
# call 1: wheels into /tmp/site, the project into /tmp/proj, an import check; conv.sh and jobC.sh start in the background
set -e
mkdir -p /tmp/site /tmp/res /tmp/wt/in
for w in .gpujob/wheels/*.whl; do python3 -m zipfile -e "$w" /tmp/site; done
rm -rf /tmp/proj && mkdir -p /tmp/proj && cp -r specprefill_sdk benchmarks adapters policies pyproject.toml .gpujob /tmp/proj/
. /tmp/proj/.gpujob/env.sh
cd /tmp/proj
$PY -c "import specprefill_sdk, gguf, pydantic, tiktoken, torch, transformers; print('imports ok', torch.__version__, transformers.__version__, torch.cuda.get_device_name(0))"
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv
setsid nohup bash .gpujob/conv.sh > $RES/conv.log 2>&1 < /dev/null &
setsid nohup bash .gpujob/jobC.sh > $RES/jobC.log 2>&1 < /dev/null &
sleep 1; echo started
