#!/usr/bin/env bash
# `make test-install`: install the package as an operator would (docs/deploy.md) into a
# fresh Python 3.11 venv outside the repository, then check that its three commands
# work: typhoon --version, typhoon-agent (starts, publishes itself, stops on SIGTERM),
# typhoon-controller (Ryu starts and accepts OpenFlow connections). No root needed.
#   EXTRAS=zk,spark bash scripts/check_install.sh
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EXTRAS="${EXTRAS:-zk}"
PYTHON="${PYTHON:-python3.11}"
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

free_port() { "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

log "venv in $WORK with $("$PYTHON" --version)"
"$PYTHON" -m venv "$WORK/venv"
BIN="$WORK/venv/bin"
t0=$SECONDS
PIP_CONSTRAINT="$REPO/deploy/build-constraints.txt" PIP_DISABLE_PIP_VERSION_CHECK=1 \
    "$BIN/pip" install --quiet --no-cache-dir "$REPO[$EXTRAS]" || die "pip install .[$EXTRAS]"
log "pip install .[$EXTRAS]: $((SECONDS - t0)) s"

cd "$WORK" # nothing may come from the repository from here on
unset PYTHONPATH
want="typhoon $("$PYTHON" -c "import re,sys; print(re.search(r'__version__ = \"(.+)\"', open(sys.argv[1]).read())[1])" "$REPO/typhoon/__init__.py")"
got="$("$BIN/typhoon" --version)"
[[ $got == "$want" ]] || die "typhoon --version says '$got', want '$want'"
log "ok: $got"

"$BIN/typhoon-agent" --host h1 --coordinator "$WORK/c.db" --workdir "$WORK/agent" >"$WORK/agent.log" 2>&1 &
agent=$!
PIDS+=("$agent")
for _ in $(seq 100); do
    "$BIN/python" -c "import sys; from typhoon.coordinator import SqliteCoordinator as C
sys.exit(C(sys.argv[1]).get_agent('h1') is None)" "$WORK/c.db" 2>/dev/null && break
    sleep 0.2
done
"$BIN/python" -c "import sys; from typhoon.coordinator import SqliteCoordinator as C
sys.exit(C(sys.argv[1]).get_agent('h1') is None)" "$WORK/c.db" || die "typhoon-agent: $(tail -5 "$WORK/agent.log")"
kill -TERM "$agent"
wait "$agent" || die "typhoon-agent exited $? on SIGTERM"
log "ok: typhoon-agent published agents/h1 and stopped cleanly"

ofp=$(free_port)
wsapi=$(free_port)
"$BIN/typhoon-controller" --coordinator "$WORK/c.db" --app all --ofp-listen-host 127.0.0.1 \
    --ofp-port "$ofp" --wsapi-port "$wsapi" --runtime-dir "$WORK/run" >"$WORK/controller.log" 2>&1 &
ctl=$!
PIDS+=("$ctl")
up=0
for _ in $(seq 150); do
    if "$BIN/python" -c "import socket,sys; socket.create_connection(('127.0.0.1',int(sys.argv[1])),1)" "$ofp" 2>/dev/null; then
        up=1
        break
    fi
    kill -0 "$ctl" 2>/dev/null || break
    sleep 0.2
done
[[ $up == 1 ]] || die "typhoon-controller: $(tail -20 "$WORK/controller.log")"
code=$("$BIN/python" -c "import sys, urllib.request as u
print(u.urlopen(f'http://127.0.0.1:{sys.argv[1]}/typhoon/apps', timeout=5).status)" "$wsapi")
[[ $code == 200 ]] || die "REST API answered $code"
log "ok: typhoon-controller (core + all apps) accepts OpenFlow on $ofp, REST on $wsapi"
log "passed in $((SECONDS - t0)) s"
