"""The validated deployment plan: frozen dataclasses, one per YAML section.

Units are in every field name. A ``Plan`` is only ever built by :func:`xsim_adapters.plan.load_plan`
(or :func:`xsim_adapters.plan.plan_from_dict`), which validates everything; code downstream may
assume every invariant documented here holds.

Global numbering (used by the trace, the topology and every backend):
- device groups are numbered in plan order; a group's devices are numbered 0..n-1 as
  ``node_in_group * gpus_per_node + local_index``;
- the global rank of device ``d`` of group ``g`` is ``sum(devices of groups before g) + d``;
- the global node (server) index likewise: ``sum(nodes of groups before g) + d // gpus_per_node``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from .transport import TransportSpec

if TYPE_CHECKING:
    from .perturb import PerturbSpec

Schedule = Literal["gpipe", "1f1b", "interleaved", "zb_h1"]
Recompute = Literal["none", "selective", "full"]
# Training precision: the number format of the GEMMs (see docs/compute.md). bf16/fp16: mixed
# precision with fp32 master weights (16-bit tensor-core peak); fp8: fp8 GEMMs (Transformer
# Engine), bf16 elsewhere; tf32: fp32 storage, tf32 tensor-core GEMMs; fp32: no tensor cores.
Precision = Literal["bf16", "fp16", "fp8", "tf32", "fp32"]
# Number format of the gradients the data-parallel sync reduces; "auto" is Megatron-LM's rule
# (see TrainingSpec.grad_reduce_bytes).
GradDtype = Literal["auto", "fp32", "bf16", "fp16"]
Resharding = Literal["lcm", "gather_p2p_scatter", "direct"]
Granularity = Literal["step", "chunked"]
RingOrder = Literal["hetero_aware", "natural"]
Algorithm = Literal["auto", "ring", "tree", "nvls", "hierarchical"]
EcmpMode = Literal["flow", "connection"]
NcclNet = Literal["ib", "socket"]  # NCCL's network plugin between servers (docs/topology.md)
ScaleOutTopology = Literal["leaf_spine", "fat_tree"]
LinkEventKind = Literal["degrade", "fail", "restore", "nic_down", "nic_up"]
#: Event kinds that name a GPU (its NIC's cable to the fabric) instead of two nodes.
NIC_EVENT_KINDS = ("nic_down", "nic_up")
ServerFabric = Literal["nvswitch", "pcie", "nvlink_mesh"]
NicLayout = Literal["per_gpu", "per_pair", "per_server"]

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}
Router = Literal["softmax_topk", "sigmoid_topk"]
Routing = Literal["balanced", "zipf"]
ExpertPlacement = Literal["uniform", "by_speed"]
AllToAll = Literal["direct", "hierarchical"]


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-experts FFN layers (see docs/moe.md; the helpers are in :mod:`.moe`).

    Layer ``l`` is an MoE layer iff ``l >= first_dense_layers`` and
    ``(l - first_dense_layers) % every == 0``; other layers keep the dense FFN of
    ``ModelSpec.ffn_hidden``. An MoE layer has a router (``hidden x num_experts``), ``num_experts``
    routed experts of ``expert_ffn_hidden`` (gated like the model's MLP) of which each token uses
    ``top_k``, and ``shared_experts`` always-on experts of ``shared_ffn_hidden`` each.
    """

    num_experts: int
    top_k: int
    expert_ffn_hidden: int
    shared_experts: int = 0
    shared_ffn_hidden: int = 0  # per shared expert; 0 means expert_ffn_hidden
    every: int = 1  # MoE layer frequency: 1 every layer, 2 every other layer, ...
    first_dense_layers: int = 0  # the first k layers keep the dense FFN (DeepSeek)
    router: Router = "softmax_topk"  # both cost one h x E GEMM and a top-k (no cost difference)
    capacity_factor: float | None = None  # None: dropless; else tokens per expert are capped
    routing: Routing = "balanced"  # balanced: T*k/E tokens per expert; zipf: skewed (seeded)
    zipf_exponent: float = 1.0  # skew of "zipf" routing: expert popularity ~ 1 / rank^exponent
    placement: ExpertPlacement = "uniform"  # experts over the EP group: equal, or by device speed
    alltoall: AllToAll = "direct"  # dispatch/combine lowering: pairwise, or intra-server first
    # A bias per expert on the router's scores: GPT-OSS's router linear layer, DeepSeek-V3's
    # e_score_correction_bias (num_experts parameters per MoE layer either way).
    router_bias: bool = False

    @property
    def shared_ffn(self) -> int:
        return self.shared_ffn_hidden or self.expert_ffn_hidden


@dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3): queries and keys/values pass through
    low-rank latents; each head has a ``qk_nope_head_dim`` part without and a
    ``qk_rope_head_dim`` part with rotary position, and values of ``v_head_dim``
    (see :mod:`.attention`)."""

    q_lora_rank: int  # 0: no query latent (a direct hidden -> heads x qk projection)
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class AttentionSpec:
    """Attention beyond ``heads`` / ``kv_heads`` (``model.attention``; :mod:`.attention`)."""

    head_dim: int = 0  # per-head width; 0: hidden / heads (GPT-OSS: 64 with hidden 2880)
    bias: bool = False  # biases on the Q, K, V and output projections (GPT-OSS)
    mla: MLASpec | None = None  # multi-head latent attention instead of Q/K/V projections
    sliding_window: int = 0  # tokens a query attends to in windowed layers; 0: no window
    # With a window: layer l keeps full attention iff (l + 1) % full_every == 0 (GPT-OSS 2:
    # windowed, full, windowed, ...); 0: every layer is windowed.
    full_every: int = 0
    sinks: bool = False  # a learned logit per head in every softmax (GPT-OSS attention sinks)


@dataclass(frozen=True)
class ModelSpec:
    """Transformer shape. ``kv_heads < heads`` means grouped-query attention."""

    name: str
    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    kv_heads: int
    seq_len: int
    vocab: int
    dtype: str = "bf16"
    gated_mlp: bool = True  # SwiGLU (Llama): three FFN matrices; False: GELU (GPT): two
    moe: MoESpec | None = None  # mixture-of-experts FFN layers; None: a dense model
    attention: AttentionSpec | None = None  # None: standard multi-head / grouped-query attention
    mlp_bias: bool = False  # biases on a gated MLP's (and every expert's) projections (GPT-OSS)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def head_dim(self) -> int:
        a = self.attention
        return a.head_dim if a is not None and a.head_dim else self.hidden // self.heads


@dataclass(frozen=True)
class OverlapSpec:
    """Which communication overlaps compute (Megatron-Core's switches; see docs/plan.md)."""

    tp_comm: bool = False  # TP reduce-scatter / all-gather pipelined with the GEMM blocks
    dp_grad_reduce: bool = True  # DP gradient sync per bucket as soon as its backward is done
    param_gather: bool = True  # ZeRO all-gather of updated parameters overlaps the next forward


@dataclass(frozen=True)
class FSDPSpec:
    """ZeRO-3 / FSDP (``training.zero_stage: 3``): how the sharded parameters are gathered.

    An FSDP unit is a DP bucket (``collectives.dp_bucket_layers`` layers, default 1: torchtitan
    wraps every transformer block); the embedding is in the first unit, the head in the last.
    """

    # after each unit's forward its gathered parameters are freed and all-gathered again
    # before its backward (PyTorch FSDP reshard_after_forward, DeepSpeed ZeRO-3's default)
    reshard_after_forward: bool = True
    # all-gathers in flight ahead of the compute that needs them (FSDP forward/backward
    # prefetch; FSDP2 and DeepSpeed prefetch one unit by default)
    prefetch: int = 1
    # HSDP (PyTorch HYBRID_SHARD, torchtitan dp_shard x dp_replicate): shard within groups of
    # this many consecutive replicas and replicate across the groups; 0: shard over all
    hsdp_shard: int = 0


@dataclass(frozen=True)
class TrainingSpec:
    """Batching, pipeline schedule and memory-saving options."""

    global_batch: int  # sequences per iteration, over all replicas
    micro_batch: int  # sequences per micro-batch
    schedule: Schedule = "1f1b"
    optimizer: str = "adam"
    zero_stage: int = 0  # 0..3: ZeRO-1 shards optimizer state, 2 also gradients, 3 also weights
    # Activation recompute: "full" runs every layer's forward again before its backward,
    # "selective" only the attention core (Megatron's selective recompute), "none" neither.
    recompute: Recompute = "none"
    sequence_parallel: bool = False  # TP all-reduce -> reduce-scatter + all-gather
    causal_attention_halving: bool = False  # count only half of the s^2 attention FLOPs
    # FlashAttention-style kernels keep no s^2 attention scores for backward (memory estimate:
    # the 5*a*s/h term of Korthikanti et al. drops out). Added by the plan engineer.
    flash_attention: bool = True
    virtual_stages: int = 1  # model chunks per pipeline stage (schedule "interleaved": >= 2)
    overlap: OverlapSpec = field(default_factory=OverlapSpec)
    fsdp: FSDPSpec = field(default_factory=FSDPSpec)  # ZeRO-3's parameter gathers

    # Number format of the math; picks the device peak (see Precision above).
    precision: Precision = "bf16"
    # Dropout on the attention probabilities and the hidden states (GPT-style training): adds the
    # dropout kernels and their mask traffic to the compute model. Llama-style training has none.
    dropout: bool = False
    # Gradient format of the DP reduce (and of the gradient buffer the backward accumulates
    # into): "auto" follows Megatron-LM (megatron/training/arguments.py: "bfloat16 requires
    # gradient accumulation and all-reduce to be done in fp32"): fp32 for bf16 parameters (bf16
    # and fp8 training), the parameter format otherwise. NeMo's grad_sync_dtype=bf16: "bf16".
    grad_reduce_dtype: GradDtype = "auto"
    # Megatron's gradient_accumulation_fusion (on by default in Megatron-LM and NeMo): the
    # weight-gradient GEMM accumulates into the gradient buffer itself (no separate
    # AccumulateGrad kernel). False: PyTorch's AccumulateGrad add after every wgrad GEMM.
    grad_accumulation_fusion: bool = True

    def __post_init__(self) -> None:
        # Older plans and callers say recompute: true / false; they mean full / none.
        if isinstance(self.recompute, bool):
            object.__setattr__(self, "recompute", "full" if self.recompute else "none")

    @property
    def total_micro_batches(self) -> int:
        return self.global_batch // self.micro_batch

    def grad_reduce_bytes(self, model_dtype_bytes: int) -> int:
        """Bytes per gradient element in the DP reduce and the gradient buffer.

        ``auto``: 4 for bf16 parameters (``precision`` bf16 or fp8) and for fp32/tf32 training,
        the model dtype's bytes for fp16 (Megatron-LM's fp16 path reduces fp16 gradients).
        """
        if self.grad_reduce_dtype != "auto":
            return DTYPE_BYTES[self.grad_reduce_dtype]
        return model_dtype_bytes if self.precision == "fp16" else 4


@dataclass(frozen=True)
class PcieSpec:
    """A server's PCIe tree: GPUs under PCIe switches under one host bridge (root complex).

    Link rates come from the PCIe spec per generation and lane count (``topology/servers.py``).
    """

    gen: int = 4  # PCIe generation of every link in the tree (1..6)
    lanes: int = 16  # lanes of each GPU's link
    gpus_per_switch: int = 2  # consecutive local GPUs per PCIe switch; 0: GPUs on root ports
    uplink_lanes: int = 16  # lanes of each switch's link to the host bridge
    host_bridge_GBps: float | None = None  # peer-to-peer limit through the root complex; None: none
    latency_us: float = 0.105  # per PCIe link (one switch traversal), see topology/servers.py
    # GPU peer-to-peer over PCIe: None: the device type's ``pcie_p2p``; False: the switches and
    # the root complex do not forward GPU to GPU, every GPU transfer goes through host memory
    # (NCCL's SHM transport, and no GPUDirect RDMA to the NICs), see topology/servers.py
    p2p: bool | None = None
    # host DRAM GB/s the host-memory path may use (each byte written once and read once, so
    # the path carries half of it); None: DRAM not a bound (only the PCIe links are)
    host_memory_GBps: float | None = None


@dataclass(frozen=True)
class ServerSpec:
    """How the GPUs of one server are wired to each other and to their NICs (docs/topology.md).

    ``nvlink`` lists ``(a, b, links)`` between local GPU indices: the mesh of ``nvlink_mesh``, or
    the NVLink bridges of a ``pcie`` server. ``nics``: a layout name, or the local NIC index of
    every local GPU.
    """

    fabric: ServerFabric = "nvswitch"
    pcie: PcieSpec | None = None  # None: no PCIe tree (pcie fabric: PcieSpec() defaults)
    nvlink: tuple[tuple[int, int, int], ...] = ()
    nvlink_GBps: float | None = None  # per NVLink (mesh) or per bridge, one direction
    pair_GBps: float | None = None  # nvswitch: one GPU pair's ceiling, one direction
    nics: NicLayout | tuple[int, ...] = "per_gpu"


ProfileRow = tuple[int, int, int, float, float]
"""One measured row of a profile CSV: tp, micro_batch, seq_len, fwd_layer_us, bwd_layer_us."""


@dataclass(frozen=True)
class DeviceType:
    """A GPU model: peaks per precision, memory, links and the compute-model constants.

    ``efficiency`` is the fraction of a precision's peak that the best-shaped large GEMM reaches
    (maximum achievable matmul / spec); smaller or oddly shaped GEMMs reach less, by the tile and
    wave model of :mod:`xsim_adapters.workload.compute.gemm`. A precision peak of 0 means the part
    has no such unit (see docs/compute.md for what a plan asking for it gets).
    """

    name: str
    peak_tflops: float  # dense 16-bit tensor peak, fp32 accumulate (bf16; fp16 on parts without)
    hbm_GB: float
    hbm_GBps: float
    scaleup_GBps: float  # NVLink (or PCIe) bandwidth per GPU, one direction
    nic_gbps: float  # scale-out NIC per GPU
    efficiency: float = 0.7  # best-shape GEMM fraction of peak; median of sourced MAMF ratios
    fp32_tflops: float = 0.0  # dense fp32 (non-tensor) peak; 0: unknown
    tf32_tflops: float = 0.0  # dense tf32 tensor peak; 0: none (tf32 runs at the fp32 rate)
    fp8_tflops: float = 0.0  # dense fp8 tensor peak; 0: none (precision fp8 is an error)
    # dense fp4 tensor peak (Blackwell NVFP4/MXFP4); 0: none. Carried for the record and the
    # reports: no training precision runs fp4 GEMMs (docs/compute.md "Precision").
    fp4_tflops: float = 0.0
    # best-shape fp8 GEMM fraction of fp8_tflops (fp8 MAMF / spec); 0: unmeasured, `efficiency`
    fp8_efficiency: float = 0.0
    bf16: bool = True  # False: no bf16 tensor cores (V100, T4, RTX 20); bf16 runs as fp16
    sm_count: int = 0  # SMs (NVIDIA) or CUs (AMD) a GEMM spreads over; 0: no wave model
    hbm_efficiency: float = 0.8  # achieved fraction of hbm_GBps (median of measured copies)
    # CUDA compute capability x 10 (80 Ampere, 90 Hopper, 100 Blackwell): selects NCCL's
    # per-architecture tuner constants (workload/comm/nccl.py); 0: unknown (Ampere constants).
    compute_capability: int = 0
    # NVLink SHARP (NVLS): the server's NVSwitches (gen3+) reduce and multicast in the switch.
    nvls: bool = False
    # GPU peer-to-peer over PCIe (CUDA P2P, which NCCL's P2P transport needs); False on parts
    # whose driver refuses it (GeForce RTX 40: presets/devices.yaml), so their PCIe servers
    # move GPU-to-GPU data through host memory. A server's ``pcie.p2p`` overrides it.
    pcie_p2p: bool = True
    # SM clocks of the power-capped part (docs/compute.md "Sustained clock"): the clock at which
    # `efficiency` / `fp8_efficiency` were measured (short benchmarks run at the boost clock)
    # and the clock the part holds under back-to-back tensor-core work at its board power cap,
    # as a training step runs. 0 (either): unmeasured, no derating.
    burst_clock_MHz: float = 0.0
    sustained_clock_MHz: float = 0.0
    # Optional measured per-layer times: absolute path of a CSV with columns
    # tp, micro_batch, seq_len, fwd_layer_us, bwd_layer_us (see docs/plan.md).
    profile: str | None = None
    # The profile's rows, parsed and checked once by the plan loader (the generator does no
    # file I/O): (tp, micro_batch, seq_len, fwd_layer_us, bwd_layer_us), in file order.
    profile_rows: tuple[ProfileRow, ...] = ()
    source: str = ""  # where the numbers come from
    # How servers of this type are wired inside (default: an NVSwitch star, one NIC per GPU).
    server: ServerSpec = field(default_factory=ServerSpec)

    @property
    def sustained_tflops(self) -> float:
        """16-bit TFLOP/s the best-shaped GEMM sustains in a training step: ``peak_tflops x
        efficiency x sustained_clock_fraction`` (what layer and batch splits by speed use)."""
        return self.peak_tflops * self.efficiency * self.sustained_clock_fraction

    @property
    def sustained_clock_fraction(self) -> float:
        """Tensor-core rate a training step sustains over the rate of the benchmark behind
        `efficiency`: ``sustained_clock_MHz / burst_clock_MHz`` (1.0 where either is unknown);
        dimensionless, at most 1."""
        if self.burst_clock_MHz > 0 and self.sustained_clock_MHz > 0:
            return min(1.0, self.sustained_clock_MHz / self.burst_clock_MHz)
        return 1.0


@dataclass(frozen=True)
class DeviceGroup:
    """Identical devices on ``nodes`` servers of ``gpus_per_node`` each."""

    name: str
    type: str  # key into Plan.device_types
    nodes: int
    gpus_per_node: int
    nic_gbps: float | None = None  # Gb/s of each NIC of this group (None: the device type's)
    server: ServerSpec | None = None  # this group's server wiring (None: the device type's)
    # GPUs of one NVLink domain (NVL72 / NVL36 racks: several servers, the compute trays, share
    # one NVLink switch fabric); consecutive servers of the group form the domains, the last
    # may hold fewer (a partial rack). 0: one server per domain (docs/topology.md).
    nvlink_domain_gpus: int = 0

    @property
    def num_devices(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def domain_gpus(self) -> int:
        """GPUs of one full NVLink domain of this group (its server's, without racks)."""
        return self.nvlink_domain_gpus or self.gpus_per_node

    @property
    def domain_nodes(self) -> int:
        """Servers (compute trays) of one full NVLink domain of this group."""
        return max(1, self.domain_gpus // self.gpus_per_node)

    @property
    def num_domains(self) -> int:
        """NVLink domains of this group (the last may be partial)."""
        return -(-self.nodes // self.domain_nodes)


@dataclass(frozen=True)
class ScaleOut:
    """The scale-out fabric between servers."""

    topology: ScaleOutTopology = "leaf_spine"
    link_gbps: float = 400.0  # switch-to-switch links
    latency_us: float = 1.0  # per link
    oversubscription: float = 1.0  # leaf downlink capacity / uplink capacity
    rail_optimized: bool = False  # GPU i of every server on leaf (rail) i
    nodes_per_leaf: int = 4  # servers under one leaf (ignored when rail_optimized)
    spines: int = 0  # 0: derived from oversubscription
    fat_tree_k: int = 0  # 3-tier fat tree radix; 0: smallest that fits


@dataclass(frozen=True)
class ScaleUp:
    """The scale-up domain inside a server: an NVSwitch star at each device type's bandwidth."""

    latency_us: float = 0.5
    tp_across_nodes: bool = True  # False: a stage's TP group must stay inside one server


@dataclass(frozen=True)
class ExplicitLink:
    """An extra link between two named topology nodes (parallel links are allowed)."""

    src: str
    dst: str
    gbps: float
    latency_us: float = 1.0


@dataclass(frozen=True)
class LinkEvent:
    """At ``at_us`` set the links between ``src`` and ``dst`` to ``factor`` of nominal (fail: 0).

    ``nic_down`` / ``nic_up`` name global ``rank`` instead (``src``/``dst`` empty): the cable
    of that GPU's NIC to the fabric fails (factor 0) or comes back (factor 1).
    """

    at_us: float
    kind: LinkEventKind
    src: str
    dst: str
    factor: float = 1.0
    rank: int = -1  # nic_down / nic_up only


@dataclass(frozen=True)
class MeasuredSpec:
    """Measured bandwidth and latency between sites (each site: one or more device groups).

    ``gbps[i][j]`` / ``latency_us[i][j]``: from site i to site j (None: no direct path; the
    diagonal is always None: inside a site the scale-out fabric applies).
    """

    sites: tuple[tuple[str, ...], ...]
    gbps: tuple[tuple[float | None, ...], ...]
    latency_us: tuple[tuple[float | None, ...], ...]


@dataclass(frozen=True)
class NetworkSpec:
    scale_out: ScaleOut = field(default_factory=ScaleOut)
    scale_up: ScaleUp = field(default_factory=ScaleUp)
    links: tuple[ExplicitLink, ...] = ()
    events: tuple[LinkEvent, ...] = ()
    measured: MeasuredSpec | None = None
    # What picks a flow's path among equal-cost ones (topology/routing.py, ECMP_MODES): "flow"
    # hashes each flow (op), "connection" each NCCL connection (src, dst, phase, channel).
    ecmp: EcmpMode = "flow"
    # NCCL's network transport between servers: "ib" (IB verbs, RoCE: one queue pair per
    # connection) or "socket" (NCCL's TCP socket transport: each connection stripes a message
    # over socket_nthreads x nsocks_per_thread TCP sockets); see topology/connections.py.
    nccl_net: NcclNet = "ib"
    socket_nthreads: int = 1  # NCCL_SOCKET_NTHREADS (NCCL default 1; AWS ENA: 2)
    nsocks_per_thread: int = 1  # NCCL_NSOCKS_PERTHREAD (NCCL default 1; AWS ENA: 8)
    # Gb/s one transport flow (a TCP socket, or an IB queue pair) may reach between servers,
    # whatever the links allow: a cloud's per-flow limit (e.g. AWS EC2: 5 Gb/s per flow outside
    # a cluster placement group). None: no such limit.
    per_flow_gbps: float | None = None
    # network.transport (plan/transport.py): PFC, ECN and NIC congestion control for the
    # packet backends. None: the section is absent (each backend's transport as before).
    transport: TransportSpec | None = None


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: one TP group over devices [start, stop) of one group, layers [a, b)."""

    group: str
    devices: tuple[int, int]
    tp: int
    layers: tuple[int, int]
    # Expert parallelism: 1 (experts TP-sharded like the dense MLP) or a multiple of tp; ep / tp
    # consecutive replicas' stages form one EP group (see docs/moe.md).
    ep: int = 1
    # Context parallelism: cp consecutive replicas' stages split each sequence (ring attention).
    cp: int = 1
    # Expert tensor parallelism (with ep > 1): each expert's weights split etp ways over
    # consecutive ranks of the TP group (Megatron-Core's expert_tensor_parallel_size).
    etp: int = 1

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]


@dataclass(frozen=True)
class Replica:
    """One data-parallel replica: an ordered pipeline of stages."""

    stages: tuple[Stage, ...]
    micro_batches: int  # resolved: micro-batches this replica runs per iteration
    batch_share: float | None = None  # as written in the plan (None: split by speed)

    @property
    def pp(self) -> int:
        return len(self.stages)


@dataclass(frozen=True)
class CollectiveAlgorithms:
    """The algorithm of each collective kind (``auto``: NCCL's tuner rule, docs/collectives.md)."""

    all_reduce: Algorithm = "auto"
    reduce_scatter: Algorithm = "auto"
    all_gather: Algorithm = "auto"

    def of(self, kind: str) -> str:
        """The algorithm asked for ``kind`` (``auto`` for kinds without a field)."""
        return str(getattr(self, kind, "auto"))


@dataclass(frozen=True)
class CollectivesSpec:
    resharding: Resharding = "lcm"
    # rings per collective (bytes split by each ring's bottleneck bandwidth); 0 is ``auto``:
    # one ring per NIC the members of a server use, as NCCL opens (workload/comm/rings.py)
    channels: int = 0
    granularity: Granularity = "step"
    chunks: int = 4  # pipelined chunks per ring step when granularity == "chunked"
    ring_order: RingOrder = "hetero_aware"
    dp_bucket_layers: int = 1  # DP sync granularity along a segment (layers per bucket)
    nccl_cost: bool = True  # NCCL latency + protocol efficiency as a delay before each ring
    algorithm: CollectiveAlgorithms = field(default_factory=CollectiveAlgorithms)


@dataclass(frozen=True)
class Plan:
    """A validated deployment plan. ``device_types`` holds every type the groups use."""

    name: str
    model: ModelSpec
    training: TrainingSpec
    device_types: dict[str, DeviceType]
    device_groups: tuple[DeviceGroup, ...]
    network: NetworkSpec
    replicas: tuple[Replica, ...]
    collectives: CollectivesSpec = field(default_factory=CollectivesSpec)
    seed: int = 0
    perturb: PerturbSpec = field(default_factory=lambda: _no_perturb())

    def __hash__(self) -> int:  # dict field: hash by identity of the frozen content's repr
        return hash(repr(self))

    @property
    def dp(self) -> int:
        return len(self.replicas)

    def group(self, name: str) -> DeviceGroup:
        for g in self.device_groups:
            if g.name == name:
                return g
        raise KeyError(name)

    def group_rank_offset(self, name: str) -> int:
        """Global rank of device 0 of group ``name``."""
        off = 0
        for g in self.device_groups:
            if g.name == name:
                return off
            off += g.num_devices
        raise KeyError(name)

    @property
    def num_ranks(self) -> int:
        return sum(g.num_devices for g in self.device_groups)

    @property
    def num_nodes(self) -> int:
        return sum(g.nodes for g in self.device_groups)

    def stage_ranks(self, stage: Stage) -> tuple[int, ...]:
        """Global ranks of a stage's TP group, in device order."""
        off = self.group_rank_offset(stage.group)
        return tuple(range(off + stage.devices[0], off + stage.devices[1]))

    def server_spec(self, group: DeviceGroup) -> ServerSpec:
        """The server wiring of ``group``: its own, else its device type's."""
        return group.server if group.server is not None else self.device_types[group.type].server

    def domain_of_node(self) -> list[int]:
        """Global NVLink-domain index of every global server, in server order: groups in plan
        order, each group's consecutive ``domain_nodes`` servers one domain (one per server
        without racks, so then the domain index is the server index)."""
        out: list[int] = []
        base = 0
        for g in self.device_groups:
            out += [base + k // g.domain_nodes for k in range(g.nodes)]
            base += g.num_domains
        return out

    def rank_info(self, rank: int) -> tuple[DeviceGroup, int, int]:
        """(group, device index in group, global server index) of a global rank."""
        off = 0
        node_off = 0
        for g in self.device_groups:
            if rank < off + g.num_devices:
                d = rank - off
                return g, d, node_off + d // g.gpus_per_node
            off += g.num_devices
            node_off += g.nodes
        raise IndexError(f"rank {rank} out of range (plan has {off} ranks)")


def _no_perturb() -> PerturbSpec:
    from .perturb import PerturbSpec  # late import: perturb imports DeviceGroup from here

    return PerturbSpec()
