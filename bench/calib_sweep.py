"""Candidate mechanisms against the calibration data on both splits, from one recording.

    python -m bench.calib_sweep PLAN.json [--jobs N] [--out F] [--disasm-cache F] [--limit N]

PLAN.json: {"steps": [STEP, ...]}, each STEP {"tag": name, "set": {field: value}, "from": tag,
"fit": "row"|"shape", "names": [...], "maxfev": n, "every": n, "families": [...]}: the step's
parameters are params.DEFAULT with "set" (on top of an earlier step's parameters with "from");
with "fit" it first re-fits "names" (bench.calibrate.fit) on that split's fit half (GEMM and
FMHA, and the fused-MoE fit rows; "every": every n-th f4gemm fit point only; "families": only
the fit points of these families, e.g. without "fmoe"). Each step is then
modelled on every point and reported on the held-out half of both splits: the row split
(calib_points.json's marks) and the shape split (calib_data.shape_split: no kernel x N x K
on both sides), overall and by group (regime, launches under 8 us, over 128 us, the 32x128
tile, wide tiles), as median |modelled/measured - 1|, its 90th percentile and the median
signed error. The emulator runs each point once (bench.calibrate.Pool keeps the traces);
a step replays them. --out: every step's parameters and modelled times (JSON).
--disasm-cache: bench/ruler.py's disassembly file, on a machine without LLVM.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import calib_data, calibrate                      # noqa: E402
from gfxasm.perf import params as P                           # noqa: E402

GEMM = ("f4gemm", "bf16gemm")


def _tile(kernel: str) -> tuple[int, int]:
    m, n = kernel.rsplit("_", 1)[1].split("x")
    return int(m), int(n)


GROUPS = {
    "GEMM": lambda p: p["family"] in GEMM,
    "GEMM M<=64": lambda p: p["family"] in GEMM and p["regime"] == "M<=64",
    "GEMM 64<M<=1024": lambda p: p["family"] in GEMM and p["regime"] == "64<M<=1024",
    "GEMM M>1024": lambda p: p["family"] in GEMM and p["regime"] == "M>1024",
    "GEMM under 8 us": lambda p: p["family"] in GEMM and p["measured_us"] < 8,
    "GEMM over 128 us": lambda p: p["family"] in GEMM and p["measured_us"] >= 128,
    "f4gemm 32x128": lambda p: p["kernel"] == "f4gemm_32x128",
    "f4gemm wide (N tile >= 2 M tile, >= 384)": lambda p: p["family"] == "f4gemm" and
    _tile(p["kernel"])[1] >= max(384, 2 * _tile(p["kernel"])[0]),
    "fmha": lambda p: p["family"] == "fmha",
    "fmoe": lambda p: p["family"] == "fmoe",
}


def mark_splits(points: list[dict]) -> None:
    """split_row: the data set's marks; split_shape: calib_data.shape_split's."""
    shape = [dict(p) for p in points]
    calib_data.shape_split(shape)
    for p, q in zip(points, shape):
        p["split_row"], p["split_shape"] = p["split"], q["split"]


def held_out(points: list[dict], modelled: dict, split: str) -> dict:
    """Per group: n, median |error|, its 90th percentile, median signed error (held-out half of `split`)."""
    rows = {}
    for name, member in GROUPS.items():
        errs = [modelled[p["id"]] / p["measured_us"] - 1 for p in points
                if p["id"] in modelled and p[f"split_{split}"] == "held" and member(p)]
        if errs:
            mags = sorted(abs(e) for e in errs)
            rows[name] = {"n": len(errs), "median": statistics.median(mags),
                          "p90": mags[min(len(mags) - 1, math.ceil(0.9 * len(mags)) - 1)],
                          "signed_median": statistics.median(errs)}
    return rows


def run(plan: dict, points: list[dict], jobs: int) -> dict:
    pool = calibrate.Pool(points, jobs)
    done = {}
    try:
        for step in plan["steps"]:
            changes = {**(done[step["from"]]["params"] if step.get("from") else {}), **step.get("set", {})}
            if "fit" in step:
                families = step.get("families")
                side = [p for p in points if p[f"split_{step['fit']}"] == "fit" and
                        (families is None or p["family"] in families)]
                every = step.get("every", 1)
                side = [p for n, p in enumerate(side) if p["family"] != "f4gemm" or n % every == 0]
                start = dataclasses.replace(P.DEFAULT, **changes)
                changes.update(calibrate.fit(pool, side, start, step.get("maxfev", 30), tuple(step["names"])))
            modelled = {i: r["modelled_us"] for i, r in pool.run(changes).items()}
            done[step["tag"]] = {"params": changes, "modelled_us": modelled,
                                 "held_out": {s: held_out(points, modelled, s) for s in ("row", "shape")}}
            print(format_step(step["tag"], done[step["tag"]]), flush=True)
    finally:
        pool.close()
    return done


def format_step(tag: str, step: dict) -> str:
    lines = [f"**{tag}** {json.dumps(step['params'])}", "",
             "| group | row split: n, median, p90, signed | shape split: n, median, p90, signed |", "|---|---|---|"]
    row, shape = step["held_out"]["row"], step["held_out"]["shape"]
    cell = lambda r: f"{r['n']}: {100 * r['median']:.1f}% / {100 * r['p90']:.1f}% / {100 * r['signed_median']:+.1f}%"  # noqa: E731
    for name in GROUPS:
        if name in row or name in shape:
            lines.append(f"| {name} | {cell(row[name]) if name in row else '-'} | "
                         f"{cell(shape[name]) if name in shape else '-'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan")
    ap.add_argument("--jobs", type=int, default=max(1, min(16, mp.cpu_count())))
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "calib_sweep.json"))
    ap.add_argument("--disasm-cache", help="bench/ruler.py --make-disasm-cache's file (no LLVM here)")
    ap.add_argument("--limit", type=int, default=0, help="every n-th point only (a quick look)")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    if args.disasm_cache:
        from bench import ruler
        ruler.use_disasm_cache(args.disasm_cache)
    plan = json.loads(Path(args.plan).read_text())
    points = calib_data.load()
    mark_splits(points)
    points = calibrate.runnable(points, args.limit)
    t0 = time.time()
    done = run(plan, points, args.jobs)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(done))
    print(f"{len(points)} points, {len(done)} steps in {time.time() - t0:.0f} s; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
