#!/usr/bin/env bash
# Set up everything Typhoon needs on a Debian 12 machine, as root. Idempotent.
#
#   1. Debian packages: Open vSwitch, Mininet (for `mnexec` and `mn -c`), iproute2,
#      tcpdump, Prometheus, Chromium with its WebDriver, and ZooKeeper (installed, not
#      started: the tests start their own server on a free port, tests/zkserver.py; a
#      deployment points TYPHOON_COORDINATOR=zk://... at its ensemble).
#   2. $REPO/.venv with Python 3.11: Ryu 4.34 (with the fixes below), then the
#      project itself (`pip install -e .[ryu,test,spark,zk,emulation,bench]`), which pulls
#      every other dependency from pyproject.toml, os-ken among them: the controller runs
#      on Ryu here (controller/framework/backend.py prefers it), on os-ken with --backend os-ken.
#   3. Open vSwitch running (userspace datapath only: no kernel module needed).
#
# A second run is fast: apt is skipped when nothing is missing, and the venv step
# is skipped while .venv/.typhoon-setup-stamp matches the hash of the files that
# define the environment and the venv still passes its checks.
#
# Ryu 4.34 on Python 3.11 needs three fixes:
#   * its setup.py (pbr) breaks with setuptools>=60, so it is built with
#     setuptools<60 from the venv (--no-build-isolation); setuptools is upgraded
#     again afterwards (Ryu does not use it at run time);
#   * eventlet==0.33.3 (newer releases break Ryu's hub) with dnspython>=2 (1.x
#     does not import on 3.11);
#   * eventlet>=0.30.3 dropped eventlet.wsgi.ALREADY_HANDLED, which ryu-manager
#     imports at start-up: controller/framework/eventlet_fix.py puts it back, called by a
#     .pth file in the venv (`typhoon-controller` calls it itself, so an installed
#     package needs no .pth).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.venv"
STAMP="$VENV/.typhoon-setup-stamp"
FIX_SRC="$REPO/controller/framework/eventlet_fix.py"

RYU_VERSION="4.34"
EVENTLET_VERSION="0.33.3"

# zookeeper: jars and a JVM (OpenJDK 17 on Debian 12, which Spark 4 needs too) for the
# ZooKeeper coordinator backend's tests; python3-venv: Debian's python3.11 has no
# ensurepip without it, so `python3.11 -m venv` fails on a fresh machine; prometheus: the
# server binary for tests/integration/test_metrics_prometheus.py (not started as a service);
# chromium, chromium-driver: the headless browser that tests/integration/test_dashboard_browser.py
# and scripts/dashboard_screenshot.py drive through Selenium (a test extra in pyproject.toml);
# ethtool: tests/integration/machines.py turns off checksum offload on its underlay bridge
# nftables: `typhoon cluster apply`'s fabric firewall (typhoon/fabric_guard.py) and its tests
# redis-server, postgresql, nats-server: the connector tests start their own on loopback
# ports (tests/dbservers.py); the system services stay stopped
APT_REQUIRED=(openvswitch-switch mininet iproute2 tcpdump zookeeper python3-venv prometheus
    chromium chromium-driver ethtool nftables redis-server postgresql nats-server)
APT_OPTIONAL=(zookeeperd) # init scripts for a system-wide ZooKeeper service
ZK_JAR=/usr/share/java/zookeeper.jar
OVS_CTL=/usr/share/openvswitch/scripts/ovs-ctl

export DEBIAN_FRONTEND=noninteractive
export PIP_DISABLE_PIP_VERSION_CHECK=1

log() { printf '[setup] %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

[[ $(id -u) -eq 0 ]] || die "run as root (apt, Open vSwitch and Mininet need it)"

# --- 1. Debian packages ----------------------------------------------------------

is_installed() {
    [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == "install ok installed" ]]
}

has_candidate() {
    local candidate
    candidate=$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}')
    [[ -n $candidate && $candidate != "(none)" ]]
}

missing_packages() { # prints required packages that are not installed
    local p
    for p in "${APT_REQUIRED[@]}"; do is_installed "$p" || echo "$p"; done
}

optional_installable() { # prints optional packages that are missing but available
    local p
    for p in "${APT_OPTIONAL[@]}"; do
        if ! is_installed "$p" && has_candidate "$p"; then echo "$p"; fi
    done
}

apt_install() {
    # Never start services from package scripts (zookeeperd especially): Typhoon
    # starts what it needs itself. Keep an existing policy-rc.d untouched.
    local policy=/usr/sbin/policy-rc.d own_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod +x "$policy"
        own_policy=1
    fi
    local rc=0
    apt-get install -y --no-install-recommends "$@" || rc=$?
    if [[ $own_policy -eq 1 ]]; then rm -f "$policy"; fi
    return "$rc"
}

