"""The ``network.transport`` section: how a RoCE fabric's packet transport behaves.

Three independent parts, every one optional (docs/transport.md has each default's source):

- ``lossless``: ``none`` (a switch drops what its shared buffer cannot hold: drop-tail) or
  ``pfc`` (IEEE 802.1Qbb PAUSE: an ingress port whose buffered bytes exceed its XOFF threshold
  pauses the upstream transmitter until they fall below XON), with the switch buffer size and
  either static per-port thresholds or a shared buffer with dynamic thresholds (alpha).
- ``ecn``: RED-style marking on switch egress queues, ``kmin_bytes`` / ``kmax_bytes`` / ``pmax``
  given at ``reference_gbps`` and scaled linearly with each link's speed.
- ``cc``: the NIC congestion control, ``none``, ``dcqcn`` (with its reaction-point and
  notification-point parameters) or ``hpcc``.

Backends read the frozen :class:`TransportSpec` from ``Topology.transport`` (None: the section
is absent, and every backend behaves as it did before the section existed). Nothing here is
backend-specific: the htsim driver and the ns-3 engine implement the same meaning.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from ..errors import PlanError
from . import _fields as f

Lossless = Literal["none", "pfc"]
CongestionControl = Literal["none", "dcqcn", "hpcc"]

# Bounds that keep a hostile plan's values inside what the engines' 64-bit integers hold.
_MAX_BYTES = 1 << 40
_MAX_US = 1e6


@dataclass(frozen=True)
class PfcSpec:
    """Switch buffer and PFC thresholds (bytes; per switch, per ingress port)."""

    # Shared packet buffer of every switch (bytes): a packet that would overflow it is dropped
    # (drop-tail without PFC; counted as a drop with PFC, where headroom should prevent it).
    buffer_bytes: int = 32 * 1024 * 1024
    # Dynamic thresholds (Choudhury & Hahne): a port pauses its upstream when its ingress bytes
    # exceed alpha x (buffer free bytes). None: the static xoff_bytes / xon_bytes below.
    alpha: float | None = 0.125
    xoff_bytes: int = 0  # static XOFF (used when alpha is None; 0 there is an error)
    xon_bytes: int = 0   # static XON, below xoff_bytes
    # With dynamic thresholds: resume once the ingress bytes fall this far below the threshold.
    xon_offset_bytes: int = 2 * 9000 + 64


@dataclass(frozen=True)
class EcnSpec:
    """RED marking on switch egress queues; thresholds at ``reference_gbps``, scaled by speed."""

    kmin_bytes: int = 5_000
    kmax_bytes: int = 200_000
    pmax: float = 0.01
    reference_gbps: float = 40.0

    def thresholds_at(self, gbps: float) -> tuple[int, int]:
        """(kmin, kmax) in bytes for a link of ``gbps``: linear in speed (docs/transport.md)."""
        s = gbps / self.reference_gbps
        return int(round(self.kmin_bytes * s)), int(round(self.kmax_bytes * s))


@dataclass(frozen=True)
class DcqcnSpec:
    """DCQCN (Zhu et al., SIGCOMM 2015): reaction point (sender NIC) and notification point."""

    # Defaults: the DCQCN paper's parameters (Zhu et al., SIGCOMM 2015), the minimum rate
    # NVIDIA ConnectX's; each with its source, and NVIDIA's alternatives, in docs/transport.md.
    g: float = 1.0 / 256           # alpha gain: alpha <- (1 - g) alpha (+ g after a CNP)
    alpha_timer_us: float = 55.0   # alpha update period
    rate_timer_us: float = 55.0    # rate-increase timer
    byte_counter_bytes: int = 10 * 1024 * 1024  # rate-increase byte counter
    fast_recovery_steps: int = 5   # F: increase events of fast recovery
    rai_mbps: float = 40.0         # additive increase step
    rhai_mbps: float = 400.0       # hyper increase step (10 x rai_mbps, docs/transport.md)
    min_rate_mbps: float = 1.0     # the rate limiter's floor (NVIDIA rpg_min_rate)
    cnp_interval_us: float = 50.0  # notification point: at most one CNP per flow per interval
    initial_alpha: float = 1.0     # alpha at a flow's first CNP


@dataclass(frozen=True)
class HpccSpec:
    """HPCC (Li et al., SIGCOMM 2019) through htsim's HPCCSrc; base RTT from the topology."""

    eta: float = 0.95        # target link utilisation
    max_stage: int = 5       # additive-increase stages before a multiplicative update
    w_ai_bytes: int = 0      # additive increase per update (0: one MSS, htsim's HPCCSrc default)


@dataclass(frozen=True)
class TransportSpec:
    lossless: Lossless = "none"
    pfc: PfcSpec = field(default_factory=PfcSpec)
    ecn: EcnSpec | None = None  # None: no ECN marking
    cc: CongestionControl = "none"
    dcqcn: DcqcnSpec = field(default_factory=DcqcnSpec)
    hpcc: HpccSpec = field(default_factory=HpccSpec)


def _bytes(m: Any, key: str, path: str, default: int, minimum: int = 1) -> int:
    return f.get_int(m, key, path, default, minimum=minimum, maximum=_MAX_BYTES,
                     limit="2^40 bytes")


