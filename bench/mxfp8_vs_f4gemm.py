"""Our MX-FP8 GEMV/GEMM against aiter's asm MX-FP4 GEMMs (f4gemm) at equal weight bytes, modelled.

    python3 -m bench.mxfp8_vs_f4gemm [--ms 1,16,64] [--tps 1,8] [--only TEXT] [--all-tiles]
                                     [--jobs N] [--no-build] [--out bench/out/mxfp8_vs_f4gemm.json]
    python3 -m bench.mxfp8_vs_f4gemm --table bench/out/mxfp8_vs_f4gemm.json   # re-print a table

Shapes: bench/mxfp8_gemm.py's decode layers (qkv, gate_up, o_proj, down of its ASSUMED MODEL);
by default M in {1, 16, 64} at TP1 and TP8 (24 rows; the full grid is --ms 1,2,4,8,16,32,64
--tps 1,2,4,8).

Equal weight bytes: our layer (N, K) in MX-FP8 is set against aiter's MX-FP4 GEMM with the same
N and K' = 2K. Both read N*K weight bytes and write the same M x N output, so at decode, where
both stream their weights once, the ratio compares how well each kernel streams the same bytes
(the same (N, K) in FP4 would only show the format halving the bytes). Scale bytes differ: one
e8m0 per 32 elements is N*K/32 bytes for us and N*K'/32 = N*K/16 for FP4 (3% more bytes).

aiter's time is the best the model finds among the launches aiter's tuner would try
(gemm_a4w4_blockscale_tune.py: every BpreShuffle object at log2_k_split 0, the split-K objects
at 1..3, compute_gemm_SplitK returning 3 in this wheel): by default only the objects that
tuner chose for some M <= 64 row of the corpus's a4w4 table (it tried them all there) plus
the split-K launches; --all-tiles tries every object. Chosen per bracket (a tuner runs on the
real chip, i.e. on one bracket). aiter's split-K launches also need `out.zero_()` (a further
launch, asm_gemm_a4w4.cu) that is not modelled: aiter's time is then a lower bound.

Every ratio ours / aiter is a range over gfxasm.perf.params.BRACKETS (transcendental rate, LDS phases,
VALU contention under MFMA), never one number; times are given for every bracket. Bytes:
the model's DRAM bytes (distinct bytes touched) over the minimum (weights + scales +
activations + scales once, bf16 output); %HBM = minimum bytes / time / 8 TB/s. Measured:
aiter's MI355X time for the same (M, N, K') from the corpus table where one exists (with
the tuned object's modelled time beside it), else the nearest measured shape at the same M
(closest weight bytes) with its measured and calibrated modelled time (bench/calibration.json),
to show the model's error near the row.

Every time here is modelled (gfxasm.perf, MI355X; no gfx950 here), not measured.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing as mp
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import calib_data                                   # noqa: E402
from bench import mxfp8_gemm as ours                           # noqa: E402
from gfxasm.perf import params as P                            # noqa: E402

HBM = 8.0e12
MS = (1, 16, 64)
TPS = (1, 8)
SPLIT_K_LOG2 = (1, 2, 3)          # compute_gemm_SplitK returns 3 in amd-aiter 0.1.7.post2.dev18
OUT = REPO / "bench" / "out" / "mxfp8_vs_f4gemm.json"


# ------------------------------------------------------------------ bytes

def f4_minimum_bytes(M: int, N: int, Kp: int) -> float:
    """MX-FP4: two values per byte, one e8m0 scale per 32 values; bf16 output."""
    return (N + M) * Kp * (1 / 2 + 1 / 32) + 2 * M * N


# ------------------------------------------------------------------ aiter's launches

def f4_candidates(all_tiles: bool = False) -> list[tuple[str, int]]:
    """(symbol, log2_k_split) launches aiter's tuner would try (see the module docstring)."""
    from gfxasm.perf import aiter_f4gemm
    cfgs = aiter_f4gemm.configs()
    if all_tiles:
        plain = sorted(s for s, c in cfgs.items() if not c.split_k and "_BpreShuffle_" in s)
    else:
        plain = sorted({p["symbol"] for p in calib_data.load()
                        if p["family"] == "f4gemm" and p["regime"] == "M<=64" and not cfgs[p["symbol"]].split_k})
    split = sorted(s for s, c in cfgs.items() if c.split_k)
    return [(s, 0) for s in plain] + [(s, k) for s in split for k in SPLIT_K_LOG2]


