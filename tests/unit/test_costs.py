"""benchmarks/costs.py: samples are charged to the layer of their innermost own frame."""

from benchmarks.costs import ORDER, attribute, layer_of, table

LOOP = "Worker.run (typhoon/runtime/worker.py:88)"


def test_innermost_frame_with_a_layer_wins():
    enc = [LOOP, "Framework.push (typhoon/runtime/output.py:330)",
           "OutputBatching._entries (typhoon/runtime/output.py:280)",
           "encode_rows (typhoon/wire/rows.py:50)"]  # fmt: skip
    assert layer_of(enc) == "msgpack encode"
    dec = [LOOP, "Framework.deliver (typhoon/runtime/framework.py:370)",
           "Framework._decode_entry (typhoon/runtime/framework.py:390)",
           "decode_rows (typhoon/wire/rows.py:60)",
           "decode_tuple (typhoon/wire/rows.py:35)"]  # fmt: skip
    assert layer_of(dec) == "msgpack decode"
    frames = [LOOP, "pack_frames (typhoon/wire/frames.py:160)"]
    assert layer_of(frames) == "frames (build, parse)"
    op = [LOOP, "SequenceCheck.process_batch (typhoon/operators/sinks.py:160)"]
    assert layer_of(op) == "operator"
    assert layer_of([LOOP, "<built-in> (libc.so:0)"]) == "event loop"
    assert layer_of(["<module> (typhoon/runtime/worker.py:1)"]) == "event loop"
    assert layer_of(["_find_and_load (<frozen importlib._bootstrap>:1)"]) == "startup"


def test_samples_per_worker_process():
    head = 'process 41:"python -m typhoon.runtime.worker /tmp/x/worker-3.spec.json"'
    raw = "\n".join(
        [
            f"{head};{LOOP};encode_rows (typhoon/wire/rows.py:50) 7",
            f"{head};{LOOP};Tap.write (typhoon/runtime/tap.py:90) 5",
            'process 9:"python -m typhoon_cli run forward.yaml";main (typhoon_cli/run.py:3) 50',
        ]
    )
    got = attribute(raw)
    assert got == {"worker-3": {"msgpack encode": 7, "device / socket I/O": 5}}


def test_table_shows_reported_cpu_and_the_switch():
    layers = {k: 0.0 for k in ORDER}
    results = [
        {"transport": "sdn", "tuples": 1000, "elapsed_s": 0.5,
         "us": {"source": {**layers, "operator": 0.25}, "sink": dict(layers)},
         "cpu_us": {"source": 0.4, "sink": 0.6}, "ovs_us": 0.17},
        {"transport": "tcp", "tuples": 1000, "elapsed_s": 1.0,
         "us": {"source": dict(layers)}, "cpu_us": {}, "ovs_us": None},
    ]  # fmt: skip
    out = table(results)
    assert "| **busy total** | **0.250** | **0.000** | **0.000** |" in out
    assert "| CPU (run report, user + system) | 0.400 | 0.600 | – |" in out
    assert "sdn: 2,000 tuples/s · tcp: 1,000 tuples/s" in out
    assert "ovs-vswitchd CPU, µs per tuple: sdn: 0.170\n" in out
