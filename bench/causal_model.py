"""Modelled seconds of an attention forward launch, causal or not, on gfxasm.perf's MI355X
timing model, for any kernel built from asm/fmha_fwd_d128.s: the launch is a parameter
(bench/attention_launches.py: dense fmha_fwd_d128 for bench/fmha.py, paged
batch_prefill_d128 for bench/prefill.py).

Non-causal: gfxasm.perf.estimate of the launch. Causal: work differs per Q tile, so the
workgroup of Q tile t is modelled on its own (the same launch, that one workgroup sampled)
at five t with linear interpolation between, and the grid's workgroups are list-scheduled on
256 CUs in dispatch order (one workgroup per CU at a time) — the makespan is the kernel
time. Where S exceeds the probe cap (PROBE_CAP_KEYS; 16,384 keys), the five t are spread
over the Q tiles whose workgroups walk at most the cap's keys, and the longer tiles are
extrapolated on the line through the last two probes: past a few KV tiles a workgroup's
time is affine in the tiles it visits (its steady-state loop), but for a curvature that
fades with length, mostly from the probe's own sustained clock (it falls as the workgroup's
MFMA-busy share nears the loop's). Capped probes skip gfxasm.perf.grid's class search,
which on such a grid ends in None (the sample scaling) after emulating workgroups as long
as the sequence.

validate_cap compares the five-probe and capped times, per probe and in total (bench/fmha.py
--validate-cap). Measured at 1d1c5c1: the 16k cap lowers the total by 0.011-0.013% at 32k
(paged fp8, paged bf16, dense bf16), 0.020-0.022% at 65k (paged fp8, bf16), 0.031% at 131k
(paged fp8; every probe within 0.03%); smaller caps err more (4k: 0.03-0.37% at 8k-65k; 1k:
up to 2.6%), always low. At 8k the class-search skip changed no probe's time (bit for bit)
and ran 3.2x faster.
"""
from __future__ import annotations

import contextlib
import heapq
import math
import time

from gfxasm.perf import estimator
from gfxasm.perf import params as P

from bench.attention_launches import BLOCK, Q_TILE, Launch

# Longest KV length (keys) a causal probe workgroup walks in the emulator by default; Q tiles
# past it are extrapolated (probe_tiles, q_tile_seconds); None: no cap. Validated with
# validate_cap (module docstring); rows of S <= 16384 (all of bench/out/fmha.json's) are not capped.
PROBE_CAP_KEYS = 16384


@contextlib.contextmanager
def _estimator_choices(workgroup, class_search: bool):
    """gfxasm.perf.estimate takes no argument for these, so they are set on its module for one
    call and restored: `workgroup` (x, y, z) sampled instead of the ones compute unit 0 would
    run, and gfxasm.perf.grid's class search skipped (as if it found none: the sample scaling)."""
    chooser, finder = estimator.representative_workgroups, estimator.grid_mod.find_classes
    if workgroup is not None:
        estimator.representative_workgroups = lambda grid, per_cu, rounds: [tuple(workgroup)]
    if not class_search:
        estimator.grid_mod.find_classes = lambda *args, **kwargs: None
    try:
        yield
    finally:
        estimator.representative_workgroups, estimator.grid_mod.find_classes = chooser, finder


def estimate(launch: Launch, B, Hq, Hk, Sq, Sk, causal, workgroup=None, class_search=True, params=None):
    """gfxasm.perf.estimate of the launch; with `workgroup` (x, y, z), that one workgroup is
    the sample (same grid and buffers, so the cache/DRAM accounting is the whole problem's).
    class_search=False: gfxasm.perf.grid's probing for workgroup classes is skipped.
    params: the model's parameters (default params.DEFAULT; a corner: params.CORNERS)."""
    variant, grid, raw, buffers = launch.parts(B, Hq, Hk, Sq, Sk, causal)
    with _estimator_choices(workgroup, class_search):
        return estimator.estimate(str(variant.co_path), grid, BLOCK, raw, buffers, variant.kernel.symbol,
                                  params=params, skip_mfma=launch.skip_mfma)