def _tile(symbol: str) -> str:
    return symbol.rsplit("_", 1)[-1].rstrip("E")


def _brackets() -> dict:
    return {name: dataclasses.replace(P.DEFAULT, **changes) for name, changes in P.BRACKETS.items()}


def model_f4(M: int, N: int, Kp: int, candidates) -> tuple[dict, list]:
    """Every candidate launch under every bracket: ({bracket: [{symbol, log2, us, dram}]}, the
    launches the emulator refused). A launch whose workgroups read outside the buffers its
    host code gives it (the emulator's MemoryFault: inside the kernel's buffer range, outside
    the tensors) cannot be modelled faithfully and is left out, named, never guessed."""
    from gfxasm.emu.errors import MemoryFault
    from gfxasm.perf import aiter_f4gemm, estimate
    cfgs = aiter_f4gemm.configs()
    out = {name: [] for name in P.BRACKETS}
    refused = []
    for symbol, log2 in candidates:
        if Kp % (1 << log2):
            continue
        kw = aiter_f4gemm.launch(cfgs[symbol], M, N, Kp, log2)
        try:
            runs = {name: estimate(**kw, params=prm) for name, prm in _brackets().items()}
        except MemoryFault as fault:
            refused.append(dict(symbol=symbol, tile=_tile(symbol), log2_k_split=log2, grid=list(kw["grid"]),
                                fault=str(fault).split(" (kernel ")[0]))
            continue
        for name, e in runs.items():
            out[name].append(dict(symbol=symbol, tile=_tile(symbol), log2_k_split=log2, us=e.seconds * 1e6,
                                  dram_bytes=e.dram_bytes, requested_bytes=e.requested_global_bytes,
                                  grid=list(kw["grid"])))
    return out, refused


def model_ours(M: int, N: int, K: int) -> tuple[object, dict]:
    """Our plan for (M, N, K) and its modelled launches under every bracket."""
    plan = ours.mx.plan(M, N, K)
    cases = ours.plan_cases(plan, M, N, K)
    res = {}
    for name, prm in _brackets().items():
        seconds, parts = ours.modelled_seconds(plan, M, N, K, params=prm, cases=cases)
        res[name] = dict(us=seconds * 1e6, dram_bytes=sum(p["dram_bytes"] for p in parts),
                         requested_bytes=sum(p["requested_bytes"] for p in parts), launches=parts)
    return plan, res


# ------------------------------------------------------------------ measured neighbours

def _calibrated() -> dict[int, dict]:
    path = REPO / "bench" / "calibration.json"
    return {p["id"]: p for p in json.loads(path.read_text())["points"]} if path.exists() else {}


def measured_f4(M: int, N: int, Kp: int, points=None, calibrated=None) -> dict | None:
    """aiter's measured point for (M, N, K') if the corpus table has it, else the nearest one at
    the same M (closest N*K', then closest N), with the calibrated model's time for it."""
    pts = [p for p in (points or calib_data.load()) if p["family"] == "f4gemm" and p["M"] == M]
    if not pts:
        return None
    best = min(pts, key=lambda p: (abs(math.log(p["N"] * p["K"] / (N * Kp))), abs(math.log(p["N"] / N))))
    cal = (calibrated if calibrated is not None else _calibrated()).get(best["id"], {})
    return dict(exact=(best["N"], best["K"]) == (N, Kp), M=M, N=best["N"], K=best["K"], tile=_tile(best["symbol"]),
                log2_k_split=best["log2_k_split"], measured_us=best["measured_us"],
                modelled_us=cal.get("modelled_us"), split=best["split"])


