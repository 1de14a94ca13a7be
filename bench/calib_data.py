"""The timing model's calibration data set: MI355X hardware timings of code objects we can run.

    python -m bench.calib_data          # rebuilds bench/calib_points.json from the corpus

Points (one launch each, with its measured time):
  * aiter's asm MX-FP4 GEMMs: every `cu_num` 256 (gfx950, 256 CUs) row of the corpus's
    `aiter/configs/a4w4_blockscale_tuned_gemm.csv` whose kernel is an f4gemm object of the
    corpus (`us` = aiter's tuner measurement; launched as gemm_a4w4_asm does:
    gfxasm.perf.aiter_f4gemm);
  * aiter's `bf16gemm_bf16_tn_256x256` (the conformance object): the gfx950 rows of
    `aiter/configs/bf16_tuned_gemm.csv` at ROCm/aiter commit BF16_COMMIT (not in the wheel,
    so the numbers are written below, with their source);
  * aiter's FMHA forward (`fwd_hd128_bf16.co`): the five published MI355X points of the
    conformance README (bench.bench_conformance.FMHA_PUBLISHED);
  * aiter's fused-MoE stage-1 asm objects: the rows of `aiter/configs/tuned_fmoe.csv` that
    bench.fmoe_validate can launch as moe_stage1_g1u1 does (`us1`, cold weights; routing
    drawn by gfxasm.perf.aiter_fmoe.routing). They stream the used experts' fp8 weights at
    4.4-6.3 TB/s, faster than the f4gemm rows ever do, so they are the data's evidence on
    the HBM's sustainable rate.

Regimes by M: "M<=64", "64<M<=1024", "M>1024" (FMHA: its own regime "fmha"; fused MoE
"fmoe").
Split (declared, seeded): within each (kernel, regime) stratum the points are shuffled
with random.Random(SEED) and the first floor(n/2) go to "fit", the rest (and every
stratum of one point) are "held" out. So at most half of the points are fitted on, and
every kernel and regime with two points or more is on both sides (FMHA: 2 fit, 3 held).
Fused-MoE rows come in near-twins (Silu and Gelu, with and without topk weights, per-token
and per-tensor scales: one shape, one object family, times within a few percent), so they
are split by shape instead: the shapes are shuffled and taken in that order into "fit"
while their rows stay within half of the rows (a shape that would pass it is held out), so
no held-out row has a twin among the fit rows.
"""
from __future__ import annotations

import csv
import json
import random
from collections import Counter
from pathlib import Path

from bench import fmoe_validate
from bench.fmoe_validate import SHAPE as FMOE_SHAPE

SEED = 13
OUT = Path(__file__).resolve().parent / "calib_points.json"
A4W4_CSV = "aiter/configs/a4w4_blockscale_tuned_gemm.csv"

BF16_SYMBOL = "_ZN5aiter24bf16gemm_bf16_tn_256x256E"
BF16_COMMIT = "e4048607a535ace3a2b51ded31b1c8c2d45c0879"
BF16_SOURCE = f"ROCm/aiter@{BF16_COMMIT[:12]} aiter/configs/bf16_tuned_gemm.csv (gfx950, cu_num 256)"
# (M, N, K, us) of the bf16gemm_bf16_tn_256x256 rows of that file (splitK 1).
BF16_ROWS = [
    (2048, 6144, 2048, 58.7492), (2048, 6144, 3072, 77.3258), (4096, 3072, 6144, 138.0331),
    (4096, 6144, 2048, 109.5022), (4096, 6144, 3072, 147.9731), (8192, 3072, 6144, 262.1828),
    (8192, 6144, 2048, 184.6449), (8192, 6144, 3072, 245.0526), (16384, 3072, 6144, 448.6444),
    (16384, 6144, 2048, 341.6912), (16384, 6144, 3072, 467.8675),
]


def regime(M: int) -> str:
    return "M<=64" if M <= 64 else "64<M<=1024" if M <= 1024 else "M>1024"


def f4gemm_points() -> list[dict]:
    from gfxasm import corpus
    from gfxasm.perf import aiter_f4gemm
    cfgs = aiter_f4gemm.configs()
    pts = []
    with open(corpus.path(A4W4_CSV), newline="") as f:
        for row in csv.DictReader(f):
            cfg = cfgs.get(row["kernelName"])
            if row["cu_num"] != "256" or cfg is None:
                continue
            M, N, K = int(row["M"]), int(row["N"]), int(row["K"])
            pts.append({"family": "f4gemm", "kernel": f"f4gemm_{cfg.tile_m}x{cfg.tile_n}",
                        "symbol": cfg.symbol, "M": M, "N": N, "K": K, "log2_k_split": int(row["splitK"]),
                        "measured_us": float(row["us"]), "regime": regime(M), "source": "a4w4"})
    return pts


def bf16gemm_points() -> list[dict]:
    return [{"family": "bf16gemm", "kernel": "bf16gemm_256x256", "symbol": BF16_SYMBOL, "M": M, "N": N,
             "K": K, "measured_us": us, "regime": regime(M), "source": "bf16"}
            for M, N, K, us in BF16_ROWS]


