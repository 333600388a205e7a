#!/usr/bin/env bash
# one weight piece per call: move it out of the repository; with all 32 present, join, check and convert
mkdir -p /tmp/wt && mv .weights/* /tmp/wt/ 2>/dev/null
n=$(ls /tmp/wt | wc -l); echo "pieces $n"
if [ "$n" -ge 35 ] && [ ! -e /tmp/joined ]; then
  cat /tmp/wt/a?? > /tmp/qwen05.gguf && cat /tmp/wt/b?? > /tmp/qwen15.gguf
  sha256sum /tmp/qwen05.gguf /tmp/qwen15.gguf | cut -c1-12
  touch /tmp/joined
  . /tmp/proj/.gpujob/env.sh
  cd /tmp/proj && setsid nohup nice -n 10 bash .gpujob/conv.sh > $RES/conv.log 2>&1 < /dev/null &
fi
tail -2 /tmp/res/jobA.log
