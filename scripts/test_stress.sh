#!/usr/bin/env bash
# make test-stress: the unit and runtime suites plus the most timing-sensitive
# integration files, run the way CI runs them on a busy machine, so a test that
# leans on timing, on the terminal or on inherited signal dispositions fails here
# first:
#
# * a CPU hog (a Python busy loop) pinned to core 0 for the whole run;
# * pytest started in the background, in a session of its own (setsid), stdin
#   closed (</dev/null) and SIGINT ignored, as a shell starts a background job.
#
# The hog is killed whatever happens (exit, error, Ctrl-C).  The exit code is
# pytest's; 5 (no test collected) is a failure, as in `make test`.
set -u
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
# integration files where timing, process start-up and signals matter most: updates
# mid-run (reconfiguration), kills and heartbeats (fault detector, guarantees),
# a child stopped with SIGINT (live debugger), load windows (autoscaler), worker
# processes supervised and adopted across agent restarts (agent)
STRESS_INTEGRATION=(
    tests/integration/test_reconfiguration.py
    tests/integration/test_fault_detector.py
    tests/integration/test_guarantees.py
    tests/integration/test_live_debugger.py
    tests/integration/test_autoscaler.py
    tests/integration/test_agent.py
)

hog=""
tests=""
cleanup() {
    if [ -n "$tests" ]; then kill -TERM -- "-$tests" 2>/dev/null; fi
    if [ -n "$hog" ]; then
        kill "$hog" 2>/dev/null
        wait "$hog" 2>/dev/null
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

taskset -c 0 "$PY" -c 'while True: pass' &
hog=$!

# a non-interactive shell's background subshell is not a process group leader, so
# setsid runs pytest in this very process: $! is its pid, session and group ID
(
    trap '' INT
    exec setsid "$PY" -m pytest tests/unit tests/runtime "${STRESS_INTEGRATION[@]}" \
        -m "not long" --durations=10 </dev/null
) &
tests=$!
rc=0
wait "$tests" || rc=$?
tests=""
if [ "$rc" -eq 5 ]; then
    echo "make test-stress: pytest collected no tests" >&2
    exit 1
fi
exit "$rc"
