"""Fabric paths: shortest, deterministic, and consistent enough to form trees."""

import networkx as nx
import pytest
from fakeflows import cluster_of, line_cluster, mesh_cluster
from hypothesis import given
from hypothesis import strategies as st

from typhoon.cluster import Cluster, FabricLink, HostInfo
from typhoon.topology.fabric import (
    NoPath,
    TreeHop,
    fabric_graph,
    multicast_tree,
    next_hop_port,
    path,
    port_to,
    shortest_paths,
)


def test_graph_edges_carry_the_port_of_each_side():
    g = fabric_graph(line_cluster(3))
    assert sorted(g.nodes) == ["h1", "h2", "h3"]
    assert g.ports("h1", "h2") == {"h1": 1, "h2": 1}
    assert g.ports("h2", "h3") == {"h2": 2, "h3": 1}
    assert g.ports("h2", "h1") is g.ports("h1", "h2")
    assert list(g.links()) == [("h1", "h2", {"h1": 1, "h2": 1}), ("h2", "h3", {"h2": 2, "h3": 1})]
    assert "h2" in g and "h9" not in g
    assert list(g.neighbors("h2")) == ["h1", "h3"]
    with pytest.raises(KeyError):
        g.ports("h1", "h3")


def test_line_path_and_next_hops():
    g = fabric_graph(line_cluster(3))
    assert path(g, "h1", "h3") == ["h1", "h2", "h3"]
    assert path(g, "h3", "h1") == ["h3", "h2", "h1"]
    assert path(g, "h2", "h2") == ["h2"]
    assert next_hop_port(g, "h1", "h3") == 1
    assert next_hop_port(g, "h2", "h3") == 2
    assert next_hop_port(g, "h3", "h1") == 1


def test_ties_go_to_the_smallest_host_name():
    # a square: h1-h2-h4 and h1-h3-h4 are both two hops; links listed "backwards"
    c = cluster_of(
        ["h1", "h2", "h3", "h4"], [("h3", "h4"), ("h1", "h3"), ("h2", "h4"), ("h1", "h2")]
    )
    g = fabric_graph(c)
    assert path(g, "h1", "h4") == ["h1", "h2", "h4"]
    assert path(g, "h4", "h1") == ["h4", "h2", "h1"]
    assert next_hop_port(g, "h1", "h4") == port_to(g, "h1", "h2")


def test_link_order_does_not_change_paths():
    names = ["a", "b", "c", "d", "e"]
    edges = [("a", "b"), ("b", "c"), ("c", "d"), ("d", "e"), ("e", "a"), ("a", "c")]
    g1 = fabric_graph(cluster_of(names, edges))
    g2 = fabric_graph(cluster_of(names, list(reversed(edges))))
    for s in names:
        assert shortest_paths(g1, s) == shortest_paths(g2, s)


def test_unreachable_and_unknown_hosts():
    c = cluster_of(["h1", "h2", "h3"], [("h1", "h2")])
    g = fabric_graph(c)
    with pytest.raises(NoPath):
        path(g, "h1", "h3")
    with pytest.raises(KeyError):
        path(g, "h1", "nope")
    with pytest.raises(ValueError):
        next_hop_port(g, "h1", "h1")


@pytest.mark.parametrize(
    "links",
    [
        [FabricLink("h1", 1, "zz", 1)],  # unknown host
        [FabricLink("h1", 1, "h1", 2)],  # loop
        [FabricLink("h1", 1, "h2", 1), FabricLink("h1", 1, "h2", 2)],  # port used twice
    ],
)
def test_bad_links_are_rejected(links):
    hosts = {n: HostInfo(n, f"br-{n}", i + 1) for i, n in enumerate(["h1", "h2"])}
    with pytest.raises(ValueError):
        fabric_graph(Cluster(hosts, links))


def test_parallel_links_collapse_to_lowest_ports():
    hosts = {n: HostInfo(n, f"br-{n}", i + 1) for i, n in enumerate(["h1", "h2"])}
    c = Cluster(hosts, [FabricLink("h1", 5, "h2", 5), FabricLink("h2", 2, "h1", 3)])
    assert fabric_graph(c).ports("h1", "h2") == {"h1": 3, "h2": 2}


def test_multicast_tree_on_a_line_forwards_one_copy_per_link():
    g = fabric_graph(line_cluster(4))
    tree = multicast_tree(g, "h1", ["h1", "h3", "h4"])
    assert tree == {
        "h1": TreeHop(None, (("h2", 1),)),
        "h2": TreeHop(1, (("h3", 2),)),
        "h3": TreeHop(1, (("h4", 2),)),
        "h4": TreeHop(1, ()),
    }


def test_multicast_tree_on_a_mesh_is_a_star():
    g = fabric_graph(mesh_cluster(4))
    tree = multicast_tree(g, "h2", ["h1", "h3", "h4"])
    assert tree["h2"].in_port is None
    assert [c for c, _ in tree["h2"].children] == ["h1", "h3", "h4"]
    assert all(tree[h].children == () for h in ("h1", "h3", "h4"))


def test_multicast_tree_without_receivers_is_the_source_alone():
    g = fabric_graph(line_cluster(2))
    assert multicast_tree(g, "h1", []) == {"h1": TreeHop(None, ())}


@st.composite
def connected_clusters(draw):
    n = draw(st.integers(1, 7))
    names = [f"h{i}" for i in range(n)]
    edges = {(names[draw(st.integers(0, i - 1))], names[i]) for i in range(1, n)}
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    if pairs:
        edges |= set(draw(st.lists(st.sampled_from(pairs), max_size=6)))
    return cluster_of(names, sorted(edges))


@given(c=connected_clusters(), data=st.data())
def test_paths_are_shortest_and_trees_are_trees(c, data):
    g = fabric_graph(c)
    names = sorted(c.hosts)
    src = data.draw(st.sampled_from(names))
    dsts = data.draw(st.lists(st.sampled_from(names), max_size=len(names)))
    oracle = nx.Graph()  # networkx checks the hop counts
    oracle.add_nodes_from(g.nodes)
    oracle.add_edges_from((a, b) for a, b, _ in g.links())
    for dst in names:
        assert len(path(g, src, dst)) == nx.shortest_path_length(oracle, src, dst) + 1
    tree = multicast_tree(g, src, dsts)
    # every receiver host reachable from the source by following children; in_port
    # is the port facing the parent; every tree host appears exactly once as a child
    reached, frontier = {src}, [src]
    while frontier:
        host = frontier.pop()
        for child, port in tree[host].children:
            assert port == port_to(g, host, child)
            assert tree[child].in_port == port_to(g, child, host)
            assert child not in reached
            reached.add(child)
            frontier.append(child)
    assert reached == set(tree)
    assert set(dsts) <= reached
    # a frame to one receiver follows the same path as a unicast frame would
    for dst in dsts:
        assert all(h in tree for h in path(g, src, dst))
