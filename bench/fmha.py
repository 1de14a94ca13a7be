"""FMHA forward benchmark: gfxasm's fmha_fwd_d128 on the issue's shapes.

    python3 bench/fmha.py [--static-only] [--only TEXT] [--no-versus] [--probe-cap-keys N] [--out FILE]
    python3 bench/fmha.py --validate-cap S,S,... [--caps K,K,...] [--variants V,V,...] [--class-search]
    python3 bench/fmha.py --d64 [--out FILE]
    python3 bench/fmha.py --features [--out FILE]

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
  numbers), as bench/causal_model.py models a launch: non-causal, gfxasm.perf.estimate of it;
  causal, five Q tiles' workgroups probed, the others interpolated (or, past the probe cap
  of --probe-cap-keys, extrapolated) and list-scheduled on 256 CUs. --validate-cap compares
  the five-probe and capped times, per probe and in total, on h6/1 launches of this kernel
  and of bench/prefill.py's paged one (bench/out/fmha_probe_cap.json; findings in
  bench/causal_model.py's docstring).

Buffers are torch.empty (untouched pages read as zeros): the model needs addresses and
control flow; zero scores never trigger the rare rescale path, as in the steady state.
FLOP counts are the problem's: 4 B Hq Sq Sk D, causal counting only visible (q, k) pairs.

--d64: head dim 64 (fmha_fwd_d64), modelled under each params.CORNERS entry: bf16 causal
B1 Hq64/Hkv8 S8192 (TFLOP/s of visible pairs), and the gpt-oss-shaped prefill there (window
128, causal, sinks): its time against its visible-pair FLOPs at the causal d64 rate, two
floors of that ratio (32 x 32 MFMA tiles computed at the causal rate; the HBM traffic at
the model's sustainable rate) and one middle workgroup's cycles up to barrier 0, in the KV
loop and after it (bench/out/fmha_d64.json; docs/fmha_fwd_d128.md reads them).

--features: issue 22's feature cost, bf16 d128 B4 Hq64/Hkv8 S8192, non-causal and causal,
with no option, with sinks and with softcap 30, modelled under each params.CORNERS entry:
times, each feature's time over the plain kernel's (default corner, and the range over the
corners), and the least time per KV tile any schedule of each object's steady tile could
reach on that corner's ruler (vector_floor: the SIMD's two waves' VALU, transcendental and
MFMA-hold cycles against its matrix pipe, at the clock law's clock), as a ratio to the
plain kernel's
(bench/out/fmha_features.json; docs/fmha_fwd_d128.md's soft-capping section reads them).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import time
from collections import Counter
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gfxasm.build import build_manifest                       # noqa: E402
from gfxasm.gridexpr import cdiv                              # noqa: E402
from gfxasm.manifest import default_manifest                  # noqa: E402
from gfxasm.ops import batch_prefill as bp                    # noqa: E402
from gfxasm.ops import fmha                                   # noqa: E402
from gfxasm.perf import params as P                           # noqa: E402

from bench import attention_launches as launches             # noqa: E402
from bench import causal_model                                # noqa: E402
from bench.common import BenchCase, has_gfx950, measure       # noqa: E402

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


def steady_tile(co_path: Path, mask: bool = False, rescale: bool = False, group: int = 1,
                params: P.Params | None = None) -> dict:
    """Instruction mix and cycles of one wave's main-loop iteration (one KV tile): walk from
    L<group>_iter back to it through the full body of an even tile (both DMAs issued), with
    the mask and lazy-rescale branches taken as asked. Issue cycles and the MFMAs' operand-read
    holds (mfma_hold_cycles: the cycles after each MFMA issue no VALU may issue, its own slot
    included) under `params` (default params.DEFAULT)."""
    import gfxasm.emu as emu
    from gfxasm.perf.model import mfma_holds
    from gfxasm.perf.stats import classify, mfma_flops, mfma_passes
    prm = params or P.DEFAULT
    labels = _symbols(co_path)
    names = {pc: name for name, pc in labels.items()}
    kern = emu.load(co_path).kernel()
    insts = kern.program.insts
    by_pc = {i.pc: n for n, i in enumerate(insts)}
    start = labels[f"L{group}_iter"]
    n = by_pc[start]
    counts, cycles = Counter(), Counter()
    mfma = dict(count=0, cycles=0, flops=0, hold=0)
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
            mfma["hold"] += mfma_holds(inst, mfma_passes(inst), prm)[0]
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
    return dict(mfma=mfma["count"], mfma_cycles=mfma["cycles"], mfma_flops=mfma["flops"], mfma_hold_cycles=mfma["hold"],
                other_instructions=dict(counts), other_cycles_by_class=dict(cycles), other_cycles=other,
                mfma_share=mfma["cycles"] / (mfma["cycles"] + other))


def _branch_dest(inst) -> int:
    """Target pc of a SOPP branch: pc + 4 + 4 * simm16."""
    simm = inst.words[0] & 0xFFFF
    simm = simm - 0x10000 if simm & 0x8000 else simm
    return inst.pc + 4 + 4 * simm


def static_facts(variant) -> dict:
    from gfxasm.perf import analyze
    st = analyze(str(variant.co_path))
    regs, occ = st.registers, st.occupancy
    return dict(
        variant=variant.name, vgprs=regs.vgpr_count, agprs=regs.agpr_count, sgprs=regs.sgpr_count,
        lds_bytes=st.lds_bytes, workgroups_per_cu=occ.workgroups_per_cu, waves_per_simd=occ.waves_per_simd,
        occupancy_limited_by=occ.limited_by,
        steady_tile=steady_tile(variant.co_path),
        steady_tile_group2=steady_tile(variant.co_path, group=2),
        masked_tile=steady_tile(variant.co_path, mask=True),
        rescale_tile=steady_tile(variant.co_path, rescale=True),
    )


# ------------------------------------------------------------------ launches

def bench_case(B, Hq, Hk, S, causal) -> BenchCase:
    variant, grid, raw, buffers = launches.dense_parts(B, Hq, Hk, S, S, causal)
    nbytes = sum(t.numel() * t.element_size() for t in buffers)
    pub = PUBLISHED.get((B, Hq, Hk, S, causal))
    return BenchCase(f"fmha_fwd_d128 bf16{' causal' if causal else ''} B{B} H{Hq}/{Hk} S{S}", "fmha fwd bf16 d128",
                     str(variant.co_path), variant.kernel.symbol, grid, launches.BLOCK, raw, buffers,
                     launches.flops(B, Hq, S, causal), nbytes, "bf16", pub[0] if pub else None, pub[1] if pub else "")


def cases(full: bool = True) -> list[BenchCase]:
    """For `gfxasm bench` (bench.common.run). Its modelled figures sample one round of CU 0,
    which for causal launches is the longest Q tile: main() models causal properly."""
    configs = CONFIGS if full else [(1, 4, 1, 1024)]
    return [bench_case(*c, causal) for c in configs for causal in (False, True)]


def versus_aiter(B, Hq, Hk, S) -> dict:
    """Ours and aiter's fwd_hd128_bf16 (non-causal, launched as bench_conformance does),
    both modelled under every params.BRACKETS variant: per bracket the two times and aiter's
    time over ours (our speed-up), and the range of that ratio over the brackets."""
    from bench.bench_conformance import fmha_case as aiter_case
    from gfxasm.perf import estimate
    variant, grid, raw, buffers = launches.dense_parts(B, Hq, Hk, S, S, False)
    theirs = aiter_case(B, Hq, Hk, S)
    per = {}
    for name, changes in P.BRACKETS.items():
        prm = dataclasses.replace(P.DEFAULT, **changes)
        ours = estimate(str(variant.co_path), grid, launches.BLOCK, raw, buffers, variant.kernel.symbol, params=prm)
        aiter = estimate(theirs.co, theirs.grid, theirs.block, theirs.kernarg, theirs.buffers, theirs.kernel,
                         params=prm)
        per[name] = dict(ours_s=ours.seconds, aiter_s=aiter.seconds, speedup=aiter.seconds / ours.seconds)
    ratios = [v["speedup"] for v in per.values()]
    return dict(brackets=per, speedup_min=min(ratios), speedup_max=max(ratios))


# --validate-cap: the launches by name (dense bf16 fmha_fwd, or bench/prefill.py's paged
# batch_prefill, page 1 through an SGLang table, in fp8 (per-tensor), fp8-blk (KV block
# scales, page 1024) or bf16)
VALIDATION_LAUNCHES = {"dense-bf16": launches.DENSE_BF16, "paged-fp8": launches.paged(bp.FP8),
                       "paged-fp8-blk": launches.paged(bp.FP8, block_scales=True),
                       "paged-bf16": launches.paged(torch.bfloat16)}


# ------------------------------------------------------------------ head dim 64 (--d64)

D64_SHAPE = (1, 64, 8, 8192)            # B, Hq, Hk, S: the issue's d64 target shape
GPT_OSS_WINDOW = (128, 0)               # gpt-oss's sliding layers (causal, with sinks)


def visible_pairs(S: int, left: int) -> int:
    """(q, k) pairs a causal Sq = Sk = S problem sees with window (left, 0); left < 0: unbounded."""
    if left < 0:
        return S * (S + 1) // 2
    return sum(min(i, left) + 1 for i in range(S))


def block_tiling_pairs(S: int, left: int, block: int = 32) -> int:
    """(q, k) pairs computed by the least tiling of a causal Sq = Sk = S problem with window
    (left, 0) into block x block MFMA tiles (rows and keys aligned to `block`): every tile that
    holds a visible pair, and nothing else."""
    pairs = 0
    for first in range(0, S, block):
        last = min(first + block, S) - 1
        lo = max(0, first - left) // block * block          # the first row's first visible key
        pairs += (last - first + 1) * (min(last // block * block + block, S) - lo)
    return pairs


def gpt_oss_floors(prm) -> dict:
    """Two lower bounds of the gpt-oss-shaped prefill's time, in seconds: its visible pairs
    computed in 32 x 32 MFMA tiles at the causal rate (the tile granularity), and its HBM
    traffic (q, k, v read once, o and lse written once) at the model's sustainable rate
    (params.HBM_BYTES_PER_S x hbm_efficiency)."""
    B, Hq, Hk, S = D64_SHAPE
    left = GPT_OSS_WINDOW[0]
    hbm = (2 * B * S * (Hq + Hk) * 64 * 2 + B * Hq * S * 4) / (P.HBM_BYTES_PER_S * prm.hbm_efficiency)
    return dict(tiling_over_visible=block_tiling_pairs(S, left) / visible_pairs(S, left), hbm_s=hbm)


def window_phases(launch, B, Hq, Hk, S, q_tile: int, params=None) -> dict:
    """Where one causal workgroup's modelled time goes (Q tile q_tile of the launch): cycles up to
    barrier 0's release (kernarg, addresses, Q and the first K tiles loaded), from there to the
    last barrier's release (the KV loop), and after it (epilogue, stores draining), with the
    matrix pipes' busy share; barrier releases are the last wave's arrival (gfxasm.perf.model's
    issue times, recorded in the sustained-clock pass)."""
    from gfxasm.perf import model
    arrivals, issue = {}, model.Cu.issue

    def record(cu, wave, t):
        if cu.st[wave.head].klass == "barrier":
            arrivals.setdefault(cu, {}).setdefault(wave, []).append(t)
        return issue(cu, wave, t)
    model.Cu.issue = record
    try:
        T = cdiv(S, launches.Q_TILE)
        e = causal_model.estimate(launch, B, Hq, Hk, S, S, True, workgroup=(T - 1 - q_tile, 0, 0), class_search=False,
                                  params=params)
    finally:
        model.Cu.issue = issue
    waves = list(list(arrivals.values())[-1].values())          # the last CU pass: the sustained clock
    releases = [max(w[b] for w in waves) for b in range(min(len(w) for w in waves))]
    total = e.cycles_per_round
    return dict(cycles=total, clock_hz=e.clock_hz, prologue=releases[0], loop=releases[-1] - releases[0],
                tail=total - releases[-1], barriers=len(releases), mfma_busy=e.mfma_utilization)


def d64_figures(cap: int | None) -> list[dict]:
    """Per params.CORNERS entry: the d64 causal rate at D64_SHAPE and the gpt-oss-shaped
    prefill's time over its visible-pair FLOPs at that rate."""
    B, Hq, Hk, S = D64_SHAPE
    dense = launches.Launch(functools.partial(launches.dense_parts, head_dim=64))
    oss = launches.Launch(functools.partial(launches.dense_parts, head_dim=64, window=GPT_OSS_WINDOW, sinks=True))
    rows = []
    for corner, changes in P.CORNERS.items():
        prm = dataclasses.replace(P.DEFAULT, **changes)
        causal_s, _ = causal_model.modelled_seconds(dense, B, Hq, Hk, S, True, cap, params=prm)
        rate = 4.0 * B * Hq * visible_pairs(S, -1) * 64 / causal_s
        oss_s, _ = causal_model.modelled_seconds(oss, B, Hq, Hk, S, True, cap, params=prm)
        oss_flops = 4.0 * B * Hq * visible_pairs(S, GPT_OSS_WINDOW[0]) * 64
        floors = gpt_oss_floors(prm)
        visible_s = oss_flops / rate
        rows.append(dict(corner=corner, causal_s=causal_s, causal_tflops=rate / 1e12, gpt_oss_s=oss_s,
                         gpt_oss_tflops=oss_flops / oss_s / 1e12, gpt_oss_over_visible=oss_s / visible_s,
                         tiling_floor_over_visible=floors["tiling_over_visible"],
                         hbm_floor_over_visible=floors["hbm_s"] / visible_s,
                         gpt_oss_phases=window_phases(oss, B, Hq, Hk, S, S // launches.Q_TILE // 2, params=prm)))
        print(f"{corner:12} causal {causal_s * 1e6:8.1f} us {rate / 1e12:6.0f} TFLOP/s   gpt-oss (window 128 + sinks) "
              f"{oss_s * 1e6:7.1f} us {oss_flops / oss_s / 1e12:5.0f} TFLOP/s = {rows[-1]['gpt_oss_over_visible']:.2f}x "
              f"its visible FLOPs at the causal rate", flush=True)
        ph = rows[-1]["gpt_oss_phases"]
        print(f"{'':12} floors over that visible time: 32 x 32 MFMA tiles {floors['tiling_over_visible']:.3f}x, "
              f"HBM traffic {rows[-1]['hbm_floor_over_visible']:.3f}x; one middle workgroup {ph['cycles']:.0f} cycles: "
              f"to barrier 0 {ph['prologue']:.0f}, KV loop {ph['loop']:.0f} ({ph['barriers'] - 1} barriers), after it "
              f"{ph['tail']:.0f}; MFMA busy {100 * ph['mfma_busy']:.1f}%", flush=True)
    return rows


# ------------------------------------------------------------------ features (--features)

FEATURES_SHAPE = (4, 64, 8, 8192)       # B, Hq, Hk, S: issue 22's "sinks or softcap cost <= 5%" shape
SOFTCAP = 30.0
FEATURES = {"none": {}, "sinks": dict(sinks=True), f"softcap {SOFTCAP:g}": dict(softcap=SOFTCAP)}


def vector_floor(co_path: Path, prm: P.Params) -> dict:
    """Least time per KV tile of the SIMD's two waves (waves w and w + 4, both running the
    steady tile of `co_path`) on `prm`'s ruler, whatever the schedule: in cycles, the larger
    of the matrix pipe's MFMA cycles and the vector ALU's VALU and transcendental cycles plus
    the cycles each MFMA keeps it from issuing (its issue slot and, with the hold on the whole
    SIMD, the operand-read hold); in seconds, those cycles at the clock the model's DVFS law
    (params.sustained_clock) gives at that steady state's busy shares. gfxasm.perf's pipes and
    rules only: no memory wait, no barrier, packed FP32 counted as plain VALU (its 44-clk
    distance from the last MFMA assumed filled with other VALU work)."""
    tile = steady_tile(co_path, params=prm)
    alu = 2 * (tile["other_cycles_by_class"].get("valu", 0) + tile["other_cycles_by_class"].get("trans", 0))
    blocked = tile["mfma_hold_cycles"] if prm.mfma_hold_scope == "simd" else tile["mfma"] * prm.issue_quantum
    mfma_pipe, vector_side = 2 * tile["mfma_cycles"], alu + 2 * blocked
    cycles = max(mfma_pipe, vector_side)
    clock = prm.sustained_clock(mfma_pipe / cycles, alu / cycles)
    return dict(mfma_pipe=mfma_pipe, vector_side=vector_side, cycles=cycles, clock_hz=clock, seconds=cycles / clock,
                valu=tile["other_instructions"].get("valu", 0), trans=tile["other_instructions"].get("trans", 0))


def features_figures(cap: int | None) -> list[dict]:
    """Per causal/non-causal and params.CORNERS entry: FEATURES_SHAPE bf16 d128 with each of
    FEATURES, modelled (causal_model.modelled_seconds), each feature's time over the plain
    kernel's, and vector_floor's least steady-state time per tile for the same objects over
    the plain kernel's (the least cost any schedule of that instruction mix could reach on
    the ruler, to first order: prologue, epilogue and causal tails left out)."""
    B, Hq, Hk, S = FEATURES_SHAPE
    rows = []
    for causal in (False, True):
        for corner, changes in P.CORNERS.items():
            prm = dataclasses.replace(P.DEFAULT, **changes)
            times, floors = {}, {}
            for name, options in FEATURES.items():
                launch = launches.Launch(functools.partial(launches.dense_parts, **options))
                times[name], _ = causal_model.modelled_seconds(launch, B, Hq, Hk, S, causal, cap, params=prm)
                floors[name] = vector_floor(launch.parts(1, 1, 1, 64, 64, causal)[0].co_path, prm)
            flops = launches.flops(B, Hq, S, causal)
            row = dict(causal=causal, corner=corner, features={
                name: dict(seconds=t, tflops=flops / t / 1e12, time_over_plain=t / times["none"],
                           floor=floors[name], floor_over_plain=floors[name]["seconds"] / floors["none"]["seconds"])
                for name, t in times.items()})
            rows.append(row)
            print(f"{'causal' if causal else 'non-causal':10} {corner:11} " + "   ".join(
                f"{name} {f['seconds'] * 1e6:7.0f} us {f['tflops']:5.0f} TFLOP/s x{f['time_over_plain']:.3f} "
                f"(floor x{f['floor_over_plain']:.3f})" for name, f in row["features"].items()), flush=True)
    return rows


def _features_ranges(rows: list[dict]) -> None:
    """Each feature's time over the plain kernel's at the default corner, and its range over
    the corners, per causal/non-causal."""
    for causal in (False, True):
        mine = [r for r in rows if r["causal"] == causal]
        for name in FEATURES:
            ratios = [r["features"][name]["time_over_plain"] for r in mine]
            floors = [r["features"][name]["floor_over_plain"] for r in mine]
            default = next(r for r in mine if r["corner"] == "default")["features"][name]
            print(f"{'causal' if causal else 'non-causal':10} {name:12} time x{default['time_over_plain']:.3f} "
                  f"({min(ratios):.3f}-{max(ratios):.3f} over the corners), {default['tflops']:.0f} TFLOP/s; "
                  f"least time per tile x{default['floor_over_plain']:.3f} ({min(floors):.3f}-{max(floors):.3f})")


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
    ap.add_argument("--probe-cap-keys", type=int, default=causal_model.PROBE_CAP_KEYS,
                    help="causal: probe only workgroups walking at most this many keys, extrapolate the rest (0: no cap)")
    ap.add_argument("--validate-cap", metavar="S,S,...",
                    help="instead of the table: causal h6/1 five-probe vs capped times at these S (--caps, --variants)")
    ap.add_argument("--caps", default="2048,4096,8192,16384", help="--validate-cap: caps in keys")
    ap.add_argument("--variants", default="paged-fp8,paged-bf16",
                    help="--validate-cap: of dense-bf16, paged-fp8, paged-fp8-blk, paged-bf16")
    ap.add_argument("--d64", action="store_true", help="head dim 64 figures (module docstring)")
    ap.add_argument("--features", action="store_true", help="sinks and softcap against the plain kernel (docstring)")
    ap.add_argument("--class-search", action="store_true",
                    help="--validate-cap: the five-probe reference with gfxasm.perf.grid's class search (today's default)")
    args = ap.parse_args(argv)
    build_manifest(default_manifest())
    cap = args.probe_cap_keys or None
    if args.d64:
        print(f"fmha_fwd_d64 bf16, B{D64_SHAPE[0]} Hq{D64_SHAPE[1]}/Hk{D64_SHAPE[2]} S{D64_SHAPE[3]}, gfxasm.perf "
              f"(modelled, no gfx950 here), per params.CORNERS entry:")
        rows = d64_figures(cap)
        _write_json(args.out, "fmha_d64.json", dict(shape=D64_SHAPE, gpt_oss_window=GPT_OSS_WINDOW, corners=rows))
        return 0
    if args.features:
        print(f"fmha_fwd_d128 bf16 B{FEATURES_SHAPE[0]} Hq{FEATURES_SHAPE[1]}/Hk{FEATURES_SHAPE[2]} S{FEATURES_SHAPE[3]}, "
              f"gfxasm.perf (modelled, no gfx950 here), per params.CORNERS entry:")
        rows = features_figures(cap)
        _features_ranges(rows)
        _write_json(args.out, "fmha_features.json", dict(shape=FEATURES_SHAPE, softcap=SOFTCAP, rows=rows))
        return 0
    if args.validate_cap:
        rows = causal_model.validate_cap({name: VALIDATION_LAUNCHES[name] for name in args.variants.split(",")},
                                         [int(v) for v in args.validate_cap.split(",")],
                                         [int(v) for v in args.caps.split(",")], class_search=args.class_search)
        _write_json(args.out, "fmha_probe_cap.json", dict(probe_cap_validation=rows))
        return 0

    facts = [static_facts(fmha.variant(torch.bfloat16, c)) for c in (False, True)]
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
                    seconds, detail = causal_model.modelled_seconds(launches.DENSE_BF16, B, Hq, Hk, S, causal, cap)
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
    _write_json(args.out, "fmha.json", dict(static=facts, probe_cap_keys=cap, runs=rows, versus_aiter=versus))
    return 0


def _write_json(path: str | None, default_name: str, payload: dict) -> None:
    """A mode's results as JSON at `path` (--out), else bench/out/`default_name`."""
    out = Path(path or REPO / "bench" / "out" / default_name)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
