"""network.transport (plan/transport.py): parsing, one-line errors, digest, round trip, and the
htsim backend's transport file and extended queue telemetry (no driver needed)."""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers.htsim import star
from xsim_htsim._output import QUEUES_HEADER, TRANSPORT_FIELDS, read_queues
from xsim_htsim._transport import write_transport

from xsim_adapters.errors import BackendError, PlanError
from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.plan.serialize import plan_to_dict
from xsim_adapters.plan.transport import EcnSpec, TransportSpec, parse_transport
from xsim_adapters.topology.build import build_topology
from xsim_adapters.workload.generate import plan_digest

REPO = Path(__file__).resolve().parent.parent
PLAN = REPO / "workloads" / "congested-incast-slow-nic.yaml"
# plan_digest of the shipped plan computed by the code before network.transport existed
DIGEST_BEFORE = "408fe6cdfee41f790bfbf15b10d0a29bc4b1ba3ce136b16ba72a149c14919a70"


def plan_dict() -> dict:
    return dict(yaml.safe_load(PLAN.read_text()))


def with_transport(section: object) -> dict:
    d = plan_dict()
    d.setdefault("network", {})["transport"] = section
    return d


def test_absent_section_keeps_meaning_and_digest() -> None:
    plan = plan_from_dict(plan_dict(), str(PLAN.parent))
    assert plan.network.transport is None
    assert plan_digest(plan) == DIGEST_BEFORE
    assert build_topology(plan).transport is None
    assert "transport" not in plan_to_dict(plan)["network"]


def test_defaults_and_digest_moves() -> None:
    plan = plan_from_dict(with_transport({"lossless": "pfc", "cc": "dcqcn"}), str(PLAN.parent))
    t = plan.network.transport
    assert t is not None and (t.lossless, t.cc) == ("pfc", "dcqcn")
    assert t.ecn == EcnSpec()  # DCQCN implies marking at the defaults
    assert t.pfc.alpha == 0.125 and t.pfc.buffer_bytes == 32 << 20
    assert (t.dcqcn.g, t.dcqcn.rate_timer_us, t.dcqcn.cnp_interval_us) == (1 / 256, 55.0, 50.0)
    assert plan_digest(plan) != DIGEST_BEFORE
    assert build_topology(plan).transport == t


@pytest.mark.parametrize("section", [
    {"lossless": "pfc", "cc": "dcqcn", "dcqcn": {"rai_mbps": 10}},
    {"lossless": "none", "cc": "hpcc", "hpcc": {"eta": 0.9, "w_ai_bytes": 80},
     "pfc": {"xoff_bytes": 300000, "xon_bytes": 200000}},
    {"ecn": {"kmin_bytes": 1000, "kmax_bytes": 9000, "pmax": 0.5, "reference_gbps": 100}},
])
def test_round_trip(section: dict) -> None:
    plan = plan_from_dict(with_transport(section), str(PLAN.parent))
    again = plan_from_dict(copy.deepcopy(plan_to_dict(plan)), str(PLAN.parent))
    assert again.network.transport == plan.network.transport
    assert plan_digest(again) == plan_digest(plan)


@pytest.mark.parametrize("section, message", [
    ({"lossless": "ecn"}, "network.transport.lossless: expected one of none, pfc (got 'ecn')"),
    ({"cc": "timely"}, "network.transport.cc: expected one of none, dcqcn, hpcc (got 'timely')"),
    ({"pfc": {"xon": 1}}, "network.transport.pfc.xon: unknown key; expected one of"),
    ({"cc": "none", "dcqcn": {}}, "network.transport.dcqcn: given but cc is none (set cc: dcqcn)"),
    ({"pfc": {"xoff_bytes": 1000, "xon_bytes": 1000}},
     "network.transport.pfc.xon_bytes: must be below xoff_bytes (1000) (got 1000)"),
    ({"pfc": {"alpha": 0.5, "xoff_bytes": 1000}},
     "network.transport.pfc.alpha: give either alpha (dynamic thresholds) or xoff_bytes"),
    ({"pfc": {"buffer_bytes": 1000, "xoff_bytes": 5000}},
     "network.transport.pfc.xoff_bytes: must be below buffer_bytes (1000) (got 5000)"),
    ({"ecn": {"kmin_bytes": 5000, "kmax_bytes": 5000}},
     "network.transport.ecn.kmax_bytes: must be above kmin_bytes (5000) (got 5000)"),
    ({"ecn": {"pmax": 1.5}}, "network.transport.ecn.pmax: expected a number in (0, 1]"),
    ({"dcqcn": {"g": 0}, "cc": "dcqcn"}, "network.transport.dcqcn.g: expected a number in"),
    ("pfc", "network.transport: expected a mapping"),
])
def test_errors_name_the_yaml_path(section: object, message: str) -> None:
    with pytest.raises(PlanError) as e:
        plan_from_dict(with_transport(section), str(PLAN.parent))
    text = str(e.value)
    assert message in text and "\n" not in text