# ------------------------------------------------------------------ one row

def compare(layer: str, tp: int, M: int, N: int, K: int, candidates, points=None, calibrated=None) -> dict:
    """One row: our MX-FP8 (M, N, K) against aiter's MX-FP4 (M, N, 2K), per bracket."""
    t0 = time.time()
    Kp = 2 * K
    plan, mine = model_ours(M, N, K)
    theirs, refused = model_f4(M, N, Kp, candidates)
    least, least_f4 = ours.minimum_bytes(M, N, K), f4_minimum_bytes(M, N, Kp)
    per = {}
    for name in P.BRACKETS:
        a = min(theirs[name], key=lambda c: c["us"])
        o = mine[name]
        per[name] = dict(ours_us=o["us"], ours_dram_bytes=o["dram_bytes"], ours_requested_bytes=o["requested_bytes"],
                         aiter_us=a["us"], aiter_dram_bytes=a["dram_bytes"],
                         aiter_requested_bytes=a["requested_bytes"],
                         aiter_tile=a["tile"], aiter_log2_k_split=a["log2_k_split"], aiter_grid=a["grid"],
                         ratio=o["us"] / a["us"])
    ratios = [v["ratio"] for v in per.values()]
    return dict(layer=layer, tp=tp, M=M, N=N, K=K, K_f4=Kp, ours_kernel=plan.kernel, ours_splits=plan.splits,
                min_bytes=least, f4_min_bytes=least_f4, weight_bytes=N * K, brackets=per,
                ratio_lo=min(ratios), ratio_hi=max(ratios),
                ours_launches={k: v["launches"] for k, v in mine.items()},
                aiter_candidates=theirs, aiter_refused=refused, measured=measured_f4(M, N, Kp, points, calibrated),
                wall_s=round(time.time() - t0, 2))


# ------------------------------------------------------------------ tables

