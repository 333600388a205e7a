#!/usr/bin/env bash
# one weight piece per call, moved out of the repository (renamed into place only once whole)
mv .weights/* /tmp/wt/in/ 2>/dev/null; mv /tmp/wt/in/* /tmp/wt/ 2>/dev/null
echo "pieces a $(ls /tmp/wt | grep -c '^a') b $(ls /tmp/wt | grep -c '^b')"; tail -2 /tmp/res/conv.log
