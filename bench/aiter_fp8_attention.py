"""Same-model comparison with AMD's own FP8 attention: aiter's hardware-built
fmha_v3_fwd/fwd_hd128_fp8[_causal].co (pinned extras, ROCm/aiter e8f438a; `gfxasm corpus
fetch-extra`) against our FP8 batch prefill (bench/prefill.py's per-tensor FP8 page-1
launch), both on gfxasm.perf's MI355X timing model, on bench/prefill.py's table shapes,
under every entry of gfxasm.perf.params.BRACKETS.

    python3 bench/aiter_fp8_attention.py [--only TEXT] [--direct-max S] [--ours] [--out FILE]

aiter's launch is its host code's (tests/conformance/cases_fp8_fwd.py: the same recipe the
conformance tests run): batch mode, B1, per-tensor descales, LSE stored, grid
(Q tiles, Hq, 1), a causal workgroup two Q tiles. It is a dense forward: no paged
competitor exists in aiter for FP8 prefill, so against our page-1 paged prefill it is the
nearest same-model rival, not an equal one (ours pays the paging, bench/prefill.py's
paged/dense ratio). Inputs are zeros (an e4m3 NaN byte would stop the emulator), K and V
with the recipe's slack after them.

Shapes up to --direct-max tokens are modelled directly (gfxasm.perf.estimate; the
estimator's own causal workgroup classes). Longer ones are extrapolated, as
bench/causal_model.py extrapolates our long causal probes: a workgroup's cycles per round
are affine in the keys it walks once its loop dominates (a non-causal workgroup walks S
keys; a causal one, two Q tiles, ~S + 256, and the estimator finds one workgroup class),
fitted through the two largest direct sizes; the clock is Params.sustained_clock at the
larger fit's busy fractions scaled by the share of CUs the full grid keeps busy (as
gfxasm.perf.grid.simulate sets it); times the full grid's rounds, plus the launch
overhead. Each bracket is fitted on its own. Not carried: the memory contention of a full
chip when the fits run on part of it (docs/aiter-fp8-attention.md gives its size). Ours
(--models ours) is bench/causal_model.modelled_seconds under each bracket (its 16k-key
probe cap applies).

Numbers are modelled, never measured; CK's figures are its published MI355X ones
(bench/prefill.py CK_SOURCE).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gfxasm.perf import estimate                              # noqa: E402
from gfxasm.perf import params as P                           # noqa: E402

from bench import attention_launches as launches             # noqa: E402
from bench.prefill import CK, CK_SOURCE                       # noqa: E402
from tests.conformance import cases_fp8_fwd as recipe        # noqa: E402

D = recipe.D


def brackets() -> dict[str, P.Params]:
    return {name: dataclasses.replace(P.DEFAULT, **changes) for name, changes in P.BRACKETS.items()}


def aiter_launch(Hq: int, Hk: int, S: int, causal: bool) -> dict:
    """gfxasm.perf.estimate's arguments for aiter's FP8 forward at B1, Sq = Sk = S."""
    fp8 = torch.float8_e4m3fn
    q = torch.zeros(1, S, Hq, D, dtype=fp8)
    k_room = torch.zeros(1, S + recipe.KV_SLACK, Hk, D, dtype=fp8)
    v_room = torch.zeros_like(k_room)
    o = torch.empty(1, S, Hq, D, dtype=torch.bfloat16)
    lse = torch.empty(1, Hq, S, dtype=torch.float32)
    descales = tuple(torch.ones(1) for _ in range(3))
    inputs = recipe._Inputs((q, k_room[:, :S], v_room[:, :S]), descales)
    raw = recipe._kernarg(inputs, o, lse, opt=recipe._fmha_tune_opt(Hq, S, causal), seq=1, head=2, batch_stride=True)
    return dict(co=str(recipe.path(causal, False)), grid=(recipe._fmha_q_tiles(S, causal), Hq, 1), block=(512, 1, 1),
                kernarg=raw, buffers=[q, k_room, v_room, o, lse, *descales],
                kernel=recipe.SYMBOLS[recipe.name(causal, False)])


@functools.lru_cache(maxsize=None)
def _aiter_estimates(Hq: int, Hk: int, S: int, causal: bool) -> dict:
    """bracket -> gfxasm.perf Estimate of aiter's launch (one trace, replayed per bracket)."""
    kw = aiter_launch(Hq, Hk, S, causal)
    return {name: estimate(**kw, params=prm) for name, prm in brackets().items()}


def _keys_per_workgroup(S: int, causal: bool) -> int:
    return S + recipe.TS_QO if causal else S


