"""Fit and validate the MI355X timing model on hardware timings (bench/calib_points.json).

    python -m bench.calibrate [--jobs N] [--set NAME=VALUE ...] [--fit [--fit-only A,B]] [--split row|shape] [--lds-charged] [--limit N] [--png F]

Every point of the data set (bench/calib_data.py: aiter's f4gemm and bf16 GEMM objects
with the MI355X timings of aiter's tuning tables, and the five published FMHA points) is
launched as aiter launches it and modelled with gfxasm.perf.estimate. The report gives,
on the held-out points only, the median and 90th percentile of |modelled / measured - 1|
per regime and overall, and the FMHA points with the range over params.BRACKETS.

--fit re-fits the FITTED parameters (params.FITTED) on the fit points only, minimising
the mean |log(modelled / measured)| with Nelder-Mead, and prints them for params.py; the
report then uses the fitted set. Without it the report uses params.DEFAULT. The emulator
run of each point does not depend on the parameters, so each worker process keeps the
traces of its points and a fit evaluation only replays them (--jobs: worker processes).
Writes bench/calibration.json (every point's modelled time) and, with matplotlib, --png.
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

from bench import calib_data                                  # noqa: E402
from gfxasm.perf import lds_banks                             # noqa: E402
from gfxasm.perf import params as P                           # noqa: E402

OUT = REPO / "bench" / "calibration.json"
REGIMES = ("M<=64", "64<M<=1024", "M>1024", "fmha", "fmoe")


# ------------------------------------------------------------------ one point

def launch(point: dict) -> dict:
    """gfxasm.perf.estimate keyword arguments for a data-set point, as aiter launches it."""
    fam = point["family"]
    if fam == "f4gemm":
        from gfxasm.perf import aiter_f4gemm
        cfg = aiter_f4gemm.configs()[point["symbol"]]
        return aiter_f4gemm.launch(cfg, point["M"], point["N"], point["K"], point["log2_k_split"])
    if fam == "fmoe":
        from bench import fmoe_validate
        return fmoe_validate.launch(point)
    from bench.bench_conformance import fmha_case, gemm_bf16_case
    if fam == "bf16gemm":                    # the object is in ../shared/conformance only
        c = gemm_bf16_case(point["M"], point["N"], point["K"])
    elif fam == "fmha":
        c = fmha_case(point["B"], point["Hq"], point["Hk"], point["S"])
    else:
        raise ValueError(f"point {point.get('id')}: unknown family {fam!r}")
    return dict(co=c.co, kernel=c.kernel, grid=c.grid, block=c.block, kernarg=c.kernarg, buffers=c.buffers)


class _Worker:
    """Owns some points: their launches (tensors kept alive, so traces are reused)."""

    def __init__(self, points):
        from gfxasm.perf import estimator as est_mod
        est_mod.TRACE_CACHE_SIZE = max(est_mod.TRACE_CACHE_SIZE, len(points) + 1)
        self.points = points
        self.launches = {}

    def run(self, changes: dict, ids=None) -> list[dict]:
        from gfxasm.perf import estimate
        prm = dataclasses.replace(P.DEFAULT, **changes)
        out = []
        for p in self.points:
            if ids is not None and p["id"] not in ids:
                continue
            kw = self.launches.get(p["id"]) or self.launches.setdefault(p["id"], launch(p))
            t, cpu = time.time(), time.process_time()
            e = estimate(**kw, params=prm)
            out.append({"id": p["id"], "modelled_us": e.seconds * 1e6, "clock_ghz": e.clock_hz / 1e9,
                        "mfma_busy": e.mfma_utilization, "valu_busy": e.valu_utilization,
                        "rounds": e.rounds, "stubbed": e.stubbed, "wall_s": time.time() - t,
                        "cpu_s": time.process_time() - cpu})
        return out


def _serve(conn, points):
    w = None
    while True:
        job = conn.recv()
        if job is None:
            return
        try:
            w = w or _Worker(points)
            conn.send(w.run(*job))
        except Exception as exc:                 # report, never hang the parent
            conn.send(exc)


class Pool:
    """Worker processes, each owning a fixed share of the points."""

    def __init__(self, points: list[dict], jobs: int):
        # deal the points out by expected cost (K x tile area) so the shares take alike
        order = sorted(points, key=lambda p: -p.get("K", 0) * p.get("S", 1) ** 2)
        shares = [order[n::jobs] for n in range(jobs)]
        ctx = mp.get_context("fork")
        self.conns, self.procs = [], []
        for share in shares:
            if not share:
                continue
            a, b = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(b, share), daemon=True)
            proc.start()
            self.conns.append(a)
            self.procs.append(proc)

    def run(self, changes: dict, ids=None) -> dict[int, dict]:
        """Every point's (or, with `ids`, those points') result under params.DEFAULT with `changes`."""
        for c in self.conns:
            c.send((changes, None if ids is None else frozenset(ids)))
        res = {}
        for c in self.conns:
            got = c.recv()
            if isinstance(got, Exception):
                raise got
            res.update({r["id"]: r for r in got})
        return res

    def close(self):
        for c in self.conns:
            c.send(None)
        for p in self.procs:
            p.join()


def runnable(points: list[dict], every: int = 0) -> list[dict]:
    """The points this checkout can launch (the bf16gemm object is in ../shared/conformance
    only: without it they are left out, said on stderr), every `every`-th one if set."""
    from tests.conformance.cases import SHARED_DIR
    if not SHARED_DIR.is_dir():
        print(f"{SHARED_DIR} is absent: the bf16gemm points are left out", file=sys.stderr)
        points = [p for p in points if p["family"] != "bf16gemm"]
    return points[::every] if every else points


# ------------------------------------------------------------------ statistics

def error(point: dict, res: dict) -> float:
    return res["modelled_us"] / point["measured_us"] - 1.0


def summary(points: list[dict], results: dict, split: str = "held") -> dict:
    """Median and 90th percentile of |error| per regime and overall, on one side of the split."""
    rows = {}
    for reg in REGIMES + ("all",):
        errs = sorted(abs(error(p, results[p["id"]])) for p in points
                      if p["split"] == split and (reg == "all" or p["regime"] == reg))
        if errs:
            rows[reg] = {"n": len(errs), "median": statistics.median(errs),
                         "p90": errs[min(len(errs) - 1, math.ceil(0.9 * len(errs)) - 1)],
                         "signed_median": statistics.median(error(p, results[p["id"]]) for p in points
                                                            if p["split"] == split and
                                                            (reg == "all" or p["regime"] == reg))}
    return rows


def format_summary(rows: dict, title: str) -> str:
    lines = [f"**{title}**", "", "| regime | points | median abs error | 90th percentile | median signed error |",
             "|---|---|---|---|---|"]
    for reg, r in rows.items():
        lines.append(f"| {reg} | {r['n']} | {100 * r['median']:.1f}% | {100 * r['p90']:.1f}% | "
                     f"{100 * r['signed_median']:+.1f}% |")
    return "\n".join(lines)


# ------------------------------------------------------------------ fit

def fit(pool: Pool, points: list[dict], start: P.Params, maxfev: int, names=P.FITTED, minimize=None) -> dict:
    """Nelder-Mead on the FITTED parameters (or the subset `names`) over `points` (the pool may hold more),
    minimising the mean over strata (family x regime) of the mean |log(modelled/measured)|:
    each stratum weighs the same, so the two FMHA fit points count as much as the hundreds
    of GEMMs of one regime. `minimize`: scipy.optimize.minimize's signature (default: it;
    scipy is the `perf` extra's, so a test can pass its own)."""
    unknown = set(names) - set(P.FITTED)
    if unknown:
        raise ValueError(f"only params.FITTED can be fitted, not {sorted(unknown)}")
    logs = {"global_latency_ns", "l2_bytes_per_clk_per_cu", "vmem_inflight_bytes"}   # positive scales: fit their logs
    unset = [n for n in names if getattr(start, n) is None]
    if unset:
        raise ValueError(f"cannot fit {unset}: unset (None) in the starting set; give a start with --set")
    x0 = [math.log(getattr(start, n)) if n in logs else getattr(start, n) for n in names]
    bounds = {"power_mfma": (0.0, 3.0), "power_valu": (0.0, 3.0), "hbm_efficiency": (0.3, 1.0),
              "launch_overhead_us": (0.0, 15.0),
              "global_latency_ns": (math.log(100.0), math.log(3000.0)),
              "l2_bytes_per_clk_per_cu": (math.log(4.0), math.log(P.L2_PEAK_BYTES_PER_CLK_PER_CU)),
              "vmem_inflight_bytes": (math.log(4096.0), math.log(1 << 20))}
    by_id = {p["id"]: p for p in points}

    def changes(x):
        return {n: float(math.exp(v) if n in logs else v) for n, v in zip(names, x)}

    def loss(x):
        res = pool.run(changes(x), by_id)
        strata: dict[tuple, list] = {}
        for i, r in res.items():
            p = by_id[i]
            strata.setdefault((p["family"], p["regime"]), []).append(abs(math.log(r["modelled_us"] / p["measured_us"])))
        val = statistics.fmean(statistics.fmean(v) for v in strata.values())
        print(f"  fit: {({k: round(v, 4) for k, v in changes(x).items()})} -> mean |log ratio| {val:.4f}",
              flush=True)
        if val < best[0]:
            best[:] = [val, list(x)]
        return val

    # the best point evaluated: Nelder-Mead stopped by maxfev may return an unsorted vertex
    best = [math.inf, x0]
    if minimize is None:
        from scipy.optimize import minimize
    minimize(loss, x0, method="Nelder-Mead", bounds=[bounds[n] for n in names],
             options={"maxfev": maxfev, "xatol": 1e-3, "fatol": 1e-4, "initial_simplex": _simplex(x0, names, logs)})
    return changes(best[1])


