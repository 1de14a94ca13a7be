"""Validate the timing model on aiter's fused-MoE stage-1 timings (rows it was never fitted on).

The same rows are points of the calibration data set (bench/calib_data.py, family "fmoe",
split by shape), so `calibrate --fit` now fits on half of them; params.DEFAULT predates
that. This script keeps the per-row analysis calibrate does not give: the padded grid
against its used blocks, the stream rows' rates and floors.

    python -m bench.fmoe_validate [--jobs N] [--limit N] [--out FILE] [--set NAME=VALUE ...]

Rows: every `cu_num` 256 (MI355X) row of the corpus's `aiter/configs/tuned_fmoe.csv`
whose `kernelName1` is an asm stage-1 object of the wheel (gfxasm.perf.aiter_fmoe.configs);
`us1` is aiter's tuner measurement of that launch (device time of the launch's kernels,
cold weights: its perftest rotates copies of the inputs). Rows that cannot be launched
faithfully are listed with the reason and skipped. Each row is launched as aiter's
moe_stage1_g1u1 launches it (gfxasm.perf.aiter_fmoe: the whole moe_sorting grid) and
modelled with gfxasm.perf.estimate at params.DEFAULT; it is modelled a second time with the
grid cut to the routing's used blocks ("used"). The blocks past num_valid_ids only exit;
the model finds them by probing the grid (gfxasm.perf.grid) and charges them their own
short time, so the two agree up to that time (before grid.py it charged every workgroup
like its sample, and "used" was the better figure).

Per row: modelled and measured us, error (modelled / measured - 1), the fp8 w1 bytes of
the experts the routing uses (each must come from HBM at least once: aiter rotates input
copies), the measured TB/s over those bytes, the regime ("stream" when that rate is at
least 90% of the model's sustainable HBM rate, else "partial"), the floor the model's HBM
rate puts under any estimate (those bytes at that rate + the launch cost), the grid's
workgroup classes the model found, and the seconds each estimate took. The summary gives
the stream rows' implied HBM efficiency: the fraction of 8 TB/s that moves the model's DRAM
bytes in the measured time less the launch cost (what a pure bandwidth bound would need;
params.hbm_efficiency is not changed here). Writes bench/out/fmoe_validate.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import csv
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gfxasm.perf import params as P                                # noqa: E402

OUT = REPO / "bench" / "out" / "fmoe_validate.json"
TUNED_CSV = "aiter/configs/tuned_fmoe.csv"
CAP_TBPS = P.DEFAULT.hbm_efficiency * P.HBM_BYTES_PER_S / 1e12
STREAM_TBPS = 0.9 * CAP_TBPS
SHAPE = ("token", "model_dim", "inter_dim", "expert", "topk")   # a row's shape, aiter_fmoe.launch's order


def _skip_reason(row: dict, cfg) -> str | None:
    """Why a cu_num-256 row with an asm kernelName1 cannot be launched as moe_stage1_g1u1 does."""
    if cfg is None:
        if "fmoe_bf16_" in row["kernelName1"]:
            return "1-stage fused object (launched by asm_fmoe.cu, other host code): not covered"
        return "not a stage-1 object of the wheel's fp8 per-token CSVs"
    if row["q_dtype_a"] != "torch.float8_e4m3fn" or row["q_dtype_w"] != "torch.float8_e4m3fn":
        return f"dtypes {row['q_dtype_a']}/{row['q_dtype_w']}: the objects take fp8 e4m3"
    if row["q_type"] not in ("QuantType.per_Token", "QuantType.per_Tensor"):
        return f"{row['q_type']}: a different object family"
    if int(row["block_m"]) != cfg.tile_m:
        return f"block_m {row['block_m']} != tile_M {cfg.tile_m} (moe_stage1_g1u1 refuses it)"
    if int(row["ksplit"]) or row["use_g1u1"] != "1":
        return "ksplit > 0 or g1u0 (not in the launch recipe)"
    if (row["doweight_stage1"] == "1") != cfg.doweight:
        return "doweight_stage1 does not match the object family"
    return None


def rows() -> tuple[list[dict], list[dict]]:
    """(points, skipped) from the corpus's tuned_fmoe.csv."""
    from gfxasm import corpus
    from gfxasm.perf import aiter_fmoe
    cfgs = aiter_fmoe.configs()
    points, skipped = [], []
    with open(corpus.path(TUNED_CSV), newline="") as f:
        for n, row in enumerate(csv.DictReader(f)):
            if row["cu_num"] != "256" or not row["kernelName1"].startswith("_ZN5aiter"):
                continue
            cfg = cfgs.get(row["kernelName1"])
            shape = {k: int(row[k]) for k in SHAPE}
            reason = _skip_reason(row, cfg)
            if reason:
                skipped.append({"line": n + 2, "kernel": row["kernelName1"], **shape, "reason": reason})
                continue
            points.append({"line": n + 2, "symbol": cfg.symbol, "kernel": cfg.co.rsplit("/", 1)[1][:-3], **shape,
                           "activation": row["act_type"].split(".")[-1], "q_type": row["q_type"].split(".")[-1],
                           "measured_us": float(row["us1"])})
    return points, skipped