def fmha_points() -> list[dict]:
    from bench.bench_conformance import FMHA_PUBLISHED
    out = []
    for B, Hq, Hk, S, tflops, source in FMHA_PUBLISHED:
        flops = 4.0 * B * Hq * S * S * 128
        out.append({"family": "fmha", "kernel": "fmha_fwd_hd128_bf16", "B": B, "Hq": Hq, "Hk": Hk, "S": S,
                    "measured_us": flops / (tflops * 1e12) * 1e6, "regime": "fmha",
                    "source": f"conformance README: {source} ({tflops} TFLOP/s)"})
    return out


def fmoe_points() -> list[dict]:
    rows, _ = fmoe_validate.rows()
    keep = ("line", "symbol", "activation", "q_type", "measured_us") + FMOE_SHAPE
    return [{"family": "fmoe", "kernel": r["kernel"], **{k: r[k] for k in keep}, "regime": "fmoe",
             "source": "fmoe"} for r in rows]


def split(points: list[dict], seed: int = SEED) -> None:
    """Mark each point 'fit' or 'held' in place (see the module docstring)."""
    strata: dict[tuple, list[dict]] = {}
    for p in points:
        key = ("fmoe",) if p["family"] == "fmoe" else (p["kernel"], p["regime"])
        strata.setdefault(key, []).append(p)
    rng = random.Random(seed)
    for key in sorted(strata):
        if key == ("fmoe",):
            _split_by_shape(strata[key], rng)
            continue
        group = sorted(strata[key], key=lambda p: (p.get("M", 0), p.get("N", 0), p.get("K", 0), p.get("S", 0)))
        rng.shuffle(group)
        nfit = len(group) // 2
        for n, p in enumerate(group):
            p["split"] = "fit" if n < nfit else "held"


def _split_by_shape(points: list[dict], rng: random.Random) -> None:
    rows = Counter(tuple(p[k] for k in FMOE_SHAPE) for p in points)
    shapes = sorted(rows)
    rng.shuffle(shapes)
    fit, taken = set(), 0
    for shape in shapes:
        if taken + rows[shape] <= len(points) // 2:
            fit.add(shape)
            taken += rows[shape]
    for p in points:
        p["split"] = "fit" if tuple(p[k] for k in FMOE_SHAPE) in fit else "held"


SHAPE_KEY = ("kernel", "N", "K")


def shape_split(points: list[dict], seed: int = SEED) -> None:
    """Re-mark the GEMM points 'fit' or 'held' by shape (issue 25, item 3): every
    (kernel, N, K) is on one side only, so no held-out point shares its kernel and weight
    shape with a fitted one. Per kernel, its shapes are shuffled (random.Random(seed)) and
    taken into "fit" while their rows stay within half of the kernel's rows; a kernel with
    one shape is held out. FMHA and fused-MoE points keep split()'s marks (FMHA: one
    object, five shapes, already disjoint; fused MoE: already split by shape)."""
    rng = random.Random(seed)
    by_kernel: dict[str, list[dict]] = {}
    for p in points:
        if p["family"] in ("f4gemm", "bf16gemm"):
            by_kernel.setdefault(p["kernel"], []).append(p)
    for kernel in sorted(by_kernel):
        rows = Counter(tuple(p[k] for k in SHAPE_KEY) for p in by_kernel[kernel])
        shapes = sorted(rows)
        rng.shuffle(shapes)
        fit, taken = set(), 0
        for shape in shapes[:-1]:               # the last shape is always held out
            if taken + rows[shape] <= len(by_kernel[kernel]) // 2:
                fit.add(shape)
                taken += rows[shape]
        for p in by_kernel[kernel]:
            p["split"] = "fit" if tuple(p[k] for k in SHAPE_KEY) in fit else "held"


def build() -> list[dict]:
    points = f4gemm_points() + bf16gemm_points() + fmha_points() + fmoe_points()
    split(points)
    for n, p in enumerate(points):
        p["id"] = n
    return points


SOURCES = {"a4w4": f"amd-aiter==0.1.7.post2.dev18 {A4W4_CSV} (column us)", "bf16": BF16_SOURCE,
           "fmoe": "amd-aiter==0.1.7.post2.dev18 aiter/configs/tuned_fmoe.csv (column us1; bench.fmoe_validate)"}


def load() -> list[dict]:
    """The committed data set (bench/calib_points.json)."""
    return json.loads(OUT.read_text())["points"]


def main():
    points = build()
    body = ",\n".join(json.dumps(p, separators=(",", ":")) for p in points)
    OUT.write_text(f'{{"seed": {SEED}, "sources": {json.dumps(SOURCES)},\n"points": [\n{body}\n]}}\n')
    fit = sum(p["split"] == "fit" for p in points)
    print(f"wrote {OUT}: {len(points)} points, {fit} fit / {len(points) - fit} held out (seed {SEED})")


if __name__ == "__main__":
    main()
