"""Deterministic ECMP routing: stable, spread over equal-cost paths, GPU to GPU, bulk == single."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
from helpers.topo import make_plan

from xsim_adapters.plan.model import ScaleOut
from xsim_adapters.topology import Router, build_topology, stable_hash
from xsim_adapters.topology.routing import bucket_of, stable_hash_array


def leaf_spine():
    so = ScaleOut(oversubscription=2.0, nodes_per_leaf=4)
    return build_topology(make_plan([("h", "H100", 8, 8)], so))


def test_stable_hash_is_splitmix64():
    assert stable_hash(0) == 0xE220A8397B1DCDAF  # first output of splitmix64 seeded with 0
    xs = np.array([0, 1, 2, 12345, 2**40], dtype=np.int64)
    assert stable_hash_array(xs).tolist() == [stable_hash(int(x)) for x in xs]


def test_path_is_the_same_in_another_process():
    # str hashing is salted per process; our routing must not be
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r});"
        "from test_topo_routing import leaf_spine;"
        "print([leaf_spine().path(0, 63, k).tolist() for k in range(20)])"
    )
    outs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True, env={"PYTHONHASHSEED": seed, "PATH": ""}).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1
    topo = leaf_spine()
    assert outs.pop().strip() == str([topo.path(0, 63, k).tolist() for k in range(20)])


def test_every_path_runs_from_source_gpu_to_destination_gpu():
    topo = leaf_spine()
    src = topo.links["src"].to_numpy()
    dst = topo.links["dst"].to_numpy()
    kind = topo.nodes["kind"].to_numpy()
    rng = np.random.default_rng(0)
    for _ in range(300):
        a, b = (int(x) for x in rng.integers(0, 64, size=2))
        key = int(rng.integers(0, 10**9))
        p = topo.path(a, b, key)
        if a == b:
            assert len(p) == 0
            continue
        assert src[p[0]] == topo.rank_node[a] and dst[p[-1]] == topo.rank_node[b]
        assert (dst[p[:-1]] == src[p[1:]]).all()  # contiguous
        assert all(kind[n] != "gpu" for n in dst[p[:-1]])  # GPUs never forward
        if a // 8 == b // 8:
            assert kind[dst[p[0]]] == "nvswitch" and len(p) == 2
        elif a // 32 == b // 32:
            assert kind[dst[p[0]]] == "leaf" and len(p) == 2
        else:
            assert kind[dst[p[1]]] == "spine" and len(p) == 4


def test_ecmp_is_deterministic_and_spreads_over_spines():
    topo = leaf_spine()
    again = leaf_spine()
    dst = topo.links["dst"].to_numpy()
    names = topo.nodes["name"].to_numpy()
    spines = Counter()
    for key in range(1600):
        p = topo.path(0, 63, key)
        assert p.tolist() == again.path(0, 63, key).tolist()
        spines[names[dst[p[1]]]] += 1
    assert set(spines) == {f"spine{j}" for j in range(16)}
    assert max(spines.values()) < 2.5 * 1600 / 16  # roughly even


def test_paths_for_matches_path_as_csr():
    topo = leaf_spine()
    rng = np.random.default_rng(1)
    src = rng.integers(0, 64, size=500)
    dst = rng.integers(0, 64, size=500)
    keys = rng.integers(0, 2**40, size=500)
    offsets, links = topo.paths_for(src, dst, keys)
    assert offsets.dtype == np.int64 and links.dtype == np.int32
    assert len(offsets) == 501 and offsets[0] == 0 and offsets[-1] == len(links)
    for i in range(500):
        one = topo.path(int(src[i]), int(dst[i]), int(keys[i]))
        assert links[offsets[i]:offsets[i + 1]].tolist() == one.tolist()
    assert ((0 <= bucket_of(keys)) & (bucket_of(keys) < 256)).all()


def test_paths_of_rows_in_slices_matches_path_per_row(monkeypatch):
    """Routing in slices (3 flows per slice here) gives every listed row the path of
    ``path(rank, dst, row)`` and every other row no links, as CSR over all rows."""
    from xsim_adapters.topology import routing

    monkeypatch.setattr(routing, "ROUTE_SLICE_FLOWS", 3)
    topo = leaf_spine()
    rng = np.random.default_rng(2)
    n = 40
    rank = rng.integers(0, 64, size=n).astype(np.int32)
    dst = rng.integers(0, 64, size=n).astype(np.int32)
    rows = np.sort(rng.choice(n, size=25, replace=False))
    offsets, links = topo.paths_of_rows(pd.DataFrame({"rank": rank, "dst": dst}), rows)
    assert offsets.dtype == np.int64 and links.dtype == np.int32
    assert len(offsets) == n + 1 and offsets[0] == 0 and offsets[-1] == len(links)
    listed = set(rows.tolist())
    for r in range(n):
        got = links[offsets[r]:offsets[r + 1]].tolist()
        want = topo.path(int(rank[r]), int(dst[r]), r).tolist() if r in listed else []
        assert got == want, r
    # the path table numbers each distinct route once
    toff, tlinks = topo.router.path_table()
    table = {tuple(tlinks[toff[i]:toff[i + 1]].tolist()) for i in range(len(toff) - 1)}
    assert len(table) == len(toff) - 1


def test_router_built_lazily_from_frames_equals_the_builder_router():
    topo = leaf_spine()
    fresh = Router(topo.nodes, topo.links)
    for key in range(50):
        assert fresh.path(3, 60, key).tolist() == topo.path(3, 60, key).tolist()
    topo._router = None  # a hand-made Topology without router gets one on first use
    assert topo.path(3, 60, 7).tolist() == fresh.path(3, 60, 7).tolist()


def test_fat_tree_paths_spread_over_cores():
    topo = build_topology(make_plan([("h", "H100", 8, 8)], ScaleOut(topology="fat_tree")))
    assert topo.meta["fat_tree_k"] == 8
    names = topo.nodes["name"].to_numpy()
    dst = topo.links["dst"].to_numpy()
    cores = {names[dst[topo.path(0, 63, k)[2]]] for k in range(2000)}
    assert len(cores) == 16  # (k/2)^2 cores, all used
