#!/usr/bin/env bash
# snap.sh: progress table of every result file, then everything under $RES packed into $OUT/res.tgz
. /tmp/job/env.sh
$PY - <<'PY'
import json, glob, os, collections
for f in sorted(glob.glob(os.environ["RES"] + "/*.json")):
    try:
        d = json.load(open(f))
    except Exception as e:
        print(os.path.basename(f), "unreadable", e); continue
    ids = {r["id"] for r in d["records"]}
    acc = collections.defaultdict(list)
    for r in d["records"]:
        if r.get("contains") is not None: acc[(r["method"], r["keep_rate"])].append(r["contains"])
    s = " ".join(f"{m}@{k:g}={100*sum(v)/len(v):.0f}%" for (m, k), v in acc.items())
    print(f"{os.path.basename(f)}: {len(ids)} samples, {len(d['records'])} rec, {d['elapsed_s']}s, err {len(d['errors'])} | {s}")
PY
ls "$RES"/*.done 2>/dev/null | xargs -n1 basename 2>/dev/null | tr '\n' ' '; echo
for f in "$RES"/*.log; do t=$(tail -c 300 "$f" | tr '\r' '\n' | grep -v '^\s*$' | tail -1); case "$t" in *rror*|*raceback*) echo "$(basename $f): $t";; esac; done
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
[ -n "$OUT" ] && tar czf "$OUT/res.tgz" -C "$(dirname "$RES")" "$(basename "$RES")" && ls -l "$OUT/res.tgz"
