"""The ``sdn`` transport on a real userspace Open vSwitch bridge.

Each worker runs in its own (spawned) process and creates its own TAP device, as
in production; the test adds the devices to a ``datapath_type=netdev`` bridge at
fixed OpenFlow ports and installs the rules the controller would (both
directions: data and credit frames, plus a one-to-many rule).  A fourth TAP, held
by the test process itself, injects hostile frames toward the receiver.

Ports: 1 sender, 2 receiver, 3 second receiver, 4 injector.
"""

from __future__ import annotations

import multiprocessing as mp
import struct
import time
from dataclasses import dataclass, field

import pytest

from typhoon import wire
from typhoon.runtime.links import DEFAULT_WINDOW_BYTES, MAX_WINDOW
from typhoon.runtime.sdn import SdnTransport
from typhoon.runtime.tap import Tap
from typhoon.runtime.transport import Inbound
from typhoon.wire import Control, ControlTuple, Kind

pytestmark = pytest.mark.integration

APP = 0x7A
SENDER, RECV, RECV2 = 1, 2, 3
STREAM = 1
N_TUPLES = 300_000
TUPLE_SIZE = 100
BATCH = 100  # the framework's default batch size
HUGE_WINDOW = MAX_WINDOW  # flow control disabled: the sender never waits


def mac(wid: int) -> str:
    return wire.mac_str(wire.worker_mac(APP, wid))


# --------------------------------------------------------------------------- child processes


@dataclass
class Received:
    tuples: int = 0
    out_of_order: int = 0  # tuples with a smaller index than one before
    skipped: int = 0  # tuples whose index jumps ahead (missing in between)
    next_index: int = 0
    first: float = 0.0
    last: float = 0.0
    controls: list = field(default_factory=list)

    def add(self, item) -> None:
        if isinstance(item, ControlTuple):
            self.controls.append([int(item.type), item.body])
            return
        assert isinstance(item, Inbound)
        now = time.monotonic()
        if not self.tuples:
            self.first = now
        self.last = now
        for p in item.payloads:
            (i,) = struct.unpack_from(">Q", p)
            if i < self.next_index:
                self.out_of_order += 1
            elif i > self.next_index:
                self.skipped += 1
            self.next_index = i + 1
            self.tuples += 1


def _payloads(n: int, size: int) -> list[bytes]:
    fill = b"t" * (size - 8)
    return [struct.pack(">Q", i) + fill for i in range(n)]


def worker_main(conn, wid: int, tap: str, window: int, credit_timeout_s: float) -> None:
    """A worker: creates its TAP, then polls and obeys commands from the test."""
    t = SdnTransport(
        APP, wid, tap=tap, window=window, credit_timeout_s=credit_timeout_s,
        # flow control off: no byte budget, no byte window
        port_budget=0 if window == HUGE_WINDOW else None,
        window_bytes=0 if window == HUGE_WINDOW else DEFAULT_WINDOW_BYTES,
    )  # fmt: skip
    conn.send("ready")
    got = Received()
    try:
        while True:
            for item in t.poll(0.002):
                got.add(item)
            if not conn.poll():
                continue
            cmd, *args = conn.recv()
            if cmd == "exit":
                break
            if cmd == "stats":
                conn.send(
                    {
                        "tuples": got.tuples,
                        "out_of_order": got.out_of_order,
                        "skipped": got.skipped,
                        "first": got.first,
                        "last": got.last,
                        "controls": got.controls,
                        "seq_gaps": t.stats.seq_gaps,
                        "drops": dict(t.stats.drops),
                        "frames_in": t.stats.frames_in,
                        "frames_out": t.stats.frames_out,
                        "credit_stalls": t.stats.credit_stalls,
                        "credit_frames_in": t.credit_frames_in,
                        "credit_frames_out": t.credit_frames_out,
                        "links": t.link_stats(),
                    }
                )
            elif cmd == "send":
                dsts, n, size, batch, *mode = args
                shuffle = mode == ["shuffle"]  # one receiver per batch, round robin
                payloads = _payloads(n, size)
                frames0, stalls0 = t.stats.frames_out, t.stats.credit_stalls
                credit0 = t.credit_frames_out
                t0 = time.monotonic()
                for k, i in enumerate(range(0, n, batch)):
                    chunk = payloads[i : i + batch]
                    if shuffle:
                        t.send(dsts[k % len(dsts)], STREAM, chunk)
                    elif len(dsts) == 1:
                        t.send(dsts[0], STREAM, chunk)
                    else:
                        t.send_group(STREAM, dsts, chunk)
                t1 = time.monotonic()
                conn.send(
                    {
                        "start": t0,
                        "end": t1,
                        "frames": t.stats.frames_out - frames0 - (t.credit_frames_out - credit0),
                        "credit_stalls": t.stats.credit_stalls - stalls0,
                        "drops": dict(t.stats.drops),
                    }
                )
    finally:
        t.close()