def _span(values, fmt="{:.1f}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}–{fmt.format(hi)}"


def _aiter_launch(row) -> str:
    picks = sorted({(v["aiter_tile"], v["aiter_log2_k_split"], math.prod(v["aiter_grid"]))
                    for v in row["brackets"].values()})
    return " / ".join(t + (f" sk{2 ** k}" if k else "") + f", {wg} WG" for t, k, wg in picks)


def _our_launch(row) -> str:
    main = next(iter(row["ours_launches"].values()))[0]
    split = f" sk{row['ours_splits']}" if row["ours_splits"] > 1 else ""
    return f"{row['ours_kernel'].replace('mxfp8_', '')}{split}, {math.prod(main['grid'])} WG"


def _measured(row) -> str:
    m = row["measured"]
    if not m:
        return "–"
    mod = f"{m['modelled_us']:.1f}" if m["modelled_us"] is not None else "?"
    where = "" if m["exact"] else f"N{m['N']} K{m['K']}: "
    return f"{where}{m['measured_us']:.1f} (model {mod})"


def _bytes(row, side: str, least: float) -> str:
    """DRAM bytes / minimum, and (where recorded) bytes the loads and stores request / minimum."""
    b = row["brackets"].values()
    dram = _span([v[f"{side}_dram_bytes"] / least for v in b], "{:.2f}")
    if not all(f"{side}_requested_bytes" in v for v in b):
        return dram
    return f"{dram} ({_span([v[f'{side}_requested_bytes'] / least for v in b], '{:.2f}')})"


def markdown(rows: list[dict]) -> str:
    """The README table: times in us, ranges over params.BRACKETS."""
    head = ("| layer | TP | M | N | K (ours) / K' (FP4) | ours: kernel, workgroups | ours µs "
            "| ours DRAM (requested) / min | ours %HBM | aiter f4gemm (model's best) | aiter µs "
            "| aiter DRAM (requested) / min | aiter %HBM | aiter measured µs (nearest) | ours / aiter |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        b = r["brackets"].values()
        o_us, a_us = [v["ours_us"] for v in b], [v["aiter_us"] for v in b]
        o_bytes = _bytes(r, "ours", r["min_bytes"])
        a_bytes = _bytes(r, "aiter", r["f4_min_bytes"])
        o_pct = [100 * r["min_bytes"] / (t * 1e-6) / HBM for t in o_us]
        a_pct = [100 * r["f4_min_bytes"] / (t * 1e-6) / HBM for t in a_us]
        lines.append(f"| {r['layer']} | {r['tp']} | {r['M']} | {r['N']} | {r['K']} / {r['K_f4']} | {_our_launch(r)} "
                     f"| {_span(o_us)} | {o_bytes} | {_span(o_pct, '{:.0f}')} "
                     f"| {_aiter_launch(r)} | {_span(a_us)} | {a_bytes} | {_span(a_pct, '{:.0f}')} "
                     f"| {_measured(r)} | {r['ratio_lo']:.2f}–{r['ratio_hi']:.2f} |")
    return "\n".join(lines)


# ------------------------------------------------------------------ driver

def shapes(ms=MS, tps=TPS, only: str | None = None) -> list[tuple]:
    out = []
    for tp in tps:
        for layer, (N, K) in ours.layers(tp).items():
            for M in ms:
                if not only or only in f"{layer} TP{tp} M{M}":
                    out.append((layer, tp, M, N, K))
    return out


def _work(job):
    shape, candidates, points, calibrated = job
    return compare(*shape, candidates, points, calibrated)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ms", default=",".join(map(str, MS)), help="comma-separated M values")
    ap.add_argument("--tps", default=",".join(map(str, TPS)), help="comma-separated TP degrees")
    ap.add_argument("--only", help="only rows whose 'layer TP M' label contains this, e.g. 'qkv TP8'")
    ap.add_argument("--all-tiles", action="store_true",
                    help="try every f4gemm object, not only the tuner's M<=64 picks")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (rows in parallel)")
    ap.add_argument("--no-build", action="store_true",
                    help="use build/'s code objects as they are (a machine without the assembler)")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--table", metavar="JSON", help="only print the table of a JSON this script wrote")
    args = ap.parse_args(argv)
    if args.table:
        print(markdown(json.loads(Path(args.table).read_text())["rows"]))
        return 0

    def ints(text, name):
        try:
            return tuple(int(x) for x in text.split(",") if x)
        except ValueError:
            raise SystemExit(f"--{name} must be comma-separated integers, got {text!r}")

    if not args.no_build:
        ours.mx.build_kernels()
    todo = shapes(ints(args.ms, "ms"), ints(args.tps, "tps"), args.only)
    if not todo:
        raise SystemExit("no rows: check --ms, --tps and --only")
    cands = f4_candidates(args.all_tiles)
    points, calibrated = calib_data.load(), _calibrated()
    print(f"{len(todo)} rows x {len(cands)} aiter launches x {len(P.BRACKETS)} brackets", flush=True)
    t0 = time.time()
    jobs = [(s, cands, points, calibrated) for s in todo]
    if args.jobs > 1:
        with mp.get_context("fork").Pool(args.jobs) as pool:
            rows = pool.map(_work, jobs, chunksize=1)
    else:
        rows = []
        for job in jobs:
            rows.append(_work(job))
            r = rows[-1]
            print(f"{r['layer']} TP{r['tp']} M{r['M']}: ours/aiter {r['ratio_lo']:.2f}-{r['ratio_hi']:.2f} "
                  f"({r['wall_s']} s)", flush=True)
    for r in rows:
        for f in r["aiter_refused"]:
            print(f"{r['layer']} TP{r['tp']} M{r['M']}: aiter {f['tile']} sk{2 ** f['log2_k_split']} left out: "
                  f"{f['fault']}")
    print()
    print(markdown(rows))
    print(f"\nmodelled (gfxasm.perf MI355X timing model, params.DEFAULT and params.BRACKETS), not measured; "
          f"{time.time() - t0:.0f} s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(model=ours.MODEL, brackets=P.BRACKETS, candidates=cands, rows=rows), indent=1,
                              default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
