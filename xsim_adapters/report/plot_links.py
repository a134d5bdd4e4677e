"""Picture of the hottest links: utilisation over the iteration, one bar per directed link."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .._atomic import write_atomic

#: Bars drawn (the links with the highest ``mean_util``).
HOTTEST_LINKS = 20
TIER_COLORS = {"scale_up": "#55A868", "nic": "#4C72B0", "fabric": "#C44E52",
               "explicit": "#8172B3"}


def plot_links(path: str | Path, links: pd.DataFrame, title: str = "") -> Path:
    """Bars of the ``HOTTEST_LINKS`` links by ``mean_util`` (:func:`~xsim_adapters.metrics.
    links.link_metrics`), coloured by tier, with ``busy_util`` marked; returns ``path``."""
    top = links[links["bytes"] > 0].sort_values(
        ["mean_util", "link_id"], ascending=[False, True], kind="stable").head(HOTTEST_LINKS)
    fig = Figure(figsize=(9, 1.2 + 0.3 * max(len(top), 1)))
    ax = fig.add_subplot()
    y = np.arange(len(top))
    colors = [TIER_COLORS.get(t, "#8C8C8C") for t in top["tier"]]
    ax.barh(y, top["mean_util"], color=colors)
    ax.scatter(top["busy_util"], y, marker="|", color="black", s=80, zorder=3)
    ax.set_yticks(y)
    peak = top["queue_peak_bytes"] if "queue_peak_bytes" in top else [float("nan")] * len(top)
    ax.set_yticklabels([f"{s}->{d} ({p} peak flows{_queue_label(q)})" for s, d, p, q in
                        zip(top["src"], top["dst"], top["peak_flows"], peak, strict=True)],
                       fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.05)
    ax.set_xlabel("utilisation: bar = over the iteration, | = while busy")
    ax.set_title(title or "hottest links", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    tiers = [t for t in TIER_COLORS if t in set(top["tier"])]
    if tiers:
        ax.legend(handles=[Patch(color=TIER_COLORS[t], label=t) for t in tiers],
                  loc="lower right", fontsize=8)
    fig.tight_layout()
    return write_atomic(path, lambda tmp: fig.savefig(tmp, format="png"))


def _queue_label(peak_bytes: float) -> str:
    """``, queue 770 kB`` for a packet backend's peak queue at the link, else nothing."""
    if not peak_bytes or peak_bytes != peak_bytes:  # 0 or NaN (no queue: the flow backend)
        return ""
    for unit, scale in (("MB", 1e6), ("kB", 1e3)):
        if peak_bytes >= scale:
            return f", queue {peak_bytes / scale:.3g} {unit}"
    return f", queue {peak_bytes:.0f} B"
