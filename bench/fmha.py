"""FMHA forward benchmark: gfxasm's fmha_fwd_d128 on the issue's shapes.

    python3 bench/fmha.py [--static-only] [--only TEXT] [--no-versus] [--probe-cap-keys N] [--out FILE]
    python3 bench/fmha.py --validate-cap S,S,... [--caps K,K,...] [--variants V,V,...] [--class-search]

Configurations (bf16, head dim 128, Sq = Sk, causal and not): B4 Hq64/Hk8 with
S in {1k, 4k, 8k, 16k}, and B16 H64 (MHA) with S 8192.

Three kinds of numbers, each labelled:

* static (from the built code object, no model): registers, LDS, occupancy, and the
  steady-state KV tile of one wave — the instructions a wave issues in one main-loop
  iteration (one 64-key tile: both DMAs, GEMM1 of the previous tile, the softmax, GEMM0 of
  the next) that needs neither masking nor an O rescale (the common case), found by
  walking the loop from L1_iter back to L1_iter (group 1, waves 0-3; group 2's iteration,
  from L2_iter, differs only in where its barrier and DMA sit) with those branches resolved. MFMA count and MFMA cycles
  (4 x passes) against the issue cycles of everything else (VALU 4, transcendental and
  32-bit integer multiply 16, s_nop N (N+1) x 4, any other instruction one 4-cycle issue
  slot: gfxasm.perf.params). "MFMA share" = MFMA cycles / (MFMA + other) for one wave
  with nothing overlapped; two waves share each SIMD, so the SIMD's MFMA pipe can be
  kept busy only if the other cycles of one wave hide under the MFMAs of the other.
* measured: TFLOP/s from device events, only on a gfx950.
* versus aiter (modelled, non-causal): ours and aiter's fwd_hd128_bf16 (the corpus object,
  launched as bench_conformance does) under every params.BRACKETS variant, and aiter's time
  over ours as a range over them (never one number).
* modelled: gfxasm.perf's MI355X timing model (calibrated on aiter's published FMHA
  numbers). Non-causal: gfxasm.perf.estimate of the launch. Causal: work differs per Q
  tile, so the workgroup of Q tile t is modelled on its own (the same launch, that one
  workgroup sampled) at five t with linear interpolation between, and the grid's
  workgroups are list-scheduled on 256 CUs in dispatch order (one workgroup per CU at a
  time) — the makespan is the kernel time. Where S exceeds the probe cap (PROBE_CAP_KEYS,
  --probe-cap-keys; 16,384 keys), the five t are spread over the Q tiles whose workgroups
  walk at most the cap's keys, and the longer tiles are extrapolated on the line through
  the last two probes: past a few KV tiles a workgroup's time is affine in the tiles it
  visits (its steady-state loop), but for a curvature that fades with length, mostly from
  the probe's own sustained clock (it falls as the workgroup's MFMA-busy share nears the
  loop's). Capped probes skip gfxasm.perf.grid's class search, which on such a grid
  ends in None (the sample scaling) after emulating workgroups as long as the sequence.
  --validate-cap compares the five-probe and capped times, per probe and in total, on
  h6/1 launches (bench/out/fmha_probe_cap.json). Measured at 1d1c5c1: the 16k cap lowers
  the total by 0.011-0.013% at 32k (paged fp8, paged bf16, dense bf16), 0.020-0.022% at
  65k (paged fp8, bf16), 0.031% at 131k (paged fp8; every probe within 0.03%); smaller
  caps err more (4k: 0.03-0.37% at 8k-65k; 1k: up to 2.6%), always low. At 8k the
  class-search skip changed no probe's time (bit for bit) and ran 3.2x faster.

Buffers are torch.empty (untouched pages read as zeros): the model needs addresses and
control flow; zero scores never trigger the rare rescale path, as in the steady state.
FLOP counts are the problem's: 4 B Hq Sq Sk D, causal counting only visible (q, k) pairs.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import heapq
import importlib
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gfxasm import kernarg                                    # noqa: E402
from gfxasm.build import build_manifest                       # noqa: E402
from gfxasm.manifest import default_manifest                  # noqa: E402
from gfxasm.ops import fmha                                   # noqa: E402
from gfxasm.perf import params as P                           # noqa: E402

from bench.common import BenchCase, has_gfx950, measure       # noqa: E402

D = fmha.HEAD_DIM
CONFIGS = [(4, 64, 8, 1024), (4, 64, 8, 4096), (4, 64, 8, 8192), (4, 64, 8, 16384), (16, 64, 64, 8192)]
PUBLISHED = {  # aiter asm fwd v3 on MI355X (issue 5): B4 H64/8 S8192
    (4, 64, 8, 8192, False): (1390, "aiter fmha fwd v3 asm, issue 5"),
    (4, 64, 8, 8192, True): (1278, "aiter fmha fwd v3 asm, issue 5"),
}


# ------------------------------------------------------------------ static facts

def _symbols(co_path: Path) -> dict[str, int]:
    from elftools.elf.elffile import ELFFile
    with open(co_path, "rb") as f:
        elf = ELFFile(f)
        tab = elf.get_section_by_name(".symtab")
        return {s.name: s["st_value"] for s in tab.iter_symbols() if s.name.startswith("L") and s["st_shndx"] != "SHN_ABS"}


def _issue_cycles(inst, klass: str, prm: P.Params) -> int:
    if klass == "valu":
        from gfxasm.perf.model import _IMUL
        return prm.imul_cycles if inst.name in _IMUL else prm.valu_cycles
    if klass == "trans":
        return prm.trans_cycles
    if inst.name == "s_nop":
        return (int(inst.ops[0].text, 0) + 1) * prm.issue_quantum
    return prm.issue_quantum


def steady_tile(co_path: Path, mask: bool = False, rescale: bool = False, group: int = 1) -> dict:
    """Instruction mix and cycles of one wave's main-loop iteration (one KV tile): walk from
    L<group>_iter back to it through the full body of an even tile (both DMAs issued), with
    the mask and lazy-rescale branches taken as asked."""
    import gfxasm.emu as emu
    from gfxasm.perf.stats import classify, mfma_flops, mfma_passes
    prm = P.DEFAULT
    labels = _symbols(co_path)
    names = {pc: name for name, pc in labels.items()}
    kern = emu.load(co_path).kernel()
    insts = kern.program.insts
    by_pc = {i.pc: n for n, i in enumerate(insts)}
    start = labels[f"L{group}_iter"]
    n = by_pc[start]
    counts, cycles = Counter(), Counter()
    mfma = dict(count=0, cycles=0, flops=0)
    steps = 0
    while True:
        inst = insts[n]
        steps += 1
        if steps > 10000:
            raise RuntimeError("steady_tile: no way back to L_iter")
        klass = classify(inst)
        if klass == "mfma":
            mfma["count"] += 1
            mfma["cycles"] += 4 * mfma_passes(inst)
            mfma["flops"] += mfma_flops(inst)
        else:
            counts[klass] += 1
            cycles[klass] += _issue_cycles(inst, klass, prm)
        if klass == "branch":
            dest = _branch_dest(inst)
            target = names.get(dest, "")
            if dest == start:
                break
            if inst.name == "s_branch":
                taken = True
            elif target.startswith("L_mask_"):
                taken = mask
            elif target.startswith(("L_prep_", "L_orescale_")):
                taken = rescale
            else:                       # DMA skips, dispatch to other bodies, loop exit: not taken
                taken = False
            if taken:
                n = by_pc[dest]
                continue
        n += 1
    other = sum(cycles.values())
    return dict(mfma=mfma["count"], mfma_cycles=mfma["cycles"], mfma_flops=mfma["flops"],
                other_instructions=dict(counts), other_cycles_by_class=dict(cycles), other_cycles=other,
                mfma_share=mfma["cycles"] / (mfma["cycles"] + other))


def _branch_dest(inst) -> int:
    """Target pc of a SOPP branch: pc + 4 + 4 * simm16."""
    simm = inst.words[0] & 0xFFFF
    simm = simm - 0x10000 if simm & 0x8000 else simm
    return inst.pc + 4 + 4 * simm


def static_facts(variant_name: str) -> dict:
    from gfxasm.perf import analyze
    variant = default_manifest().kernel(fmha.KERNEL).variant(variant_name)
    st = analyze(str(variant.co_path))
    regs, occ = st.registers, st.occupancy
    return dict(
        variant=variant_name, vgprs=regs.vgpr_count, agprs=regs.agpr_count, sgprs=regs.sgpr_count,
        lds_bytes=st.lds_bytes, workgroups_per_cu=occ.workgroups_per_cu, waves_per_simd=occ.waves_per_simd,
        occupancy_limited_by=occ.limited_by,
        steady_tile=steady_tile(variant.co_path),
        steady_tile_group2=steady_tile(variant.co_path, group=2),
        masked_tile=steady_tile(variant.co_path, mask=True),
        rescale_tile=steady_tile(variant.co_path, rescale=True),
    )


# ------------------------------------------------------------------ launches

def _launch_parts(B, Hq, Hk, Sq, Sk, causal):
    q = torch.empty(B, Sq, Hq, D, dtype=torch.bfloat16)
    k = torch.empty(B, Sk, Hk, D, dtype=torch.bfloat16)
    v = torch.empty(B, Sk, Hk, D, dtype=torch.bfloat16)
    o = torch.empty(B, Sq, Hq, D, dtype=torch.bfloat16)
    lse = torch.empty(B, Hq, Sq, dtype=torch.float32)
    args = fmha.kernel_args(q, k, v, o, lse, 1.0 / math.sqrt(D))
    variant = default_manifest().kernel(fmha.KERNEL).variant(fmha.variant_name(torch.bfloat16, causal))
    values = {a.name: args[a.name].data_ptr() if a.type.is_pointer else args[a.name] for a in variant.args}
    raw = kernarg.pack(variant.args, variant.kernarg_size, values)
    grid = (math.ceil(Sq / fmha.Q_TILE), Hq, B)
    return variant, grid, raw, [args[a.name] for a in variant.args if a.type.is_pointer]


def flops(B, Hq, S, causal) -> float:
    pairs = S * (S + 1) / 2 if causal else S * S
    return 4.0 * B * Hq * pairs * D


def bench_case(B, Hq, Hk, S, causal) -> BenchCase:
    variant, grid, raw, buffers = _launch_parts(B, Hq, Hk, S, S, causal)
    nbytes = sum(t.numel() * t.element_size() for t in buffers)
    pub = PUBLISHED.get((B, Hq, Hk, S, causal))
    return BenchCase(f"fmha_fwd_d128 bf16{' causal' if causal else ''} B{B} H{Hq}/{Hk} S{S}", "fmha fwd bf16 d128",
                     str(variant.co_path), variant.kernel.symbol, grid, (512, 1, 1), raw, buffers,
                     flops(B, Hq, S, causal), nbytes, "bf16", pub[0] if pub else None, pub[1] if pub else "")


def cases(full: bool = True) -> list[BenchCase]:
    """For `gfxasm bench` (bench.common.run). Its modelled figures sample one round of CU 0,
    which for causal launches is the longest Q tile: main() models causal properly."""
    configs = CONFIGS if full else [(1, 4, 1, 1024)]
    return [bench_case(*c, causal) for c in configs for causal in (False, True)]


def _estimate(B, Hq, Hk, Sq, Sk, causal, workgroup=None, class_search=True):
    """gfxasm.perf.estimate of the launch; with `workgroup` (x, y, z), that one workgroup is
    the sample instead of the ones compute unit 0 would run (same grid and buffers, so the
    cache/DRAM accounting is the whole problem's). class_search=False: gfxasm.perf.grid's
    probing for workgroup classes is skipped (as if it found none: the sample scaling)."""
    from gfxasm.perf import estimate
    from gfxasm.perf import estimator as est_module
    variant, grid, raw, buffers = _launch_parts(B, Hq, Hk, Sq, Sk, causal)
    chooser, finder = est_module.representative_workgroups, est_module.grid_mod.find_classes
    if workgroup is not None:
        est_module.representative_workgroups = lambda grid, per_cu, rounds: [tuple(workgroup)]
    if not class_search:
        est_module.grid_mod.find_classes = lambda *args: None
    try:
        return estimate(str(variant.co_path), grid, (512, 1, 1), raw, buffers, variant.kernel.symbol)
    finally:
        est_module.representative_workgroups, est_module.grid_mod.find_classes = chooser, finder


# Longest KV length (keys) a causal probe workgroup walks in the emulator by default; Q tiles
# past it are extrapolated (probe_tiles, q_tile_seconds); None: no cap. Validated with --validate-cap
# (module docstring); rows of S <= 16384 (all of bench/out/fmha.json's) are not capped.
PROBE_CAP_KEYS = 16384


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


def _cap_tiles(S: int, cap_keys: int | None) -> int | None:
    """Q tiles under the cap (None: no cap applies, every probe is modelled)."""
    if cap_keys is None or S <= cap_keys:
        return None
    if cap_keys < 4 * fmha.Q_TILE:
        raise ValueError(f"cap_keys must be at least {4 * fmha.Q_TILE} (four Q tiles), got {cap_keys}")
    return cap_keys // fmha.Q_TILE


def _probe_seconds(B, Hq, Hk, S, tiles: list[int], class_search: bool = True) -> dict[int, tuple[float, float]]:
    """Q tile -> (seconds, clock_hz) of its workgroup, each probe modelled in the whole launch
    (its cycles at the sustained clock its own activity gives). Workgroup x runs Q tile
    T-1-x (longest first)."""
    T = math.ceil(S / fmha.Q_TILE)
    out = {}
    for t in tiles:
        e = _estimate(B, Hq, Hk, S, S, True, workgroup=(T - 1 - t, 0, 0), class_search=class_search)
        out[t] = (e.cycles_per_round / e.clock_hz, e.clock_hz)
    return out


def causal_makespan(B, Hq, S, probed: dict[int, float]) -> float:
    """Seconds from the first dispatch to the last workgroup's end: per-workgroup seconds
    (q_tile_seconds) list-scheduled on the CUs in dispatch order (x fastest, one workgroup
    per CU at a time)."""
    tiles = math.ceil(S / fmha.Q_TILE)
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


def modelled_seconds(B, Hq, Hk, S, causal, cap_keys: int | None = PROBE_CAP_KEYS) -> tuple[float, dict]:
    """Modelled seconds of the launch and its detail. Causal: the workgroups of the Q tiles of
    probe_tiles modelled, the others interpolated (q_tile_seconds), list-scheduled. Where S
    exceeds `cap_keys` (None: never), only Q tiles whose workgroups walk at most cap_keys keys
    are probed and the longer ones extrapolated; those probes skip gfxasm.perf.grid's class
    search, which in such a grid (every Q tile's work differs) ends in None, the sample
    scaling (--validate-cap checks both)."""
    if not causal:
        est = _estimate(B, Hq, Hk, S, S, False)
        return est.seconds, dict(cycles_per_workgroup=est.cycles_per_round, rounds=est.rounds,
                                 mfma_pipe_busy=est.mfma_utilization, clock_hz=est.clock_hz)
    tiles = math.ceil(S / fmha.Q_TILE)
    cap = _cap_tiles(S, cap_keys)
    probes = _probe_seconds(B, Hq, Hk, S, probe_tiles(tiles, cap), class_search=cap is None)
    measured = {t: s for t, (s, _) in probes.items()}
    end = causal_makespan(B, Hq, S, measured)
    return end + P.DEFAULT.launch_overhead_us * 1e-6, dict(
        seconds_per_q_tile={str(t): s for t, s in measured.items()}, makespan_s=end,
        clock_hz={str(t): c for t, (_, c) in probes.items()},
        probe_cap_keys=cap_keys, extrapolated_past_q_tile=None if cap is None else cap - 1)


def versus_aiter(B, Hq, Hk, S) -> dict:
    """Ours and aiter's fwd_hd128_bf16 (non-causal, launched as bench_conformance does),
    both modelled under every params.BRACKETS variant: per bracket the two times and aiter's
    time over ours (our speed-up), and the range of that ratio over the brackets."""
    from bench.bench_conformance import fmha_case as aiter_case
    from gfxasm.perf import estimate
    variant, grid, raw, buffers = _launch_parts(B, Hq, Hk, S, S, False)
    theirs = aiter_case(B, Hq, Hk, S)
    per = {}
    for name, changes in P.BRACKETS.items():
        prm = dataclasses.replace(P.DEFAULT, **changes)
        ours = estimate(str(variant.co_path), grid, (512, 1, 1), raw, buffers, variant.kernel.symbol, params=prm)
        aiter = estimate(theirs.co, theirs.grid, theirs.block, theirs.kernarg, theirs.buffers, theirs.kernel,
                         params=prm)
        per[name] = dict(ours_s=ours.seconds, aiter_s=aiter.seconds, speedup=aiter.seconds / ours.seconds)
    ratios = [v["speedup"] for v in per.values()]
    return dict(brackets=per, speedup_min=min(ratios), speedup_max=max(ratios))


# ------------------------------------------------------------------ probe cap validation

def _variant_context(name: str):
    """The launch a validation variant models: dense bf16 fmha_fwd, or bench/prefill.py's
    paged batch_prefill (page 1, SGLang table) in fp8 (per-tensor), fp8-blk (KV block
    scales, page 1024) or bf16."""
    if name == "dense-bf16":
        return contextlib.nullcontext()
    from bench import prefill
    from gfxasm.ops import batch_prefill as bp
    dtype = {"paged-fp8": bp.FP8, "paged-fp8-blk": bp.FP8, "paged-bf16": torch.bfloat16}[name]
    return prefill._paged(dtype, block_scales=name == "paged-fp8-blk")


def validate_cap(variants, sizes, caps, heads=(6, 1), class_search=False) -> list[dict]:
    """Causal B1 launches: the five-probe time (class search as `class_search`) against the
    capped time for each cap below S (probes without class search), per probe (the probed
    Q tile's seconds against the capped interpolation or extrapolation there) and in total."""
    this = importlib.import_module("bench.fmha")      # the module bench/prefill.py patches (not __main__)
    Hq, Hk = heads
    out = []
    for name in variants:
        for S in sizes:
            T = math.ceil(S / fmha.Q_TILE)
            t0 = time.time()
            with _variant_context(name):
                ref = {t: s for t, (s, _) in this._probe_seconds(1, Hq, Hk, S, probe_tiles(T), class_search).items()}
                capped_tiles = {c: probe_tiles(T, _cap_tiles(S, c)) for c in caps if c < S}
                need = sorted(set().union(*capped_tiles.values()) - (set() if class_search else set(ref)))
                extra = {t: s for t, (s, _) in this._probe_seconds(1, Hq, Hk, S, need, False).items()}
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


# ------------------------------------------------------------------ main

def _static_table(facts: list[dict]) -> str:
    lines = [f"{'variant':28} {'VGPR':>4} {'SGPR':>4} {'LDS KiB':>7} {'WG/CU':>5} {'waves/SIMD':>10}  "
             f"{'tile':9} {'MFMA':>4} {'MFMA cyc':>8} {'other cyc':>9} {'MFMA share':>10}"]
    lines.append("-" * len(lines[0]))
    for f in facts:
        for kind in ("steady_tile", "masked_tile", "rescale_tile"):
            t = f[kind]
            head = (f"{f['variant']:28} {f['vgprs']:4} {f['sgprs']:4} {f['lds_bytes'] / 1024:7.0f} "
                    f"{f['workgroups_per_cu']:5} {f['waves_per_simd']:10}" if kind == "steady_tile" else " " * 64)
            lines.append(f"{head}  {kind.split('_')[0]:9} {t['mfma']:4} {t['mfma_cycles']:8} {t['other_cycles']:9} "
                         f"{100 * t['mfma_share']:9.1f}%")
    t = facts[0]["steady_tile"]
    mix = ", ".join(f"{k} {v}" for k, v in sorted(t["other_instructions"].items()))
    lines.append(f"steady tile, other instructions per wave: {mix}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--static-only", action="store_true", help="only the static facts (seconds, no timing)")
    ap.add_argument("--only", help="only configurations whose label contains this text")
    ap.add_argument("--out", help="JSON path (default bench/out/fmha.json; --validate-cap: bench/out/fmha_probe_cap.json)")
    ap.add_argument("--no-versus", action="store_true", help="leave out the modelled side by side with aiter")
    ap.add_argument("--probe-cap-keys", type=int, default=PROBE_CAP_KEYS,
                    help="causal: probe only workgroups walking at most this many keys, extrapolate the rest (0: no cap)")
    ap.add_argument("--validate-cap", metavar="S,S,...",
                    help="instead of the table: causal h6/1 five-probe vs capped times at these S (--caps, --variants)")
    ap.add_argument("--caps", default="2048,4096,8192,16384", help="--validate-cap: caps in keys")
    ap.add_argument("--variants", default="paged-fp8,paged-bf16",
                    help="--validate-cap: of dense-bf16, paged-fp8, paged-fp8-blk, paged-bf16")
    ap.add_argument("--class-search", action="store_true",
                    help="--validate-cap: the five-probe reference with gfxasm.perf.grid's class search (today's default)")
    args = ap.parse_args(argv)
    build_manifest(default_manifest())
    cap = args.probe_cap_keys or None
    if args.validate_cap:
        rows = validate_cap(args.variants.split(","), [int(v) for v in args.validate_cap.split(",")],
                            [int(v) for v in args.caps.split(",")], class_search=args.class_search)
        out = Path(args.out or REPO / "bench" / "out" / "fmha_probe_cap.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(dict(probe_cap_validation=rows), indent=1))
        print(f"wrote {out}")
        return 0

    facts = [static_facts(fmha.variant_name(torch.bfloat16, c)) for c in (False, True)]
    print("static facts (per wave, one 64-key tile; cycles at 4/VALU, 16/transcendental, MFMA 4 x passes)")
    print(_static_table(facts))
    print()
    rows, versus = [], []
    device = has_gfx950()
    if not args.static_only:
        head = f"{'configuration':42} {'source':9} {'time':>10} {'TFLOP/s':>8} {'%peak':>6}  published"
        print(head)
        print("-" * len(head))
        for B, Hq, Hk, S in CONFIGS:
            for causal in (False, True):
                case = bench_case(B, Hq, Hk, S, causal)
                if args.only and args.only not in case.label:
                    continue
                t0 = time.time()
                if device:
                    seconds, detail, source = measure(case), {}, "measured"
                else:
                    seconds, detail = modelled_seconds(B, Hq, Hk, S, causal, cap)
                    source = "modelled"
                tflops = case.flops / seconds / 1e12
                row = dict(label=case.label, B=B, Hq=Hq, Hk=Hk, S=S, causal=causal, source=source, seconds=seconds,
                           flops=case.flops, tflops=tflops, pct_peak=100 * tflops * 1e12 / P.PEAK_FLOPS["bf16"],
                           published_tflops=case.published_tflops, published_source=case.published_source,
                           detail=detail, wall_s=round(time.time() - t0, 1))
                rows.append(row)
                pub = f"{case.published_tflops:.0f} ({case.published_source})" if case.published_tflops else ""
                print(f"{case.label:42} {source:9} {seconds * 1e3:8.3f}ms {tflops:8.0f} {row['pct_peak']:6.1f}  {pub}",
                      flush=True)
        if any(r["source"] == "modelled" for r in rows):
            print("modelled = gfxasm.perf MI355X timing model (no gfx950 here); not a measurement; causal probe cap "
                  + (f"{cap} keys (Q tiles walking more are extrapolated)" if cap else "none"))
        if not device and not args.no_versus:
            print("\nours vs aiter fwd_hd128_bf16 (non-causal), modelled under every params.BRACKETS variant:")
            print(f"{'configuration':24} {'ours us':>16} {'aiter us':>16} {'aiter / ours':>14}")
            for B, Hq, Hk, S in CONFIGS:
                label = f"B{B} H{Hq}/{Hk} S{S}"
                if args.only and args.only not in label:
                    continue
                v = versus_aiter(B, Hq, Hk, S)
                ours = [b["ours_s"] * 1e6 for b in v["brackets"].values()]
                theirs = [b["aiter_s"] * 1e6 for b in v["brackets"].values()]
                print(f"{label:24} {min(ours):7.0f}-{max(ours):<8.0f} {min(theirs):7.0f}-{max(theirs):<8.0f} "
                      f"{v['speedup_min']:6.2f}-{v['speedup_max']:<6.2f}", flush=True)
                versus.append(dict(label=label, **v))
    out = Path(args.out or REPO / "bench" / "out" / "fmha.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(static=facts, probe_cap_keys=cap, runs=rows, versus_aiter=versus), indent=1,
                              default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
