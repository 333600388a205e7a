#!/usr/bin/env bash
# call 3: the last payload piece, unpack vLLM into /tmp/site, the project into /tmp/proj, an import check,
# then job.sh in the background
set -e
cp .whl/p* /tmp/vl/ && mkdir -p /tmp/site && cat /tmp/vl/p0 /tmp/vl/p1 /tmp/vl/p2 | xz -dc -T0 | tar -x -C /tmp/site
rm -rf /tmp/proj && mkdir -p /tmp/proj && cp -r specprefill_sdk benchmarks adapters policies pyproject.toml .gpujob /tmp/proj/
D=/tmp/proj/benchmarks/serve_gpu/h200_2026-12-03
. $D/env.sh
cd /tmp/proj
python3 -c "import vllm, specprefill_sdk.server, fastapi, uvicorn, opentelemetry; print('imports ok', vllm.__version__)"
nproc; python3 -c "import os; print(len(os.sched_getaffinity(0)))"
setsid nohup bash $D/${JOB:-job.sh} > $RES/job.log 2>&1 < /dev/null &
sleep 2; echo started
