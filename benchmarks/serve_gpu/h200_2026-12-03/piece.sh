#!/usr/bin/env bash
# calls 1 and 2: keep one piece of the vLLM payload (carried as .whl/pN) under /tmp/vl
set -e
mkdir -p /tmp/vl && cp .whl/p* /tmp/vl/ && ls -la /tmp/vl
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
