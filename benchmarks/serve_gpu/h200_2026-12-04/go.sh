#!/usr/bin/env bash
# go.sh [tree] N: let job6.sh's own server start; with "tree", first bring this call's specprefill_sdk into
# /tmp/proj; then as snap.sh N
if [ "$1" = tree ]; then rm -rf /tmp/proj/specprefill_sdk && cp -r specprefill_sdk /tmp/proj/ && shift; fi
touch /tmp/go
bash /tmp/proj/benchmarks/serve_gpu/h200_2026-12-03/snap.sh "${1:-20}"