def _simplex(x0, names, logs):
    steps = {"power_mfma": 0.2, "power_valu": 0.1, "hbm_efficiency": 0.1, "launch_overhead_us": 1.5,
             # the cap acts only near the kernels' own windows (tens of KiB): a small first step
             "vmem_inflight_bytes": math.log(1.15)}
    simplex = [list(x0)]
    for n, name in enumerate(names):
        v = list(x0)
        v[n] += steps.get(name, math.log(1.4)) if name in logs else steps[name]
        simplex.append(v)
    return simplex


# ------------------------------------------------------------------ report

def fmha_table(points, results_by_bracket) -> str:
    lines = ["| shape (B, Hq/Hk, S) | split | measured TFLOP/s | modelled TFLOP/s | error | error over brackets | clock |",
             "|---|---|---|---|---|---|---|"]
    base = results_by_bracket[next(iter(results_by_bracket))]
    for p in points:
        if p["family"] != "fmha":
            continue
        flops = 4.0 * p["B"] * p["Hq"] * p["S"] ** 2 * 128
        errs = [error(p, res[p["id"]]) for res in results_by_bracket.values()]
        r = base[p["id"]]
        lines.append(f"| B{p['B']} H{p['Hq']}/{p['Hk']} S{p['S']} | {p['split']} | "
                     f"{flops / p['measured_us'] / 1e6:.0f} | {flops / r['modelled_us'] / 1e6:.0f} | "
                     f"{100 * error(p, r):+.1f}% | {100 * min(errs):+.1f}% to {100 * max(errs):+.1f}% | "
                     f"{r['clock_ghz']:.2f} GHz |")
    return "\n".join(lines)


