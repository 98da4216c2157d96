#!/bin/bash
# WORK: a scratch directory for reports, perf data and the private OVS (default /tmp/ovs-ab)
WORK=${WORK:-/tmp/ovs-ab}; export WORK; mkdir -p "$WORK"
# one sdn forward.yaml run (one host) with perf on ovs-vswitchd
set -u
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"; export PYTHONPATH=$PWD
T=${1:-sdn}; TAG=${2:-p}; N=${3:-3000000}
if [ -n "${OVS_RUNDIR:-}" -a -f "${OVS_RUNDIR:-}/ovs-vswitchd.pid" ]; then OVS=$(cat $OVS_RUNDIR/ovs-vswitchd.pid); else OVS=$(cat /var/run/openvswitch/ovs-vswitchd.pid); fi
ovs-appctl coverage/show > $WORK/$TAG.cov0
ovs-appctl dpif-netdev/pmd-stats-clear >/dev/null
cat /proc/$OVS/stat | awk '{print $14, $15}' > $WORK/$TAG.cpu0
PP=
if [ -z "${NOPERF:-}" ]; then perf record -F 999 -g -p $OVS -o $WORK/$TAG.perf.data >/dev/null 2>&1 & PP=$!; fi
uptime > $WORK/$TAG.load
(sleep 3; ovs-appctl dpif-netdev/pmd-stats-show > $WORK/$TAG.pmdA 2>&1; ovs-appctl coverage/show > $WORK/$TAG.covA; sleep 2; ovs-appctl dpif-netdev/pmd-stats-show > $WORK/$TAG.pmdB 2>&1; ovs-appctl coverage/show > $WORK/$TAG.covB; ovs-ofctl dump-ports tys1 > $WORK/$TAG.ports 2>&1; ovs-vsctl show > $WORK/$TAG.show) &
.venv/bin/typhoon run topologies/forward.yaml --transport $T --hosts 1 --arg source.count=$N -q --report $WORK/$TAG.json > $WORK/$TAG.out 2>&1
[ -n "${NOPERF:-}" ] || { kill -INT $PP; wait $PP; }
cat /proc/$OVS/stat | awk '{print $14, $15}' > $WORK/$TAG.cpu1
ovs-appctl dpif-netdev/pmd-stats-show > $WORK/$TAG.pmd
ovs-appctl coverage/show > $WORK/$TAG.cov1
uptime >> $WORK/$TAG.load