def test_ecn_thresholds_scale_with_link_speed() -> None:
    e = EcnSpec()  # 5 KB / 200 KB at 40 Gb/s
    assert e.thresholds_at(40.0) == (5_000, 200_000)
    assert e.thresholds_at(400.0) == (50_000, 2_000_000)


def test_transport_file_lists_every_link(tmp_path: Path) -> None:
    topo = star(3, [100.0, 100.0, 400.0], tier="nic")
    spec = parse_transport({"lossless": "pfc", "cc": "dcqcn"}, "network.transport")
    write_transport(spec, topo, tmp_path / "t.txt", "roce", None)
    lines = (tmp_path / "t.txt").read_text().splitlines()
    assert "lossless pfc" in lines and "cc dcqcn" in lines and "alpha 0.125" in lines
    ecn = [ln.split() for ln in lines if ln.startswith("ecn_link")]
    assert [int(x[1]) for x in ecn] == list(range(6))
    assert ecn[4][2:] == ["50000", "2000000"]  # gpu2's 400G cable
    assert ecn[0][2:] == ["12500", "500000"]


@pytest.mark.parametrize("protocol, queue_bytes, message", [
    ("ndp", None, "applies to protocol roce only (got protocol ndp)"),
    ("roce", 100000, "option queue_bytes conflicts with network.transport"),
])
def test_transport_refuses_what_it_does_not_model(tmp_path: Path, protocol: str,
                                                  queue_bytes: int | None, message: str) -> None:
    with pytest.raises(BackendError, match=re.escape(message)):
        write_transport(TransportSpec(lossless="pfc"), star(2, 100.0), tmp_path / "t.txt",
                        protocol, queue_bytes)


def test_extended_queue_file(tmp_path: Path) -> None:
    p = tmp_path / "q.csv"
    p.write_text(f"{QUEUES_HEADER},{TRANSPORT_FIELDS}\n0,9064,10.5,0,0,0,3,2,2,1500000,7\n"
                 "1,64,0.1,4,0,36256,0,0,0,0,0\n")
    q = read_queues(p, 2)
    assert q is not None
    assert q["pause_sent"].tolist() == [2.0, 0.0] and q["paused_ns"].tolist() == [1500.0, 0.0]
    assert q["ecn_marks"].tolist() == [3.0, 0.0] and q["cnps"].tolist() == [7.0, 0.0]
    assert q["drops"].tolist() == [0.0, 4.0] and q["drop_bytes"].tolist() == [0.0, 36256.0]
    p.write_text(f"{QUEUES_HEADER}\n0,1,1.0,0,0\n")
    plain = read_queues(p, 1)
    assert plain is not None and "pause_sent" not in plain and np.isnan(plain["ecn_marks"][0])


def test_ns3_refuses_the_section_rather_than_ignoring_it() -> None:
    from xsim_ns3 import Ns3Backend

    from xsim_adapters.trace.builder import TraceBuilder

    tb = TraceBuilder(2)
    tb.flow(0, 1, 1000)
    topo = dataclasses.replace(star(2, 100.0), transport=TransportSpec(lossless="pfc"))
    with pytest.raises(BackendError, match="ns3: network.transport .* is not modelled"):
        Ns3Backend().run(tb.build(), topo, {})