class Worker:
    def __init__(self, ctx, wid: int, tap: str, window: int, credit_timeout_s: float = 10.0):
        self.wid = wid
        self.tap = tap
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=worker_main, args=(child, wid, tap, window, credit_timeout_s), daemon=True
        )
        self.proc.start()
        child.close()
        if not self.conn.poll(30):
            raise RuntimeError(f"worker {wid} did not start")
        assert self.conn.recv() == "ready"

    def call(self, *cmd, timeout: float = 120):
        self.conn.send(cmd)
        if not self.conn.poll(timeout):
            raise TimeoutError(f"worker {self.wid}: no answer to {cmd[0]}")
        return self.conn.recv()

    def stats(self) -> dict:
        return self.call("stats")

    def stop(self) -> None:
        if self.proc.is_alive():
            try:
                self.conn.send(("exit",))
            except OSError:
                pass
            self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()


# --------------------------------------------------------------------------- the bridge


class Bridge:
    def __init__(self, ovs, net_names):
        self.ovs = ovs
        self.names = net_names
        self.name = net_names.switch("s")
        self.workers: list[Worker] = []
        self.ctx = mp.get_context("spawn")
        ovs.run(
            "ovs-vsctl", "add-br", self.name,
            "--", "set", "bridge", self.name, "datapath_type=netdev", "fail_mode=secure",
            "--", "set", "bridge", self.name, "protocols=OpenFlow13",
        )  # fmt: skip

    def tap(self, wid: int) -> str:
        return f"{self.names.prefix}w{wid}"

    def add_port(self, tap: str, ofport: int) -> None:
        self.ovs.run(
            "ovs-vsctl", "add-port", self.name, tap,
            "--", "set", "interface", tap, f"ofport_request={ofport}",
        )  # fmt: skip

    def flow(self, spec: str) -> None:
        self.ovs.run("ovs-ofctl", "-O", "OpenFlow13", "add-flow", self.name, spec)

    def link(self, src: int, src_port: int, dst: int, dst_port: int) -> None:
        """Data src -> dst and credit frames both ways."""
        et = f"dl_type={wire.ETHERTYPE:#06x}"
        self.flow(
            f"in_port={src_port},dl_src={mac(src)},dl_dst={mac(dst)},{et},actions=output:{dst_port}"
        )
        self.flow(
            f"in_port={dst_port},dl_src={mac(dst)},dl_dst={mac(src)},{et},actions=output:{src_port}"
        )

    def worker(self, wid: int, ofport: int, window: int, credit_timeout_s: float = 10.0) -> Worker:
        w = Worker(self.ctx, wid, self.tap(wid), window, credit_timeout_s)
        self.workers.append(w)
        self.add_port(w.tap, ofport)
        return w

    def respawn(self, wid: int, ofport: int, window: int) -> Worker:
        """A new process for worker ``wid``: its TAP reappears under the same name.

        The switch shows the old port LIVE again by itself, but its userspace
        datapath keeps reading the vanished device and never receives a frame from
        the new one: the port must be deleted and added again, in two transactions
        (one transaction with both changes is a no-op for the datapath).
        """
        w = Worker(self.ctx, wid, self.tap(wid), window)
        self.workers.append(w)
        self.ovs.run("ovs-vsctl", "del-port", self.name, w.tap)
        self.add_port(w.tap, ofport)
        return w

    def port_state(self, ofport: int) -> str:
        """The ``state:`` line of one port in ``ovs-ofctl show``."""
        out = self.ovs.run("ovs-ofctl", "-O", "OpenFlow13", "show", self.name)
        block = out.split(f" {ofport}(", 1)[1].split("\n (", 1)[0]
        return block.split("state:", 1)[1].split("\n", 1)[0].strip()

    def wait_live(self, ofports: list[int]) -> None:
        def live():
            out = self.ovs.run("ovs-ofctl", "-O", "OpenFlow13", "show", self.name)
            return all(f" {p}(" in out for p in ofports) and out.count("LIVE") >= len(ofports)

        self.ovs.wait_for(live, 10, 0.05, what="ports up")

    def close(self) -> None:
        for w in self.workers:
            w.stop()
        self.ovs.run("ovs-vsctl", "--if-exists", "del-br", self.name, check=False)


