"""Locality-aware key routing on Mininet, real OVS and Ryu (seed paper 003, issue 17).

Three emulated hosts, ``apps/locality_router.py`` with the core.  The workload
of ``topologies/locality.yaml``: ``pair_source`` -> ``a`` (``count_forward``,
fields on ``a``, 3 workers) -> ``b`` (``count_by_key``, fields on ``b``, 3
workers), one worker of ``a`` and one of ``b`` per host (``placement:
spread``), 80% of the (a, b) pairs correlated.  Mid-run, ``typhoon locality``
(the CLI, through REST) makes the router plan from the pairs that ``a``'s
workers counted and switch both streams from hash to the computed ``direct``
tables with two stable updates.

Checked: both nodes' counts equal what the generator says (no tuple lost or
counted twice across the switch), and the fraction of ``a`` -> ``b`` tuples
that crossed hosts at least halves.  How it is measured, without the
router's own functions: every worker of ``a`` counts the tuples it sent per
receiver (``sent_to`` in its METRIC_RESP, kept by the coordinator; the
``links`` of its exit report at the end), and at the end every worker of
``b`` says what it received from each sender (its exit report): the two
must agree link by link.  A tuple crosses hosts when sender and receiver
are on different hosts of the physical topology (computed here).  "Before"
is everything sent up to the moment the router was asked; "after" is the
final count minus a snapshot taken once the switch finished.  The router's
own ``GET .../locality`` numbers (the same counters, from the METRIC_RESPs
it keeps) must show the same drop.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import emulated_cluster, finish, wait

from typhoon.operators.pairs import expected_counts
from typhoon.report import build_report
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
COUNT, RATE = 90_000, 5_000  # tuples, tuples/s: 18 s of input
KEYS = 100


def a_links(c, name: str, a_ids: list[int], stream: int) -> dict[tuple[int, int], int]:
    """What each worker of ``a`` had sent per receiver, from its last METRIC_RESP
    (``sent_to: {"dst:stream": n}``, the worker's own counter, read here, not through
    the router's code)."""
    status, metrics = c.rest("GET", f"/apps/{name}/metrics")
    assert status == 200, metrics
    links = {}
    for w, m in metrics.items():
        if int(w) in a_ids:
            for key, n in (m.get("sent_to") or {}).items():
                dst, sid = map(int, key.split(":"))
                if sid == stream:
                    links[(int(w), dst)] = int(n)
    return links


def crossed(links: dict[tuple[int, int], int], host: dict[int, str]) -> tuple[int, int]:
    """(tuples between workers on different hosts, all tuples) of ``links``, by the
    schedule's hosts."""
    return sum(n for (s, d), n in links.items() if host[s] != host[d]), sum(links.values())


def test_switch_from_hash_to_locality_tables_mid_run_counts_exact_and_halves_crossing(
    tmp_path,
):
    config = "metrics_interval = 0.25\nreconfig_step_timeout = 20\n[locality]\nmin_pairs = 500\n"
    with emulated_cluster(tmp_path, "l", apps=["apps/locality_router.py"], config=config) as c:
        t = copy.deepcopy(load_topology(ROOT / "topologies" / "locality.yaml"))
        t.name = "loc"
        t.nodes["source"].args.update(count=COUNT, rate=RATE, keys_a=KEYS, keys_b=KEYS)
        c.submit(t)
        c.wait_active(t.name)
        physical = c.coordinator.get_physical(t.name)
        a_ids = [w.worker_id for w in physical.of_node("a")]
        assert len({w.host for w in physical.of_node("a")}) == 3  # one of each per host
        # a hash-routed window to compare with: by count, not a sleep
        before = wait(
            lambda: (
                (links := a_links(c, t.name, a_ids, 2)) and sum(links.values()) >= 10_000 and links
            ),
            60,
            "10,000 a -> b tuples under hash routing",
        )
        started = time.monotonic()
        cli = subprocess.run(
            [sys.executable, "-m", "typhoon_cli", "locality", t.name, "--json",
             "--config", str(c.write_client_config()), "--timeout", "60"],
            capture_output=True, text=True, timeout=90, cwd=ROOT, env=os.environ.copy(),
        )  # fmt: skip
        switch_s = time.monotonic() - started
        assert cli.returncode == 0, cli.stdout + cli.stderr
        run = json.loads(cli.stdout)["result"]
        assert run["phase"] == "done" and run["reconfigurations"], run
        # still mid-run: the source had not finished when the switch was done
        assert c.coordinator.worker_statuses(t.name)[1].state != "exited"
        switched = wait(lambda: a_links(c, t.name, a_ids, 2) or None, 5, "metrics after")

        # the router measures too, from the METRIC_RESPs it keeps asking for: until it has
        # counted what the assertions below need
        def measured():
            status, shown = c.rest("GET", f"/apps/{t.name}/locality")
            assert status == 200, shown
            after = (shown.get("crossing") or {}).get("after") or {}
            return shown if after.get("tuples", 0) > 5_000 else None

        shown = wait(measured, 60, "the router's count of 5,000 tuples after the switch")
        topology, reports = finish(c, t.name)
        report = build_report(topology, reports)

    assert report["ok"], report["problems"]
    want_a, want_b = expected_counts(COUNT, 1, KEYS, KEYS, 0.8, 1)
    assert report["results"]["a"]["counts"] == want_a
    assert report["results"]["b"]["counts"] == want_b
    assert [s.grouping.type for s in topology.streams] == ["direct", "direct"]

    final, received = {}, {}
    b_ids = {w.worker_id for w in physical.of_node("b")}
    for r in reports:
        for side, out in (("out", final), ("in", received)):
            if r["worker"] in (a_ids if side == "out" else b_ids):
                for key, n in r["links"][side].items():
                    peer, sid = map(int, key.split(":"))
                    if sid == 2:
                        out[(r["worker"], peer) if side == "out" else (peer, r["worker"])] = n
    # what the senders counted is what the receivers counted, link by link
    assert final == received, (final, received)
    host = {w.worker_id: w.host for w in physical.workers}
    h_crossed, h_total = crossed(before, host)
    after = {k: n - switched.get(k, 0) for k, n in final.items() if n > switched.get(k, 0)}
    l_crossed, l_total = crossed(after, host)
    print(
        f"\nA->B tuples crossing hosts: hash {h_crossed / h_total:.3f} of {h_total}, "
        f"locality {l_crossed / l_total:.3f} of {l_total}; plan {run['plan']}; "
        f"router: {shown['crossing']}; switch took {switch_s:.2f} s"
    )
    assert h_total > 5_000 and l_total > 5_000
    assert l_crossed / l_total <= (h_crossed / h_total) / 2
    router = shown["crossing"]
    assert router["before"]["tuples"] >= h_total and router["after"]["tuples"] > 5_000
    assert router["after"]["fraction"] <= router["before"]["fraction"] / 2


@pytest.mark.long
def test_the_router_moves_keys_to_a_node_that_heads_a_chain_counts_exact(tmp_path):
    """b -> c is chained (forward, one process per instance on each host): the router
    reroutes a -> b to direct tables and moves b's keyed state, which never needs the
    chained edge on the network; a, b and c count exactly what the generator says."""
    import yaml

    from typhoon.topology import load_topology_text
    from typhoon.topology.chaining import chain_groups

    doc = yaml.safe_load((ROOT / "topologies" / "locality.yaml").read_text())
    doc["name"] = "locch"
    doc["bolts"][1]["operator"] = "count_forward"  # b passes its tuples on to c
    doc["bolts"].append({"id": "c", "operator": "count_by_key", "args": {"key": "b"},
                         "parallelism": 3, "stateful": True})  # fmt: skip
    doc["streams"].append({"from": "b", "to": "c", "grouping": "forward"})
    count = 60_000
    doc["spouts"][0]["args"].update(count=count, rate=RATE, keys_a=KEYS, keys_b=KEYS)
    t = load_topology_text(yaml.safe_dump(doc), "locch.yaml")
    config = "metrics_interval = 0.25\nreconfig_step_timeout = 20\n[locality]\nmin_pairs = 500\n"
    with emulated_cluster(tmp_path, "k", apps=["apps/locality_router.py"], config=config) as c:
        c.submit(t)
        c.wait_active(t.name)
        physical = c.coordinator.get_physical(t.name)
        groups = chain_groups(t, physical)
        assert len(groups) == 3, groups  # b[i] and c[i] share a process on each host
        a_ids = [w.worker_id for w in physical.of_node("a")]
        wait(lambda: sum(a_links(c, t.name, a_ids, 2).values()) >= 5_000, 60, "5,000 a -> b")
        cli = subprocess.run(
            [sys.executable, "-m", "typhoon_cli", "locality", t.name, "--json",
             "--config", str(c.write_client_config()), "--timeout", "60"],
            capture_output=True, text=True, timeout=90, cwd=ROOT, env=os.environ.copy(),
        )  # fmt: skip
        assert cli.returncode == 0, cli.stdout + cli.stderr
        run = json.loads(cli.stdout)["result"]
        assert run["phase"] == "done" and run["reconfigurations"], run
        now = c.coordinator.get_physical(t.name)
        assert chain_groups(c.coordinator.get_topology(t.name), now) == groups
        topology, reports = finish(c, t.name)
        report = build_report(topology, reports)
    assert report["ok"], report["problems"]
    want_a, want_b = expected_counts(count, 1, KEYS, KEYS, 0.8, 1)
    assert report["results"]["a"]["counts"] == want_a
    assert report["results"]["b"]["counts"] == want_b
    assert report["results"]["c"]["counts"] == want_b
    assert [s.grouping.type for s in topology.streams] == ["direct", "direct", "forward"]