def _parse_pfc(value: Any, path: str) -> PfcSpec:
    m = f.expect_mapping(value, path)
    d = PfcSpec()
    f.check_keys(m, path, [x.name for x in dataclasses.fields(PfcSpec)])
    buf = _bytes(m, "buffer_bytes", path, d.buffer_bytes)
    alpha: float | None = d.alpha
    if "alpha" in m and m["alpha"] is None:
        alpha = None
    else:
        alpha = f.get_number(m, "alpha", path, d.alpha, at_most=64.0)
    xoff = _bytes(m, "xoff_bytes", path, d.xoff_bytes, minimum=0)
    xon = _bytes(m, "xon_bytes", path, d.xon_bytes, minimum=0)
    off = _bytes(m, "xon_offset_bytes", path, d.xon_offset_bytes, minimum=0)
    if (xoff or xon) and alpha is not None and "alpha" in m:
        raise PlanError(f.join(path, "alpha"),
                        "give either alpha (dynamic thresholds) or xoff_bytes / xon_bytes"
                        " (static), not both")
    if xoff or xon:
        alpha = None  # static thresholds written: they replace the dynamic default
    if alpha is None:
        if xoff <= 0:
            raise PlanError(f.join(path, "xoff_bytes"),
                            "static thresholds need a positive xoff_bytes (or set alpha)")
        if not xon < xoff:
            raise PlanError(f.join(path, "xon_bytes"),
                            f"must be below xoff_bytes ({xoff}) (got {xon})")
        if xoff >= buf:
            raise PlanError(f.join(path, "xoff_bytes"),
                            f"must be below buffer_bytes ({buf}) (got {xoff})")
    return PfcSpec(buffer_bytes=buf, alpha=alpha, xoff_bytes=xoff, xon_bytes=xon,
                   xon_offset_bytes=off)


def _parse_ecn(value: Any, path: str) -> EcnSpec:
    m = f.expect_mapping(value, path)
    d = EcnSpec()
    f.check_keys(m, path, [x.name for x in dataclasses.fields(EcnSpec)])
    kmin = _bytes(m, "kmin_bytes", path, d.kmin_bytes, minimum=0)
    kmax = _bytes(m, "kmax_bytes", path, d.kmax_bytes)
    if not kmin < kmax:
        raise PlanError(f.join(path, "kmax_bytes"),
                        f"must be above kmin_bytes ({kmin}) (got {kmax})")
    pmax = f.get_number(m, "pmax", path, d.pmax, at_most=1.0)
    ref = f.get_number(m, "reference_gbps", path, d.reference_gbps, at_most=1e6)
    return EcnSpec(kmin_bytes=kmin, kmax_bytes=kmax, pmax=pmax, reference_gbps=ref)


def _parse_dcqcn(value: Any, path: str) -> DcqcnSpec:
    m = f.expect_mapping(value, path)
    d = DcqcnSpec()
    f.check_keys(m, path, [x.name for x in dataclasses.fields(DcqcnSpec)])
    us = {k: f.get_number(m, k, path, getattr(d, k), at_most=_MAX_US)
          for k in ("alpha_timer_us", "rate_timer_us", "cnp_interval_us")}
    mbps = {k: f.get_number(m, k, path, getattr(d, k), at_most=1e7)
            for k in ("rai_mbps", "rhai_mbps", "min_rate_mbps")}
    return DcqcnSpec(
        g=f.get_number(m, "g", path, d.g, at_most=1.0),
        byte_counter_bytes=_bytes(m, "byte_counter_bytes", path, d.byte_counter_bytes),
        fast_recovery_steps=f.get_int(m, "fast_recovery_steps", path, d.fast_recovery_steps,
                                      minimum=0, maximum=1000),
        initial_alpha=f.get_number(m, "initial_alpha", path, d.initial_alpha, at_most=1.0),
        **us, **mbps,
    )


def _parse_hpcc(value: Any, path: str) -> HpccSpec:
    m = f.expect_mapping(value, path)
    d = HpccSpec()
    f.check_keys(m, path, [x.name for x in dataclasses.fields(HpccSpec)])
    return HpccSpec(
        eta=f.get_number(m, "eta", path, d.eta, at_most=1.0),
        max_stage=f.get_int(m, "max_stage", path, d.max_stage, minimum=0, maximum=1000),
        w_ai_bytes=_bytes(m, "w_ai_bytes", path, d.w_ai_bytes, minimum=0),
    )


def parse_transport(value: Any, path: str) -> TransportSpec:
    """The ``network.transport`` mapping -> TransportSpec (PlanError naming the YAML path)."""
    m = f.expect_mapping(value, path)
    f.check_keys(m, path, ("lossless", "pfc", "ecn", "cc", "dcqcn", "hpcc"))
    d = TransportSpec()
    lossless = f.get_enum(m, "lossless", path, get_args(Lossless), d.lossless)
    cc = f.get_enum(m, "cc", path, get_args(CongestionControl), d.cc)
    pfc = _parse_pfc(m.get("pfc", {}), f.join(path, "pfc"))
    ecn = _parse_ecn(m["ecn"], f.join(path, "ecn")) if m.get("ecn") is not None else None
    if cc == "dcqcn" and ecn is None:
        ecn = EcnSpec()  # DCQCN reacts to ECN marks: it implies marking at the defaults
    if "dcqcn" in m and cc != "dcqcn":
        raise PlanError(f.join(path, "dcqcn"), f"given but cc is {cc} (set cc: dcqcn)")
    if "hpcc" in m and cc != "hpcc":
        raise PlanError(f.join(path, "hpcc"), f"given but cc is {cc} (set cc: hpcc)")
    dcqcn = _parse_dcqcn(m.get("dcqcn", {}), f.join(path, "dcqcn"))
    hpcc = _parse_hpcc(m.get("hpcc", {}), f.join(path, "hpcc"))
    return TransportSpec(lossless=lossless, pfc=pfc, ecn=ecn, cc=cc,  # type: ignore[arg-type]
                         dcqcn=dcqcn, hpcc=hpcc)

