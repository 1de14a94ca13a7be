"""Roofline PNG of benchmark rows (bench.common JSON rows) against the MI355X peaks.

matplotlib is optional: `plot` returns False when it is not installed.
"""
from __future__ import annotations

from . import params as P


def plot(rows: list[dict], path, title: str = "MI355X roofline") -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(9, 6))
    bw = P.HBM_BYTES_PER_S
    xs = [2 ** (i / 4) for i in range(-8, 60)]
    for dtype, peak, style in (("bf16", P.PEAK_FLOPS["bf16"], "-"), ("fp8", P.PEAK_FLOPS["fp8"], "--")):
        ax.plot(xs, [min(peak, bw * x) / 1e12 for x in xs], style, color="gray",
                label=f"{dtype} {peak / 1e15:.1f} PFLOP/s, HBM {bw / 1e12:.0f} TB/s")
    markers = {"measured": "o", "modelled": "s"}
    groups = sorted({r.get("group", "") for r in rows})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for r in rows:
        if not r.get("bytes") or not r.get("flops"):
            continue
        c = colors[groups.index(r.get("group", "")) % len(colors)]
        ax.scatter(r["flops"] / r["bytes"], r["tflops"], marker=markers.get(r["source"], "x"), color=c,
                   edgecolor="black", zorder=3)
        ax.annotate(r["label"].split(" (")[0] + " " + r["label"].split(") ")[-1], (r["flops"] / r["bytes"],
                    r["tflops"]), fontsize=6, xytext=(4, -8), textcoords="offset points")
        if r.get("published_tflops"):
            ax.scatter(r["flops"] / r["bytes"], r["published_tflops"], marker="*", color=c, zorder=3)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=10)
    ax.set_xlabel("arithmetic intensity (FLOP per minimum HBM byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"{title}  (squares: modelled, circles: measured, stars: published)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
