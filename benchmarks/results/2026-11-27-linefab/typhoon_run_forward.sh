#!/bin/bash
# forward.yaml as `typhoon run` starts it: sdn on a 4-host line/mesh (emulated cluster), tcp --hosts 4 (loopback)
cd "$(dirname "$0")/../../.."; export PYTHONPATH=$PWD; OUT=${OUT:-/tmp/linefab/cli}; mkdir -p "$OUT"
for i in 1 2; do
for cfg in "sdn line" "sdn mesh" "tcp -"; do
  set -- $cfg
  t0=$(date +%s.%N)
  if [ $1 = sdn ]; then
    .venv/bin/python -m typhoon_cli run --transport sdn --hosts 4 --fabric $2 --batch-size 10 -q --report $OUT/$1-$2-$i.json topologies/forward.yaml > $OUT/$1-$2-$i.log 2>&1
  else
    .venv/bin/python -m typhoon_cli run --transport tcp --hosts 4 --batch-size 10 -q --report $OUT/$1-$2-$i.json topologies/forward.yaml > $OUT/$1-$2-$i.log 2>&1
  fi
  rc=$?
  t1=$(date +%s.%N)
  echo "$1 $2 round $i rc=$rc wall=$(echo "$t1 - $t0" | bc)"
done
done