def launch(point: dict, used_blocks_only: bool = False) -> dict:
    """gfxasm.perf.estimate keyword arguments for a row, launched as moe_stage1_g1u1 does."""
    from gfxasm.perf import aiter_fmoe
    cfg = aiter_fmoe.configs()[point["symbol"]]
    return aiter_fmoe.launch(cfg, *(point[k] for k in SHAPE), activation=point["activation"],
                             used_blocks_only=used_blocks_only)


def weight_bytes(point: dict) -> int:
    """fp8 w1 bytes of the experts a row's routing (aiter_fmoe.routing) uses."""
    from gfxasm.perf import aiter_fmoe
    ids, _ = aiter_fmoe.routing(point["token"], point["expert"], point["topk"])
    return aiter_fmoe.weight_bytes(ids, point["inter_dim"], point["model_dim"])


def fastest_stream_tbps() -> float:
    """The highest rate any row streams its weights at, its launch cost taken out: what an
    MI355X has been measured to sustain (no emulation; the corpus's CSV and our routing)."""
    points, _ = rows()
    return max(weight_bytes(p) / (p["measured_us"] - P.DEFAULT.launch_overhead_us) / 1e6 for p in points)


def model(point: dict) -> dict:
    """Both estimates of one row, their wall times and the routing's weight bytes."""
    from gfxasm.perf import estimate
    wbytes = weight_bytes(point)
    res = dict(point, weight_bytes=wbytes, measured_tbps=wbytes / point["measured_us"] / 1e6)
    res["regime"] = "stream" if res["measured_tbps"] >= STREAM_TBPS else "partial"
    res["floor_us"] = wbytes / CAP_TBPS / 1e6 + P.DEFAULT.launch_overhead_us
    for key, used in (("grid", False), ("used", True)):
        kw = launch(point, used)
        t = time.time()
        e = estimate(**kw)
        res[key] = {"grid": kw["grid"], "modelled_us": e.seconds * 1e6, "error": e.seconds * 1e6 / point["measured_us"] - 1,
                    "modelled_tbps": wbytes / e.seconds / 1e12, "rounds": e.rounds, "clock_ghz": e.clock_hz / 1e9,
                    "hbm_rho": e.hbm_utilization, "mfma_busy": e.mfma_utilization, "stubbed": e.stubbed,
                    "dram_bytes": e.dram_bytes, "classes": e.workgroup_classes,
                    "estimate_s": time.time() - t}
    return res


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def summary(results: list[dict]) -> dict:
    """median / p90 of |error| per token count and overall, for both grids; the stream rows' rates."""
    out = {}
    groups = {f"token {t}": [r for r in results if r["token"] == t] for t in sorted({r["token"] for r in results})}
    groups["all"] = results
    for name, rs in groups.items():
        out[name] = {"rows": len(rs)}
        for key in ("grid", "used"):
            errs = [abs(r[key]["error"]) for r in rs]
            out[name][key] = {"median_abs_error": statistics.median(errs), "p90_abs_error": _pct(errs, 0.9),
                              "median_error": statistics.median(r[key]["error"] for r in rs)}
    stream = [r for r in results if r["regime"] == "stream"]
    if stream:
        implied = [r["grid"]["dram_bytes"] / ((r["measured_us"] - P.DEFAULT.launch_overhead_us) * 1e-6)
                   / P.HBM_BYTES_PER_S for r in stream]
        out["stream"] = {"rows": len(stream), "cap_tbps": CAP_TBPS,
                         "measured_tbps": [min(r["measured_tbps"] for r in stream), max(r["measured_tbps"] for r in stream)],
                         "above_cap": sum(r["measured_tbps"] > CAP_TBPS for r in stream),
                         "floor_above_measured": sum(r["floor_us"] > r["measured_us"] for r in stream),
                         **{f"{k}_pessimistic": sum(r[k]["error"] > 0 for r in stream) for k in ("grid", "used")},
                         **{f"{k}_median_error": statistics.median(r[k]["error"] for r in stream) for k in ("grid", "used")},
                         "implied_hbm_efficiency": {"median": statistics.median(implied), "min": min(implied),
                                                    "max": max(implied)}}
    return out