setup_apt() {
    local -a missing optional
    mapfile -t missing < <(missing_packages)
    mapfile -t optional < <(optional_installable)
    if [[ ${#missing[@]} -eq 0 && ${#optional[@]} -eq 0 ]]; then
        log "apt: nothing to install"
        return
    fi
    log "apt: installing ${missing[*]} ${optional[*]}"
    apt-get update -q
    # The package lists may have been empty before the update: look again.
    mapfile -t optional < <(optional_installable)
    if [[ ${#missing[@]} -gt 0 ]]; then apt_install "${missing[@]}"; fi
    if [[ ${#optional[@]} -gt 0 ]]; then apt_install "${optional[@]}" || true; fi
    local p
    for p in "${APT_OPTIONAL[@]}"; do
        is_installed "$p" || log "apt: optional $p not installed (not available here?)"
    done
}

# --- 2. Python venv ----------------------------------------------------------------

find_python() {
    local c
    for c in "${PYTHON:-}" python3.11 /usr/bin/python3.11; do
        [[ -n $c ]] || continue
        if command -v "$c" >/dev/null 2>&1 &&
            "$c" -c 'import sys, venv; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
            command -v "$c"
            return
        fi
    done
    die "Python 3.11 with the venv module not found (set PYTHON=/path/to/python3.11)"
}

stamp_key() {
    cat "$REPO/pyproject.toml" "$REPO/scripts/setup.sh" "$FIX_SRC" | sha256sum | cut -d' ' -f1
}

venv_ok() {
    [[ -x $VENV/bin/python ]] &&
        "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null &&
        "$VENV/bin/ryu-manager" --version >/dev/null 2>&1 &&
        (cd / && "$VENV/bin/python" -c "$PROJECT_IMPORTS") 2>/dev/null
}

# Every package of the project must import from outside the repository: an editable
# install made before a package existed does not know it (re-install then).
PROJECT_IMPORTS='import ryu.app.wsgi, os_ken.base.app_manager, mininet.net, pyspark, typhoon_cli, controller.core, apps
import mininet_env.run, typhoon_cli.bench, xdist
from pyspark_bridge import bolt_for'


install_eventlet_fix() {
    local site
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    cp "$FIX_SRC" "$site/_typhoon_ryu_eventlet_fix.py"
    echo "import _typhoon_ryu_eventlet_fix; _typhoon_ryu_eventlet_fix.install()" \
        >"$site/typhoon-ryu-eventlet-fix.pth"
}

setup_venv() {
    local key
    key=$(stamp_key)
    if [[ -f $STAMP && $(cat "$STAMP") == "$key" ]] && venv_ok; then
        log "venv: up to date ($VENV)"
        return
    fi
    local python
    python=$(find_python)
    if [[ -e $VENV ]] && ! "$VENV/bin/python" -c \
        'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
        log "venv: $VENV is broken or not Python 3.11, recreating"
        rm -rf "$VENV"
    fi
    if [[ ! -x $VENV/bin/python ]]; then
        log "venv: creating $VENV with $python"
        "$python" -m venv "$VENV"
    fi
    rm -f "$STAMP"
    local pip=("$VENV/bin/python" -m pip --quiet)

    log "venv: Ryu $RYU_VERSION (setuptools<60, no build isolation)"
    "${pip[@]}" install --progress-bar off "setuptools<60" pbr wheel
    "${pip[@]}" install --progress-bar off --no-build-isolation \
        "ryu==$RYU_VERSION" "eventlet==$EVENTLET_VERSION" "dnspython>=2"
    install_eventlet_fix
    "${pip[@]}" install --progress-bar off --upgrade "setuptools>=68"

    log "venv: the project and its dependencies (pip install -e .[ryu,test,spark,zk,emulation,bench])"
    "${pip[@]}" install --progress-bar off -e "$REPO[ryu,test,spark,zk,emulation,bench]"

    venv_ok || die "venv checks failed after install"
    echo "$key" >"$STAMP"
}

# --- 3. Open vSwitch -----------------------------------------------------------------

start_ovs() {
    if ovs-vsctl --timeout=5 show >/dev/null 2>&1; then
        log "ovs: running"
        # started elsewhere: say if it lacks the malloc settings below (not fatal)
        "$VENV/bin/python" -m typhoon.ovs_malloc --check >&2 || true
        return
    fi
    log "ovs: starting ovsdb-server and ovs-vswitchd (userspace datapath)"
    # The kernel module may be missing (containers): ovs-ctl then warns, and the
    # bridges we create use datapath_type=netdev, which does not need it.
    # GLIBC_TUNABLES: glibc keeps ovs-vswitchd's heap instead of trimming and regrowing
    # it every loop turn for 64 KB ports' receive buffers (typhoon/ovs_malloc.py).
    GLIBC_TUNABLES="$("$VENV/bin/python" -m typhoon.ovs_malloc)" "$OVS_CTL" start --system-id=random
    ovs-vsctl --timeout=10 show >/dev/null || die "Open vSwitch did not start"
}

# --- checks ------------------------------------------------------------------------

verify() {
    "$VENV/bin/ryu-manager" --version
    "$VENV/bin/python" -c 'import ryu.app.wsgi' || die "ryu.app.wsgi does not import"
    command -v mnexec >/dev/null || die "mnexec not found (Debian package mininet)"
    ovs-vsctl --timeout=5 show >/dev/null || die "Open vSwitch is not running"
    local zk_version
    zk_version=$(java -cp "$ZK_JAR" org.apache.zookeeper.version.VersionInfoMain 2>/dev/null) ||
        die "ZooKeeper does not run: java -cp $ZK_JAR (Debian package zookeeper)"
    log "ok: $zk_version"
    log "ok: $("$VENV/bin/python" --version), pyspark $("$VENV/bin/python" -c \
        'import pyspark; print(pyspark.__version__)'), $(ovs-vsctl --version | head -1)"
}

main() {
    local t0=$SECONDS
    setup_apt
    setup_venv
    start_ovs
    verify
    log "done in $((SECONDS - t0))s"
}

main "$@"
