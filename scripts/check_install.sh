#!/usr/bin/env bash
# `make test-install`: install the package as an operator would (docs/deploy.md) into
# fresh venvs outside the repository, then check that its three commands work:
# typhoon --version, typhoon-agent (starts, publishes itself, stops on SIGTERM),
# typhoon-controller (starts, accepts OpenFlow connections, serves the REST API, and
# runs on the framework it should). No root needed. Three installs:
#   os-ken  python3.11  pip install '.[spark,zk]'                    (no constraint needed)
#   ryu     python3.11  PIP_CONSTRAINT=deploy/build-constraints.txt pip install '.[ryu,zk]'
#   os-ken  python3.12  pip install '.[zk]'   (skipped, with a line saying so, if there is
#                                              no python3.12; set PYTHON312=/path)
# Choose some: ONLY="osken-3.11 ryu-3.11" bash scripts/check_install.sh
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON311="${PYTHON:-python3.11}"
PYTHON312="${PYTHON312:-python3.12}"
ONLY="${ONLY:-osken-3.11 ryu-3.11 osken-3.12}"
WORK="$(mktemp -d /tmp/typhoon-install.XXXXXX)"
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
log() { printf '[check-install] %s\n' "$*" >&2; }
die() {
    log "FAILED: $*"
    exit 1
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
VERSION="$(python3 -c "import re,sys; print(re.search(r'__version__ = \"(.+)\"', open(sys.argv[1]).read())[1])" "$REPO/typhoon/__init__.py")"

# check NAME PYTHON EXTRAS CONSTRAINT(0/1) FRAMEWORK(ryu/os_ken)
check() {
    local name=$1 python=$2 extras=$3 constrained=$4 framework=$5
    local dir="$WORK/$name" t0=$SECONDS
    mkdir -p "$dir"
    log "[$name] venv with $("$python" --version)"
    "$python" -m venv "$dir/venv"
    local bin="$dir/venv/bin"
    (
        [[ $constrained == 1 ]] && export PIP_CONSTRAINT="$REPO/deploy/build-constraints.txt"
        PIP_DISABLE_PIP_VERSION_CHECK=1 "$bin/pip" install --quiet --no-cache-dir "$REPO[$extras]"
    ) || die "[$name] pip install .[$extras]"
    log "[$name] pip install .[$extras]: $((SECONDS - t0)) s"

    (
        cd "$dir" # nothing may come from the repository from here on
        unset PYTHONPATH TYPHOON_CONTROLLER_BACKEND
        local got
        got="$("$bin/typhoon" --version)"
        [[ $got == "typhoon $VERSION" ]] || die "[$name] typhoon --version says '$got', want 'typhoon $VERSION'"
        log "[$name] ok: $got"
        if [[ ,$extras, == *,spark,* ]]; then
            "$bin/python" -c 'import pyspark, pyspark_bridge.driver' || die "[$name] pyspark does not import"
        fi

        "$bin/typhoon-agent" --host h1 --coordinator "$dir/c.db" --workdir "$dir/agent" >"$dir/agent.log" 2>&1 &
        local agent=$!
        local published='import sys; from typhoon.coordinator import SqliteCoordinator as C
sys.exit(C(sys.argv[1]).get_agent("h1") is None)'
        for _ in $(seq 100); do
            "$bin/python" -c "$published" "$dir/c.db" 2>/dev/null && break
            sleep 0.2
        done
        "$bin/python" -c "$published" "$dir/c.db" || { kill "$agent"; die "[$name] typhoon-agent: $(tail -5 "$dir/agent.log")"; }
        kill -TERM "$agent"
        wait "$agent" || die "[$name] typhoon-agent exited $? on SIGTERM"
        log "[$name] ok: typhoon-agent published agents/h1 and stopped cleanly"

        local ofp wsapi up=0
        ofp=$(free_port)
        wsapi=$(free_port)
        "$bin/typhoon-controller" --coordinator "$dir/c.db" --app all --ofp-listen-host 127.0.0.1 \
            --ofp-port "$ofp" --wsapi-port "$wsapi" --runtime-dir "$dir/run" >"$dir/controller.log" 2>&1 &
        local ctl=$!
        echo "$ctl" >"$dir/controller.pid"
        for _ in $(seq 150); do
            if "$bin/python" -c "import socket,sys; socket.create_connection(('127.0.0.1',int(sys.argv[1])),1)" "$ofp" 2>/dev/null; then
                up=1
                break
            fi
            kill -0 "$ctl" 2>/dev/null || break
            sleep 0.2
        done
        [[ $up == 1 ]] || { kill "$ctl" 2>/dev/null; die "[$name] typhoon-controller: $(tail -20 "$dir/controller.log")"; }
        local code
        code=$("$bin/python" -c "import sys, urllib.request as u
print(u.urlopen(f'http://127.0.0.1:{sys.argv[1]}/typhoon/apps', timeout=5).status)" "$wsapi") || code=none
        kill -TERM "$ctl"
        wait "$ctl" || true
        [[ $code == 200 ]] || die "[$name] REST API answered $code: $(tail -20 "$dir/controller.log")"
        grep -q "loading app $framework.controller.ofp_handler" "$dir/controller.log" ||
            die "[$name] the controller did not run on $framework: $(grep 'loading app' "$dir/controller.log" | head -3)"
        log "[$name] ok: typhoon-controller (core + all apps) on $framework accepts OpenFlow on $ofp, REST on $wsapi"
    ) || exit 1
    log "[$name] passed in $((SECONDS - t0)) s"
}

for run in $ONLY; do
    case $run in
    osken-3.11) check osken-3.11 "$PYTHON311" spark,zk 0 os_ken ;;
    ryu-3.11) check ryu-3.11 "$PYTHON311" ryu,zk 1 ryu ;;
    osken-3.12)
        if command -v "$PYTHON312" >/dev/null && "$PYTHON312" -c 'import venv' 2>/dev/null; then
            check osken-3.12 "$PYTHON312" zk 0 os_ken
        else
            log "[osken-3.12] SKIPPED: no $PYTHON312 with the venv module (set PYTHON312=/path)"
        fi
        ;;
    *) die "unknown run '$run' (osken-3.11, ryu-3.11, osken-3.12)" ;;
    esac
done
log "all passed"
