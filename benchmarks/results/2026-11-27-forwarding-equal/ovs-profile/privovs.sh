#!/bin/bash
# WORK: a scratch directory for reports, perf data and the private OVS (default /tmp/ovs-ab)
WORK=${WORK:-/tmp/ovs-ab}; export WORK; mkdir -p "$WORK"
# start (mode: lock|nolock) or stop a private ovsdb-server + ovs-vswitchd under $WORK/ovs
D=$WORK/ovs
case $1 in
start)
  mkdir -p $D
  [ -f $D/conf.db ] || ovsdb-tool create $D/conf.db /usr/share/openvswitch/vswitch.ovsschema
  ovsdb-server $D/conf.db --remote=punix:$D/db.sock --pidfile=$D/ovsdb-server.pid --log-file=$D/ovsdb.log --detach --unixctl=$D/ovsdb-server.ctl
  OVS_RUNDIR=$D ovs-vsctl --db=unix:$D/db.sock --no-wait init
  ML=""; [ "$2" = lock ] && ML=--mlockall
  OVS_RUNDIR=$D ${TUN:+env GLIBC_TUNABLES=$TUN} ovs-vswitchd unix:$D/db.sock $ML --pidfile=$D/ovs-vswitchd.pid --log-file=$D/vswitchd.log --detach -vconsole:emer
  ;;
stop)
  OVS_RUNDIR=$D ovs-appctl -t $D/ovs-vswitchd.$(cat $D/ovs-vswitchd.pid).ctl exit 2>/dev/null
  ovs-appctl -t $D/ovsdb-server.ctl exit 2>/dev/null
  sleep 0.5
  ;;
esac