def _label(point: dict) -> str:
    """Legend group: the kernel; aiter's fused-MoE objects by tile (with and without topk
    weights alike), their full names being too long for a legend."""
    if point["family"] == "fmoe":
        return "fmoe stage 1 " + point["kernel"].split("g1u1_")[-1]
    return point["kernel"]


def scatter(points, results, png) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 6))
    kernels = sorted({_label(p) for p in points})
    cmap = plt.get_cmap("tab20", len(kernels))
    for n, k in enumerate(kernels):
        sel = [p for p in points if _label(p) == k and p["split"] == "held"]
        if sel:
            ax.scatter([p["measured_us"] for p in sel], [results[p["id"]]["modelled_us"] for p in sel],
                       s=10, color=cmap(n), label=k)
    lo = min(p["measured_us"] for p in points) / 1.5
    hi = max(p["measured_us"] for p in points) * 1.5
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    for f in (0.8, 1.2):
        ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured on MI355X (us)")
    ax.set_ylabel("modelled (us)")
    ax.set_title("gfxasm.perf timing model, held-out points (dotted: +-20%)")
    ax.legend(fontsize=6, ncol=2, loc="upper left")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    return True


def write(path, report: dict) -> None:
    """JSON with one point per line (small diffs when the model changes)."""
    head = json.dumps({k: v for k, v in report.items() if k != "points"}, indent=1)[:-2]
    short = lambda v: float(f"{v:.4g}") if isinstance(v, float) else v            # noqa: E731
    body = ",\n".join(json.dumps({k: short(v) for k, v in p.items()}, separators=(",", ":"))
                       for p in report["points"])
    Path(path).write_text(f'{head},\n "points": [\n{body}\n]}}\n')


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=max(1, min(16, mp.cpu_count())))
    ap.add_argument("--fit", action="store_true", help="re-fit params.FITTED on the fit points first")
    ap.add_argument("--maxfev", type=int, default=60)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="start from params.DEFAULT with this field changed (repeatable): a candidate mechanism")
    ap.add_argument("--fit-only", default=",".join(n for n in P.FITTED if getattr(P.DEFAULT, n) is not None),
                    help="comma-separated FITTED parameters to fit (the others keep params.DEFAULT's values)")
    ap.add_argument("--lds-charged", action="store_true",
                    help="also report the held-out error with LDS bank conflicts charged (lds_banks.DEFAULT)")
    ap.add_argument("--fit-every", type=int, default=1,
                    help="fit on every n-th f4gemm fit point only (fit cost; the held-out report is unchanged)")
    ap.add_argument("--split", choices=("row", "shape"), default="row",
                    help="row: calib_points.json's marks; shape: calib_data.shape_split (no (kernel, N, K) on both sides)")
    ap.add_argument("--limit", type=int, default=0, help="every n-th point only (a quick look)")
    ap.add_argument("--rebuild", action="store_true", help="rebuild the data set from the corpus first")
    ap.add_argument("--png", default=None)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    P.DEFAULT = dataclasses.replace(P.DEFAULT, **P.overrides(args.set))      # workers fork with it
    points = calib_data.build() if args.rebuild else calib_data.load()
    if args.split == "shape":
        calib_data.shape_split(points)
    points = runnable(points, args.limit)
    t0 = time.time()
    fitted = {}
    if args.fit:
        fit_pts = [p for p in points if p["split"] == "fit"]
        fit_pts = [p for n, p in enumerate(fit_pts) if p["family"] != "f4gemm" or n % args.fit_every == 0]
        pool = Pool(fit_pts, args.jobs)
        fitted = fit(pool, points, P.DEFAULT, args.maxfev, tuple(n for n in args.fit_only.split(",") if n))
        pool.close()
        print("\nfitted (for params.CALIBRATED):", json.dumps(fitted), flush=True)
    base = dataclasses.replace(P.DEFAULT, **fitted)
    P.DEFAULT = base                      # workers fork with it
    pool = Pool(points, args.jobs)
    results = pool.run({})
    fmha_pts = [p for p in points if p["family"] == "fmha"]
    brackets = {"base": results}
    if fmha_pts:
        bpool = Pool(fmha_pts, min(args.jobs, len(fmha_pts)))
        for name, changes in P.BRACKETS.items():
            if changes:
                brackets[name] = bpool.run(changes)
        bpool.close()
    charged = pool.run({"lds_conflicts": lds_banks.DEFAULT}) if args.lds_charged else None
    pool.close()
    held = summary(points, results, "held")
    if charged:
        print(format_summary(summary(points, charged, "held"),
                             f"held-out points, LDS bank conflicts charged ({lds_banks.DEFAULT!r} phases)"))
        print()
    print(format_summary(held, "held-out points (modelled vs measured)"))
    print()
    print(format_summary(summary(points, results, "fit"), "fit points"))
    print()
    print(fmha_table(points, brackets))
    slowest = max(results.values(), key=lambda r: r["cpu_s"])
    print(f"\n{len(points)} points in {time.time() - t0:.0f} s; slowest first estimate (emulator run "
          f"included): point {slowest['id']}, {slowest['cpu_s']:.1f} s CPU ({slowest['wall_s']:.1f} s wall); "
          f"stubbed: "
          f"{sorted({s for r in results.values() for s in r['stubbed']}) or 'none'}")
    write(args.out, {
        "params": dataclasses.asdict(base), "set": args.set, "fitted": fitted, "held_out": held,
        "fit": summary(points, results, "fit"),
        **({"held_out_lds_charged": summary(points, charged, "held")} if charged else {}),
        "fmha_brackets": {name: {p["id"]: res[p["id"]]["modelled_us"] for p in fmha_pts}
                          for name, res in brackets.items()},
        "points": [{**{k: p[k] for k in ("id", "kernel", "regime", "split", "measured_us")},
                    **{k: results[p["id"]][k] for k in ("modelled_us", "clock_ghz", "mfma_busy", "valu_busy",
                                                          "cpu_s")}}
                   for p in points]})
    print(f"wrote {args.out}")
    if args.png:
        print(f"wrote {args.png}" if scatter(points, results, args.png) else
              "scatter plot skipped: matplotlib is not installed")


if __name__ == "__main__":
    main()
