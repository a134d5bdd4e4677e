"""A shipped plan keeps its digest when keys are added to the plan format at their defaults.

The digests below were computed by the code of 077a859 (before ``nvlink_domain_gpus``,
``fp4_tflops``, ``pcie_p2p``, ``network.nccl_net`` and the socket keys existed), not by the code
under test, so a new field that leaks into the digest at its default fails here. Left out on
purpose: ``pcie-rtx4090`` (its RTX-4090 preset now has no GPU peer-to-peer, so the plan means
another cluster and its digest moves) and plans added after that commit.
"""

from __future__ import annotations

import pytest
from helpers import WORKLOADS

import xsim_adapters as xs
from xsim_adapters.workload.manifest import plan_digest

DIGESTS_077A859 = {
    "congested-ecmp-oversubscribed.yaml": "964ac43bf373a4f83a3ae0b66b3fdfda8a0bcaec53aa8455b59bf0636eb7b0b1",  # noqa: E501
    "congested-incast-slow-nic.yaml": "408fe6cdfee41f790bfbf15b10d0a29bc4b1ba3ce136b16ba72a149c14919a70",  # noqa: E501
    "congested-mixed-nic-leaf.yaml": "d214c50360c6671a0ce1def5a3b986e07ab53a704c0e3726dfa16f7087171d1e",  # noqa: E501
    "dgx1-v100-cube-mesh.yaml": "f6c5075c299aecfbc96816f9ec267a5c9bb9ddf6151739dfa5e3ac4019eb7e82",
    "hetero-dp-h100-a100.yaml": "95065548906c344edea8181140c2eb5e27853779f101444c98b698d5e5d01455",
    "hetero-pipeline-reshard.yaml": "3e349eaf61dc96e0c757a33701252911d066b2d00c2640b8b291cd004afc4b59",  # noqa: E501
    "homogeneous-h100.yaml": "5d6bf42f278cf3489138f65d5c6d3ec55289e2e2229c52c092018ad1e86a2b66",
    "llama2-70b-1024gpu.yaml": "5797e714849293b41f06783b5b3835ea41b3635a025d002da9f8cc4d6dd9f42a",
    "long-context-128k-cp4.yaml": "cef0b3cb5aff5ea3322fc94426d7a93578f7eae174ff731a96fc48ff94a1f128",  # noqa: E501
    "moe-hetero-h100-a100-by-speed.yaml": "0132c043977b8d7d2710fc3966fcb084083d1c00ebb95c19bf2c9d465ca5ba7a",  # noqa: E501
    "moe-mixtral-8x7b-64xh100-ep8.yaml": "a90dd7e465ecb191bab0d8529700774b2b6c1b4cf7c652f882d9ef925081a4e7",  # noqa: E501
    "two-site-measured.yaml": "27bce4f16b9abcda69b384458bf3d725ca846e09d29fad332560f46768f7c453",
    "uneven-layers.yaml": "5477f14e7758150734044c8988cde8a3cfe3bcdb6a0bcbdf5cbb6c31a274fe09",
    "whatif-slow-gpu.yaml": "bc90f74dc0798d82418ec0ea70713258d977198cd6216347fae10b4c90788fff",
}


@pytest.mark.parametrize("name", sorted(DIGESTS_077A859))
def test_shipped_plan_keeps_its_digest(name: str) -> None:
    assert plan_digest(xs.load_plan(WORKLOADS / name)) == DIGESTS_077A859[name]


def test_a_new_key_away_from_its_default_moves_the_digest() -> None:
    """The check above can fail: the same plan with one new key set is another digest."""
    import yaml

    d = yaml.safe_load((WORKLOADS / "homogeneous-h100.yaml").read_text())
    d.setdefault("network", {})["nccl_net"] = "socket"
    assert plan_digest(xs.load_plan(yaml.safe_dump(d))) != DIGESTS_077A859["homogeneous-h100.yaml"]