@pytest.fixture
def bridge(ovs, net_names):
    b = Bridge(ovs, net_names)
    try:
        yield b
    finally:
        b.close()


def pair(bridge: Bridge, window: int) -> tuple[Worker, Worker]:
    s = bridge.worker(SENDER, 1, window)
    r = bridge.worker(RECV, 2, window)
    bridge.link(SENDER, 1, RECV, 2)
    bridge.wait_live([1, 2])
    return s, r


def wait_quiet(w: Worker, want: int, quiet_s: float = 2.0, timeout: float = 120) -> dict:
    """Stats once ``want`` tuples arrived, or nothing arrived for ``quiet_s``."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while True:
        st = w.stats()
        if st["tuples"] >= want:
            return st
        now = time.monotonic()
        if st["tuples"] != last:
            last, since = st["tuples"], now
        elif now - since > quiet_s or now > deadline:
            return st
        time.sleep(0.05)


def blast(bridge: Bridge, window: int, quiet_s: float = 2.0) -> tuple[dict, dict, dict]:
    s, r = pair(bridge, window)
    sent = s.call("send", [RECV], N_TUPLES, TUPLE_SIZE, BATCH)
    got = wait_quiet(r, N_TUPLES, quiet_s)
    return sent, got, s.stats()


# --------------------------------------------------------------------------- tests


def test_credits_give_zero_loss_at_full_speed(bridge):
    sent, got, sstats = blast(bridge, 32)
    elapsed = got["last"] - sent["start"]
    rate = got["tuples"] / elapsed
    print(
        f"\n[credits on] {got['tuples']}/{N_TUPLES} tuples of {TUPLE_SIZE} B in {elapsed:.3f} s "
        f"= {rate:,.0f} tuples/s; {sent['frames']} frames, seq gaps {got['seq_gaps']}, "
        f"credit stalls {sent['credit_stalls']}, drops {got['drops']}"
    )
    assert got["tuples"] == N_TUPLES
    assert got["out_of_order"] == got["skipped"] == 0
    assert got["seq_gaps"] == 0
    assert got["links"]["open_gaps"] == 0 and got["links"]["duplicates"] == 0
    assert sstats["links"]["lost"] == 0
    assert got["drops"] == {}
    assert sstats["drops"] == {}
    assert sent["credit_stalls"] > 0, "the sender never had to wait: flow control untested"


def test_without_credits_the_switch_drops_and_the_link_resends(bridge):
    """Flow control off: the switch drops what the sender pushes beyond its queues;
    selective repeat still delivers every tuple, in order, at the price of resends."""
    sent, got, sstats = blast(bridge, HUGE_WINDOW, quiet_s=15.0)  # resend storms stall for seconds
    elapsed = max(got["last"], sent["end"]) - sent["start"]
    links = sstats["links"]
    print(
        f"\n[credits off] {got['tuples']}/{N_TUPLES} tuples in {elapsed:.3f} s "
        f"= {got['tuples'] / elapsed:,.0f} tuples/s delivered; {sent['frames']} frames, "
        f"{links['retransmitted']} sent again, receiver gaps {got['links']['gaps']} "
        f"(sender wrote {sent['frames'] / (sent['end'] - sent['start']):,.0f} frames/s)"
    )
    assert sent["credit_stalls"] == 0
    assert got["seq_gaps"] > 0 and links["retransmitted"] > 0, "the switch dropped nothing"
    assert got["tuples"] == N_TUPLES
    assert got["out_of_order"] == got["skipped"] == 0
    assert links["lost"] == 0 and got["links"]["open_gaps"] == 0


def test_multicast_reaches_every_receiver_from_one_write(bridge):
    s = bridge.worker(SENDER, 1, 32)
    r1 = bridge.worker(RECV, 2, 32)
    r2 = bridge.worker(RECV2, 3, 32)
    bridge.link(SENDER, 1, RECV, 2)
    bridge.link(SENDER, 1, RECV2, 3)
    group = wire.mac_str(wire.multicast_mac(APP, STREAM))
    bridge.flow(
        f"in_port=1,dl_src={mac(SENDER)},dl_dst={group},dl_type={wire.ETHERTYPE:#06x},"
        "actions=output:2,output:3"
    )
    bridge.wait_live([1, 2, 3])
    n = 100_000
    sent = s.call("send", [RECV, RECV2], n, TUPLE_SIZE, BATCH)
    got1 = wait_quiet(r1, n)
    got2 = wait_quiet(r2, n)
    print(
        f"\n[multicast] {sent['frames']} data frames written for {n} tuples; receivers got "
        f"{got1['tuples']} / {got2['tuples']}, seq gaps {got1['seq_gaps']} / {got2['seq_gaps']}, "
        f"sender stalls {sent['credit_stalls']}"
    )
    for got in (got1, got2):
        assert got["tuples"] == n
        assert got["out_of_order"] == got["skipped"] == 0
        assert got["seq_gaps"] == 0
        assert got["drops"] == {}
    # the sender wrote each data frame once; each receiver got every one
    data_frames = -(-n // BATCH) * len(wire.pack_frames(
        wire.multicast_mac(APP, STREAM), wire.worker_mac(APP, SENDER), Kind.DATA, STREAM, 0,
        _payloads(BATCH, TUPLE_SIZE),
    ))  # fmt: skip
    assert sent["frames"] == data_frames
    for got in (got1, got2):
        assert got["frames_in"] - got["credit_frames_in"] == data_frames


def test_fan_out_keeps_the_port_within_its_budget(bridge):
    """One sender, two receivers, jumbo frames: the links share the sender's port."""
    s = bridge.worker(SENDER, 1, 32)
    r1 = bridge.worker(RECV, 2, 32)
    r2 = bridge.worker(RECV2, 3, 32)
    bridge.link(SENDER, 1, RECV, 2)
    bridge.link(SENDER, 1, RECV2, 3)
    bridge.wait_live([1, 2, 3])
    n, batch = 200_000, 88  # 88 tuples of 100 bytes: one full jumbo frame per batch
    sent = s.call("send", [RECV, RECV2], n, TUPLE_SIZE, batch, "shuffle")
    got1 = wait_quiet(r1, n // 2)
    got2 = wait_quiet(r2, n - got1["tuples"])
    st = s.stats()
    elapsed = max(got1["last"], got2["last"]) - sent["start"]
    print(
        f"\n[fan-out] {got1['tuples'] + got2['tuples']}/{n} tuples in {elapsed:.3f} s = "
        f"{n / elapsed:,.0f} tuples/s, {sent['frames']} frames, seq gaps "
        f"{got1['seq_gaps']} / {got2['seq_gaps']}, stalls {sent['credit_stalls']}, "
        f"credit frames sent by the sender {st['credit_frames_out']}"
    )
    assert got1["tuples"] + got2["tuples"] == n
    assert got1["seq_gaps"] == got2["seq_gaps"] == 0
    assert got1["out_of_order"] == got2["out_of_order"] == 0
    assert st["drops"] == {}


def test_dead_receiver_costs_a_timeout_and_a_restarted_one_is_picked_up(bridge):
    s = bridge.worker(SENDER, 1, 32, credit_timeout_s=1.0)
    r = bridge.worker(RECV, 2, 32)
    bridge.link(SENDER, 1, RECV, 2)
    bridge.wait_live([1, 2])
    s.call("send", [RECV], 10_000, TUPLE_SIZE, BATCH)
    assert wait_quiet(r, 10_000)["tuples"] == 10_000

    # the worker dies: the kernel removes its TAP, the switch reports the port down
    r.proc.kill()
    t0 = time.monotonic()
    bridge.ovs.wait_for(lambda: "LINK_DOWN" in bridge.port_state(2), 5, 0.01, what="port down")
    print(f"\n[dead] port 2 LINK_DOWN within {1000 * (time.monotonic() - t0):.0f} ms of the kill")
    t0 = time.monotonic()
    sent = s.call("send", [RECV], 20_000, TUPLE_SIZE, BATCH)
    took = time.monotonic() - t0
    print(
        f"[dead] sending 20000 tuples to the dead worker took {took:.2f} s, drops {sent['drops']}"
    )
    assert 1.0 <= took < 5.0  # one credit timeout, then no more waiting
    assert sent["drops"]["credit_timeout"] > 0

    # a new incarnation of the worker: same TAP name, the switch port comes back
    r2 = bridge.respawn(RECV, 2, 32)
    bridge.wait_live([1, 2])

    def revived():  # the sender probes the dead link (SYNC); the answer revives it
        s.call("send", [RECV], 100, TUPLE_SIZE, BATCH)
        return r2.stats()["tuples"]

    bridge.ovs.wait_for(revived, 10, 0.05, what="the link to revive")
    before = r2.stats()
    s.call("send", [RECV], 50_000, TUPLE_SIZE, BATCH)
    after = wait_quiet(r2, before["tuples"] + 50_000)
    print(f"[dead] after the restart: {after['tuples'] - before['tuples']} of 50000 tuples")
    assert after["tuples"] - before["tuples"] == 50_000
    assert after["seq_gaps"] == before["seq_gaps"]


@pytest.fixture
def hostile(bridge):
    """Sender + receiver, and an injector TAP (port 4) whose frames go to the receiver."""
    s, r = pair(bridge, 32)
    tap = Tap(bridge.tap(9))
    try:
        bridge.add_port(tap.name, 4)
        bridge.flow("in_port=4,actions=output:2")
        bridge.wait_live([1, 2, 4])
        yield s, r, tap
    finally:
        tap.close()


def _data_frame(src: bytes, dst: bytes, seq: int = 0) -> bytes:
    return wire.pack_frames(dst, src, Kind.DATA, STREAM, seq, _payloads(3, TUPLE_SIZE))[0]


def wire_wait(pred, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    return pred()


def test_malformed_frames_are_counted_and_dropped(hostile):
    s, r, tap = hostile
    me, them = wire.worker_mac(APP, RECV), wire.worker_mac(APP, SENDER)
    good = _data_frame(them, me)
    bad_version = bytearray(good)
    bad_version[14] = 9
    wrong_count = bytearray(good)
    wrong_count[24:26] = b"\x00\x09"
    garbage = [
        b"\xff" * 6 + b"\x00" * 6 + b"\x08\x00" + b"not typhoon at all" * 3,  # IPv4 ethertype
        bytes(good[:20]),  # shorter than the headers
        bytes(good[:-7]),  # truncated inside the last tuple
        bytes(bad_version),
        bytes(wrong_count),
        me + them + b"\x88\xb5" + bytes(range(200)),  # right ethertype, junk header
    ]
    for g in garbage:
        tap.write(g)
    # well-formed, but addressed to another worker / from another application
    tap.write(_data_frame(them, wire.worker_mac(APP, 77)))
    tap.write(_data_frame(wire.worker_mac(APP + 1, SENDER), me))
    st = wire_wait(lambda: (st := r.stats())["frames_in"] >= len(garbage) + 2 and st)
    print(f"\n[malformed] receiver drops: {st['drops']}")
    assert st["drops"].get("malformed_frame") == len(garbage)
    assert st["drops"].get("not_for_me") == 1
    assert st["drops"].get("foreign_src") == 1
    assert st["tuples"] == 0
    # the receiver is alive and keeps every real tuple
    n = 20_000
    s.call("send", [RECV], n, TUPLE_SIZE, BATCH)
    got = wait_quiet(r, n)
    assert got["tuples"] == n and got["seq_gaps"] == 0
    assert got["out_of_order"] == got["skipped"] == 0


def test_control_frames_only_from_the_controller(hostile):
    s, r, tap = hostile
    me = wire.worker_mac(APP, RECV)
    body = wire.encode_control(ControlTuple(Control.INPUT_RATE, {"rate": 5.0}))

    def control_frame(src: bytes, payload: bytes = body) -> bytes:
        return wire.pack_frames(me, src, Kind.CONTROL, 0, 0, [payload])[0]

    tap.write(control_frame(wire.worker_mac(APP, SENDER)))  # a worker posing as controller
    tap.write(control_frame(wire.controller_mac(APP + 1)))  # another application's controller
    tap.write(control_frame(wire.controller_mac(APP), b"\x93\x01\x02"))  # bad control tuple
    tap.write(control_frame(wire.controller_mac(APP)))  # the real thing
    st = wire_wait(lambda: (st := r.stats())["controls"] and st)
    st = r.stats()
    print(f"\n[control] receiver drops: {st['drops']}, controls: {st['controls']}")
    assert st["drops"].get("spoofed_control") == 2
    assert st["drops"].get("malformed_control") == 1
    assert st["controls"] == [[int(Control.INPUT_RATE), {"rate": 5.0}]]
