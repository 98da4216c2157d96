#!/bin/bash
# WORK: a scratch directory for reports, perf data and the private OVS (default /tmp/ovs-ab)
WORK=${WORK:-/tmp/ovs-ab}; export WORK; mkdir -p "$WORK"
# A/B of private ovs-vswitchd start options; one forward.yaml sdn run each
cd "$(dirname "$0")"; export OVS_RUNDIR=$WORK/ovs
TUNV=glibc.malloc.trim_threshold=268435456:glibc.malloc.top_pad=16777216
ROUNDS=${ROUNDS:-3}
for r in $(seq 1 $ROUNDS); do
 for v in ${VARIANTS:-lock nolock locktun nolocktun}; do
  [ $v = tcp ] || ./privovs.sh stop
  [ $v = tcp ] || case $v in lock) TUN= ./privovs.sh start lock;; nolock) TUN= ./privovs.sh start nolock;;
   locktun) TUN=$TUNV ./privovs.sh start lock;; nolocktun) TUN=$TUNV ./privovs.sh start nolock;; esac
  T=sdn; [ $v = tcp ] && T=tcp; ./prof.sh $T ab-$v-$r >/dev/null 2>&1
  python3 - $v $r <<'PY'
import json,sys
v,r=sys.argv[1:]
import os; t=f"{os.environ['WORK']}/ab-{v}-{r}"
rep=json.load(open(t+".json")); c0=sum(map(int,open(t+".cpu0").read().split())); c1=sum(map(int,open(t+".cpu1").read().split()))
s=rep["results"]["sink"]; n=s["received"]
print(v,r,rep["ok"],"rate %.0f"%(n/rep["elapsed_s"]),"ovs_us %.3f"%((c1-c0)/100/n*1e6),"missing",s["missing"],"dup",s["duplicates"],
 " ".join("%s %.3f"%(w["node"],w["cpu_s"]/n*1e6) for w in rep["workers"]), open(t+".load").read().split("average:")[1].split(",")[0], flush=True)
PY
 done
done
./privovs.sh stop