def format_table(results: list[dict]) -> str:
    lines = [f"{'line':>4} {'tok':>5} {'dim':>5} {'inter':>5} {'E':>4} {'k':>2} {'kernel':58} {'meas':>7} "
             f"{'grid':>7} {'err':>7} {'used':>7} {'err':>7} {'w GB':>5} {'TB/s':>5} {'regime':7} {'est s':>5}"]
    for r in sorted(results, key=lambda r: (r["model_dim"], r["inter_dim"], r["token"], r["line"])):
        g, u = r["grid"], r["used"]
        lines.append(f"{r['line']:>4} {r['token']:>5} {r['model_dim']:>5} {r['inter_dim']:>5} {r['expert']:>4} "
                     f"{r['topk']:>2} {r['kernel']:58} {r['measured_us']:7.1f} {g['modelled_us']:7.1f} {g['error']:+7.1%} "
                     f"{u['modelled_us']:7.1f} {u['error']:+7.1%} {r['weight_bytes'] / 1e9:5.2f} {r['measured_tbps']:5.2f} "
                     f"{r['regime']:7} {g['estimate_s'] + u['estimate_s']:5.1f}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--limit", type=int, default=None, help="model only the first N rows")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="model with params.DEFAULT's field changed (repeatable): a candidate mechanism")
    args = ap.parse_args(argv)
    global CAP_TBPS, STREAM_TBPS
    P.DEFAULT = dataclasses.replace(P.DEFAULT, **P.overrides(args.set))      # the workers fork with it
    CAP_TBPS = P.DEFAULT.hbm_efficiency * P.HBM_BYTES_PER_S / 1e12
    STREAM_TBPS = 0.9 * CAP_TBPS
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    points, skipped = rows()
    points = points[:args.limit]
    t = time.time()
    with mp.get_context("fork").Pool(args.jobs) as pool:
        results = pool.map(model, points, chunksize=1)
    wall = time.time() - t
    print(format_table(results))
    print(f"\nskipped {len(skipped)} cu_num-256 asm rows:")
    for s in skipped:
        print(f"  line {s['line']} token {s['token']} {s['kernel']}: {s['reason']}")
    summ = summary(results)
    print(f"\n|modelled / measured - 1| (grid: as aiter launches; used: grid cut to the used blocks); "
          f"HBM cap of the model {CAP_TBPS:.2f} TB/s")
    for name, s in summ.items():
        if name != "stream":
            print(f"  {name:10} {s['rows']:3} rows  grid median {s['grid']['median_abs_error']:6.1%} p90 "
                  f"{s['grid']['p90_abs_error']:6.1%}   used median {s['used']['median_abs_error']:6.1%} p90 "
                  f"{s['used']['p90_abs_error']:6.1%}")
    if "stream" in summ:
        s = summ["stream"]
        print(f"  stream rows {s['rows']}: measured {s['measured_tbps'][0]:.2f}-{s['measured_tbps'][1]:.2f} TB/s, "
              f"{s['above_cap']} above the cap, {s['floor_above_measured']} faster than the cap's floor; modelled slower in {s['grid_pessimistic']} (grid) / "
              f"{s['used_pessimistic']} (used), median error {s['grid_median_error']:+.1%} / {s['used_median_error']:+.1%}")
        h = s["implied_hbm_efficiency"]
        print(f"  stream rows' implied HBM efficiency (modelled DRAM bytes over measured time less the launch "
              f"cost, of 8 TB/s): median {h['median']:.3f} ({h['min']:.3f}-{h['max']:.3f}); "
              f"params.hbm_efficiency {P.DEFAULT.hbm_efficiency}")
    est = [r[k]["estimate_s"] for r in results for k in ("grid", "used")]
    print(f"estimate wall time per launch: median {statistics.median(est):.1f} s, max {max(est):.1f} s; "
          f"{len(results)} rows in {wall:.0f} s with {args.jobs} jobs")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"params": "params.DEFAULT", "set": args.set, "cap_tbps": CAP_TBPS, "rows": results,
                                    "skipped": skipped, "summary": summ, "wall_s": wall, "jobs": args.jobs}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
