"""Microseconds per tuple in each layer of a worker, read off a real run by sampling.

Runs ``topologies/forward.yaml`` (100-byte tuples, source -> sequence check) with
``typhoon run`` under ``py-spy record --subprocesses`` and charges every sample of
the two worker processes to the layer of the innermost frame that belongs to one
(``LAYERS``): operator, framework routing and batching, msgpack, frame building
and parsing, the link protocol (sequence numbers, credits), the device or socket
I/O, and waiting for input.  Samples / sampling rate / tuples = µs per tuple.
Interpreter start-up and imports are left out (``startup``), so the figures are
what the event loop spends, on the machine as loaded as it is.

py-spy counts a thread as busy while it is runnable, so a worker waiting for a core
(source, sink and ovs-vswitchd share two here) has samples too: the layers say where
a worker's time goes, not how much CPU it used.  Hence the rows below them: the CPU
time each worker reports (user + system, its event loop only) and ovs-vswitchd's
CPU during the run (from ``/proc``; shared with whatever else uses the switch), per
tuple.

    python -m benchmarks.costs [--transport sdn tcp] [--batch-size 100] [--rate 250]
                               [--count N]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from benchmarks.testbed import ovs_cpu_seconds
from typhoon.topology.batching import DEFAULTS

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY = ROOT / "topologies" / "forward.yaml"

_READABLE = ("SdnTransport._readable", "SdnReceiving._readable")
_ENTRIES = ("Framework._entries", "OutputBatching._entries")
# the strict row decoder and its depth check (typhoon/wire/rows.py)
_DECODE = (
    "decode_rows",
    "decode_tuple",
    "decode_value",
    "unpack_rows",
    "_unpack",
    "_heads",
    "_flat",
    "_check_depth",
    "_children",
    "_has_timestamp",
)
# (layer, file suffix, function names or None for every function of the file), first match
LAYERS: list[tuple[str, str, tuple[str, ...] | None]] = [
    ("msgpack encode", "typhoon/wire/rows.py", ("encode_rows",)),
    # py-spy names a method after the class of ``self`` or the one that defines it
    ("msgpack encode", "typhoon/runtime/output.py", _ENTRIES),
    ("msgpack decode", "typhoon/wire/rows.py", _DECODE),
    ("msgpack decode", "typhoon/runtime/framework.py", ("Framework._decode_entry",)),
    ("wait for input", "typhoon/runtime/sdn_receive.py", _READABLE),
    ("wait for input", "selectors.py", None),
    ("device / socket I/O", "typhoon/runtime/tap.py", None),
    ("device / socket I/O", "socket.py", None),
    ("operator", "typhoon/operators/", None),
    ("framework routing + batching", "typhoon/runtime/framework.py", None),
    ("framework routing + batching", "typhoon/runtime/output.py", None),
    ("framework routing + batching", "typhoon/runtime/control.py", None),
    ("framework routing + batching", "typhoon/runtime/guarantee.py", None),
    ("framework routing + batching", "typhoon/runtime/hooks.py", None),
    ("framework routing + batching", "typhoon/runtime/policies.py", None),
    ("frames (build, parse)", "typhoon/wire/", None),
    ("link protocol (seq, credits)", "typhoon/runtime/sdn.py", None),
    ("link protocol (seq, credits)", "typhoon/runtime/sdn_receive.py", None),
    ("link protocol (seq, credits)", "typhoon/runtime/sdn_credit.py", None),
    ("link protocol (seq, credits)", "typhoon/runtime/sdn_send.py", None),
    ("link protocol (seq, credits)", "typhoon/runtime/sdn_balanced.py", None),
    ("link protocol (seq, credits)", "typhoon/runtime/links/", None),
    ("link protocol (seq, credits)", "typhoon/runtime/lb_credits.py", None),
    ("link protocol (seq, credits)", "typhoon/runtime/truesize.py", None),
    ("link protocol (seq, credits)", "typhoon/runtime/tcp.py", None),
    ("event loop", "typhoon/runtime/worker.py", None),
]
ORDER = [
    "operator",
    "framework routing + batching",
    "msgpack encode",
    "msgpack decode",
    "frames (build, parse)",
    "link protocol (seq, credits)",
    "device / socket I/O",
    "event loop",
    "wait for input",
]
_FRAME = re.compile(r"^(?P<func>.+) \((?P<file>[^():]+):\d+\)$")
_WORKER = re.compile(r'^process (\d+):".*typhoon\.runtime\.worker (\S+)"')


def layer_of(frames: list[str]) -> str:
    """The layer of the innermost frame that belongs to one; ``startup`` otherwise."""
    for raw in reversed(frames):
        m = _FRAME.match(raw)
        if not m:
            continue
        func, file = m["func"], m["file"]
        for layer, suffix, funcs in LAYERS:
            if (file.endswith(suffix) or suffix.endswith("/") and suffix in file) and (
                funcs is None or func in funcs
            ):
                return layer
        if "Worker.run" in func:  # below the loop: C code or a library the loop called
            return "event loop"
    return "startup"


def attribute(raw: str) -> dict[str, Counter]:
    """Samples per layer for each worker process of a py-spy raw (collapsed) file."""
    out: dict[str, Counter] = {}
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        spec = next((m[2] for f in frames if (m := _WORKER.match(f))), None)
        if spec is None:
            continue
        worker = Path(spec).name.removesuffix(".spec.json")
        out.setdefault(worker, Counter())[layer_of(frames)] += int(count)
    return out


def measure(transport: str, batch: int, rate: int, workdir: Path, count: int | None = None) -> dict:
    raw, report = workdir / f"{transport}.raw", workdir / f"{transport}.json"
    spy = str(Path(sys.executable).parent / "py-spy")
    record = [spy, "record", "--subprocesses", "--nonblocking", "-r", str(rate), "-f", "raw"]
    run = [sys.executable, "-m", "typhoon_cli", "run", str(TOPOLOGY), "--transport", transport]
    cmd = [*record, "-o", str(raw), "--", *run, "--batch-size", str(batch), "-q"]
    cmd += ["--report", str(report)]
    if count is not None:
        cmd += ["--arg", f"source.count={count}"]
    ovs0 = ovs_cpu_seconds()
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    ovs1 = ovs_cpu_seconds()
    rep = json.loads(report.read_text())
    sink = rep["results"]["sink"]
    if not rep["ok"] or sink["missing"] or sink["duplicates"]:
        raise SystemExit(f"{transport}: the run lost or duplicated tuples: {rep['problems']}")
    tuples = sink["received"]
    per_worker = attribute(raw.read_text())
    nodes = {str(w["worker"]): w["node"] for w in rep.get("workers", [])}
    us = {}
    for worker, samples in sorted(per_worker.items()):
        node = nodes.get(worker.removeprefix("worker-"), worker)
        us[node] = {k: samples[k] / rate / tuples * 1e6 for k in ORDER}
    cpu = {w["node"]: w["cpu_s"] / tuples * 1e6 for w in rep.get("workers", []) if "cpu_s" in w}
    ovs = None if ovs0 is None or ovs1 is None else (ovs1 - ovs0) / tuples * 1e6
    return {
        "transport": transport,
        "tuples": tuples,
        "elapsed_s": rep["elapsed_s"],
        "us": us,
        "cpu_us": cpu,
        "ovs_us": ovs,
    }


def table(results: list[dict]) -> str:
    cols = [(r["transport"], node) for r in results for node in r["us"]]
    head = "| layer (µs per tuple) | " + " | ".join(f"{t} {n}" for t, n in cols) + " |"
    lines = [head, "|---" * (len(cols) + 1) + "|"]
    by = {(r["transport"], n): r["us"][n] for r in results for n in r["us"]}
    for layer in ORDER:
        lines.append(f"| {layer} | " + " | ".join(f"{by[c][layer]:.3f}" for c in cols) + " |")
    busy = [sum(v for k, v in by[c].items() if k != "wait for input") for c in cols]
    lines.append("| **busy total** | " + " | ".join(f"**{b:.3f}**" for b in busy) + " |")
    cpu = {(r["transport"], n): r.get("cpu_us", {}).get(n) for r in results for n in r["us"]}
    lines.append(
        "| CPU (run report, user + system) | "
        + " | ".join("–" if cpu[c] is None else f"{cpu[c]:.3f}" for c in cols)
        + " |"
    )
    rates = " · ".join(
        f"{r['transport']}: {r['tuples'] / r['elapsed_s']:,.0f} tuples/s" for r in results
    )
    ovs = " · ".join(
        f"{r['transport']}: {r['ovs_us']:.3f}" for r in results if r.get("ovs_us") is not None
    )
    out = "\n".join(lines) + f"\n\nthroughput of these runs: {rates}\n"
    if ovs:
        out += f"ovs-vswitchd CPU, µs per tuple: {ovs}\n"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--transport", nargs="+", default=["sdn", "tcp"], choices=["sdn", "tcp"])
    ap.add_argument("--batch-size", type=int, default=DEFAULTS.batch_size)
    ap.add_argument("--rate", type=int, default=250, help="samples per second")
    ap.add_argument("--count", type=int, help="tuples the source emits (default: the file's)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--keep", type=Path, help="keep py-spy's raw profiles in this directory")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="typhoon-costs-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        results = [measure(t, args.batch_size, args.rate, work, args.count) for t in args.transport]
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