def probe_tiles(tiles: int, cap_tiles: int | None = None) -> list[int]:
    """The Q tiles whose workgroups a causal launch of `tiles` Q tiles models: five spread over
    the grid (first, quarters, last); with `cap_tiles` below `tiles`, the same five spread over
    the first cap_tiles only (the rest are extrapolated from the last two)."""
    n = tiles if cap_tiles is None else min(tiles, cap_tiles)
    return sorted({0, n // 4, n // 2, (3 * n) // 4, n - 1})


def q_tile_seconds(probed: dict[int, float], t: int) -> float:
    """Seconds of Q tile t's workgroup from the probed ones: linear between the probes around
    t; past the last probe, on the line through the last two (a causal workgroup's time is
    affine in the KV tiles it visits once its steady-state loop dominates)."""
    ts = sorted(probed)
    if t in probed:
        return probed[t]
    if t > ts[-1]:
        lo, hi = (ts[-2], ts[-1]) if len(ts) > 1 else (ts[-1], ts[-1])
    else:
        lo = max(p for p in ts if p < t)
        hi = min(p for p in ts if p > t)
    if lo == hi:
        return probed[lo]
    return probed[lo] + (probed[hi] - probed[lo]) * (t - lo) / (hi - lo)


def tiles_under_cap(S: int, cap_keys: int | None) -> int | None:
    """Q tiles under the cap (None: no cap applies, every probe is modelled)."""
    if cap_keys is None or S <= cap_keys:
        return None
    if cap_keys < 4 * Q_TILE:
        raise ValueError(f"cap_keys must be at least {4 * Q_TILE} (four Q tiles), got {cap_keys}")
    return cap_keys // Q_TILE


def probe_seconds(launch: Launch, B, Hq, Hk, S, tiles: list[int], class_search: bool = True,
                  params=None) -> dict[int, tuple[float, float]]:
    """Q tile -> (seconds, clock_hz) of its workgroup, each probe modelled in the whole causal
    launch (its cycles at the sustained clock its own activity gives). Workgroup x runs Q tile
    T-1-x (longest first)."""
    T = math.ceil(S / Q_TILE)
    out = {}
    for t in tiles:
        e = estimate(launch, B, Hq, Hk, S, S, True, workgroup=(T - 1 - t, 0, 0), class_search=class_search,
                     params=params)
        out[t] = (e.cycles_per_round / e.clock_hz, e.clock_hz)
    return out


def causal_makespan(B, Hq, S, probed: dict[int, float]) -> float:
    """Seconds from the first dispatch to the last workgroup's end: per-workgroup seconds
    (q_tile_seconds) list-scheduled on the CUs in dispatch order (x fastest, one workgroup
    per CU at a time)."""
    tiles = math.ceil(S / Q_TILE)
    per_tile = [q_tile_seconds(probed, tiles - 1 - x) for x in range(tiles)]
    free = [0.0] * P.NUM_CUS
    heapq.heapify(free)
    end = 0.0
    for _ in range(B * Hq):
        for c in per_tile:
            start = heapq.heappop(free)
            heapq.heappush(free, start + c)
            end = max(end, start + c)
    return end


def modelled_seconds(launch: Launch, B, Hq, Hk, S, causal, cap_keys: int | None = PROBE_CAP_KEYS,
                     params=None) -> tuple[float, dict]:
    """Modelled seconds of the launch at Sq = Sk = S and its detail. Causal: the workgroups of
    the Q tiles of probe_tiles modelled, the others interpolated (q_tile_seconds),
    list-scheduled. Where S exceeds `cap_keys` (None: never), only Q tiles whose workgroups
    walk at most cap_keys keys are probed and the longer ones extrapolated; those probes skip
    gfxasm.perf.grid's class search, which in such a grid (every Q tile's work differs) ends
    in None, the sample scaling (validate_cap checks both). params: the model's parameters
    (default params.DEFAULT)."""
    if not causal:
        est = estimate(launch, B, Hq, Hk, S, S, False, params=params)
        return est.seconds, dict(cycles_per_workgroup=est.cycles_per_round, rounds=est.rounds,
                                 mfma_pipe_busy=est.mfma_utilization, clock_hz=est.clock_hz)
    tiles = math.ceil(S / Q_TILE)
    cap = tiles_under_cap(S, cap_keys)
    probes = probe_seconds(launch, B, Hq, Hk, S, probe_tiles(tiles, cap), class_search=cap is None, params=params)
    measured = {t: s for t, (s, _) in probes.items()}
    end = causal_makespan(B, Hq, S, measured)
    return end + (params or P.DEFAULT).launch_overhead_us * 1e-6, dict(
        seconds_per_q_tile={str(t): s for t, s in measured.items()}, makespan_s=end,
        clock_hz={str(t): c for t, (_, c) in probes.items()},
        probe_cap_keys=cap_keys, extrapolated_past_q_tile=None if cap is None else cap - 1)


# ------------------------------------------------------------------ probe cap validation

def validate_cap(launches: dict[str, Launch], sizes, caps, heads=(6, 1), class_search=False) -> list[dict]:
    """Causal B1 launches of each named launch: the five-probe time (class search as
    `class_search`) against the capped time for each cap below S (probes without class
    search), per probe (the probed Q tile's seconds against the capped interpolation or
    extrapolation there) and in total. Each row is printed as it finishes (rows are slow)."""
    Hq, Hk = heads
    out = []
    for name, launch in launches.items():
        for S in sizes:
            T = math.ceil(S / Q_TILE)
            t0 = time.time()
            ref = {t: s for t, (s, _) in probe_seconds(launch, 1, Hq, Hk, S, probe_tiles(T), class_search).items()}
            capped_tiles = {c: probe_tiles(T, tiles_under_cap(S, c)) for c in caps if c < S}
            need = sorted(set().union(*capped_tiles.values()) - (set() if class_search else set(ref)))
            extra = {t: s for t, (s, _) in probe_seconds(launch, 1, Hq, Hk, S, need, False).items()}
            ref_total = causal_makespan(1, Hq, S, ref)
            row = dict(variant=name, S=S, Hq=Hq, Hk=Hk, class_search=class_search, probes_s={str(t): v for t, v in ref.items()},
                       total_s=ref_total, caps=[], wall_s=round(time.time() - t0, 1))
            for c, tiles in capped_tiles.items():
                probed = {t: extra[t] if t in extra else ref[t] for t in tiles}
                total = causal_makespan(1, Hq, S, probed)
                row["caps"].append(dict(cap_keys=c, probed_q_tiles=tiles, total_s=total,
                                        total_diff=total / ref_total - 1,
                                        probe_diff={str(t): q_tile_seconds(probed, t) / v - 1 for t, v in ref.items()}))
            out.append(row)
            _print_validation(row)
    return out


def _print_validation(row: dict) -> None:
    ref = row["probes_s"]
    print(f"{row['variant']} causal h{row['Hq']}/{row['Hk']} S{row['S']} (class search {'on' if row['class_search'] else 'off'}"
          f" in the reference; wall {row['wall_s']:.0f} s): five-probe total {row['total_s'] * 1e6:.2f} us; probes (Q tile: us) "
          + ", ".join(f"{t}: {v * 1e6:.2f}" for t, v in ref.items()))
    for c in row["caps"]:
        print(f"  cap {c['cap_keys']:6} keys (probes {c['probed_q_tiles']}): total {c['total_s'] * 1e6:.2f} us, "
              f"{100 * c['total_diff']:+.3f}%; per probe " + ", ".join(f"{t}: {100 * d:+.3f}%" for t, d in c["probe_diff"].items()),
              flush=True)
