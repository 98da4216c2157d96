"""Locality-aware key routing (seed paper 003, Caneill et al.; issue 17).

Two consecutive ``fields`` groupings (key ``a`` into node A, then key ``b``
into node B) put correlated keys on different hosts when both are hashed.
``spacesaving`` counts the most frequent ``(a, b)`` pairs in bounded memory;
``partition`` splits the bipartite key graph over the hosts with METIS
(balanced load, most pair weight inside a host) and turns it into ``direct``
routing tables: hot keys to a worker, every other key hashed as before.
"""