def aiter_seconds(Hq: int, Hk: int, S: int, causal: bool, direct_max: int) -> dict[str, dict]:
    """bracket -> {seconds, how, ...} for aiter's launch (module docstring: direct or
    extrapolated)."""
    if S <= direct_max:
        out = {}
        for name, e in _aiter_estimates(Hq, Hk, S, causal).items():
            out[name] = dict(seconds=e.seconds, how="direct", mfma_busy=e.mfma_utilization, clock_hz=e.clock_hz,
                             cycles_per_round=e.cycles_per_round, rounds=e.rounds, workgroups=e.workgroups)
        return out
    fit = [direct_max // 2, direct_max]
    pts = {name: [] for name in P.BRACKETS}
    for s in fit:
        for name, e in _aiter_estimates(Hq, Hk, s, causal).items():
            pts[name].append((_keys_per_workgroup(s, causal), e))
    workgroups = recipe._fmha_q_tiles(S, causal) * Hq
    keys = _keys_per_workgroup(S, causal)
    active_share = min(workgroups, P.NUM_CUS) / P.NUM_CUS
    out = {}
    for name, prm in brackets().items():
        (k1, e1), (k2, e2) = pts[name]
        per_cu = e2.workgroups_per_cu
        rounds = math.ceil(math.ceil(workgroups / P.NUM_CUS) / per_cu)      # as the estimator counts them
        cycles = e2.cycles_per_round + (e2.cycles_per_round - e1.cycles_per_round) / (k2 - k1) * (keys - k2)
        # the clock of the full grid's activity (gfxasm.perf.grid.simulate's rule), at the
        # larger fit's busy fractions: a fit on a part-filled chip runs at a higher clock
        clock = prm.sustained_clock(e2.mfma_utilization * active_share, e2.valu_utilization * active_share)
        out[name] = dict(seconds=rounds * cycles / clock + prm.launch_overhead_us * 1e-6,
                         how=f"extrapolated from S {fit[0]} and {fit[1]}", rounds=rounds, cycles_per_round=cycles,
                         clock_hz=clock, mfma_busy_at_fit=e2.mfma_utilization, clock_hz_at_fit=e2.clock_hz)
    return out


@contextlib.contextmanager
def _default_params(prm: P.Params):
    """bench/causal_model.py calls gfxasm.perf.estimate without params (P.DEFAULT at call
    time): set P.DEFAULT to one bracket for the call, restored after."""
    saved = P.DEFAULT
    P.DEFAULT = prm
    try:
        yield
    finally:
        P.DEFAULT = saved


def ours_seconds(Hq: int, Hk: int, S: int, causal: bool) -> dict[str, float]:
    """bracket -> seconds of our FP8 page-1 prefill (bench/prefill.py's launch)."""
    from gfxasm.ops import batch_prefill as bp
    from bench.causal_model import modelled_seconds
    out = {}
    for name, prm in brackets().items():
        with _default_params(prm):
            out[name] = modelled_seconds(launches.paged(bp.FP8), 1, Hq, Hk, S, causal)[0]
    return out


def _range(values) -> str:
    return f"{min(values):.0f}-{max(values):.0f}" if values else "-"


def _save(out: Path, row: dict) -> dict:
    """Merge this row's models into the saved row of its label (re-read first: a run of the
    other model may share the file) and write; returns the merged row."""
    saved = {r["label"]: r for r in json.loads(out.read_text())["rows"]} if out.exists() else {}
    merged = {**saved.get(row["label"], {}), **row}
    if "aiter" in merged and "ours" in merged:
        merged["ours_over_aiter_speed"] = {n: merged["aiter"][n]["seconds"] / merged["ours"][n]["seconds"]
                                           for n in merged["aiter"] if n in merged["ours"]}
    saved[row["label"]] = merged
    out.write_text(json.dumps(dict(brackets=P.BRACKETS, ck_source=CK_SOURCE, rows=list(saved.values())),
                              indent=1, default=str))
    return merged


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="only rows whose label contains this text")
    ap.add_argument("--direct-max", type=int, default=8192, help="longest S modelled directly (longer: extrapolated)")
    ap.add_argument("--models", default="aiter,ours", help="which to model: aiter, ours or both (the rest kept)")
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "aiter_fp8_attention.json"))
    args = ap.parse_args(argv)
    models = set(args.models.split(","))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    default = next(iter(P.BRACKETS))
    print(f"{'problem':22} {'CK fp8':>7} {'aiter fp8':>9} {'range':>11} {'ours fp8':>8} {'range':>11} "
          f"{'ours/aiter':>10} {'range':>11} {'wall s':>6}")
    for (Hq, Hk, S, causal), (ck, _) in CK.items():
        label = f"h{Hq}/{Hk} s{S // 1024}k {'c' if causal else 'nc'}"
        if args.only and args.only not in label:
            continue
        t0 = time.time()
        flops = launches.flops(1, Hq, S, causal)
        row = dict(label=label, Hq=Hq, Hk=Hk, S=S, causal=causal, flops=flops, ck_fp8_tflops=ck, source="modelled")
        if "aiter" in models:
            row["aiter"] = {n: dict(v, tflops=flops / v["seconds"] / 1e12)
                            for n, v in aiter_seconds(Hq, Hk, S, causal, args.direct_max).items()}
            row["aiter_wall_s"] = round(time.time() - t0, 1)
        if "ours" in models:
            t1 = time.time()
            row["ours"] = {n: dict(seconds=s, tflops=flops / s / 1e12) for n, s in ours_seconds(Hq, Hk, S, causal).items()}
            row["ours_wall_s"] = round(time.time() - t1, 1)
        row = _save(out, row)
        cols = []
        for key in ("aiter", "ours"):
            v = [x["tflops"] for x in row.get(key, {}).values()]
            cols += [f"{row[key][default]['tflops']:.0f}" if v else "-", _range(v)]
        ratio = list(row.get("ours_over_aiter_speed", {}).values())
        cols += [f"{row['ours_over_aiter_speed'][default]:.2f}" if ratio else "-",
                 f"{min(ratio):.2f}-{max(ratio):.2f}" if ratio else "-"]
        print(f"{label:22} {ck:7.0f} {cols[0]:>9} {cols[1]:>11} {cols[2]:>8} {cols[3]:>11} {cols[4]:>10} {cols[5]:>11} "
              f"{time.time() - t0:6.0f}", flush=True)
    print(f"modelled (gfxasm.perf MI355X model, params.BRACKETS); CK: {CK_SOURCE}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
