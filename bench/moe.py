"""MX-FP8 MoE layer benchmark: gfxasm.mxfp8_moe at the issue's shape, every launch modelled.

    python3 bench/moe.py [--tokens 1,4,8,16,64] [--block-m 16|32|64] [--sorted | --unfused] [--out bench/out/moe.json]
    python3 bench/moe.py --tokens 256,1024,4096,16384    # prefill (the sorted form, block_m 32 / 64)
    python3 bench/moe.py --floors     # what the targets ask of the HBM, whatever the kernel (no emulation)
    python3 bench/moe.py --align 1024,16384,262144   # moe_align_block_size alone, top-8 on 129 experts

Shape (issue 11): hidden 6144, intermediate 768 (w1 [129, 1536, 6144], w2 [129, 6144, 768]),
129 experts, top-5, T = 1, 4, 8, 16, 64 tokens routed uniformly at random (5 distinct
experts per token, seeded). block_m as the layer chooses it (moe_layer.choose_block_m).

The layer is two or six dependent launches (moe_layer.choose_form), each modelled on its own
with gfxasm.perf.estimate (the MI355X timing model, launch overhead included) on the
arguments the layer would pass. The sorted form: moe_align (one launch up to
moe_align.ONE_LAUNCH_MAX_SLOTS slots, else three: count, scan, scatter; the 'align' column is
their sum), the gate_up grouped GEMM
(a_div = 5) with the SwiGLU + MX-FP8 quantisation fused into its epilogue
(mxfp8_moe_gemm.gate_up_swiglu), the down grouped GEMM (a_div = 1, topk weights), moe_sum.
The decode form (T <= moe_layer.DIRECT_MAX_TOKENS): the gate_up step with its routing read
from topk_ids (swiglu_direct), then the down GEMM and the top-k sum in one launch
(direct_sum; its time is in the 'down' column). The layer's time is their sum (each waits for
the one before). --block-m or --sorted models the sorted form at every T (--used: its GEMMs
on the used blocks only; the model charges the padded grid's skipped workgroups in full, so
the truth lies between the two); --unfused models the earlier five-launch form instead (the
gate_up GEMM writing bf16 h, then swiglu_mxfp8_quant), for comparison. Operands are zeros
with unit scales (the model's time does not depend on values; the emulator needs finite
ones); the routing is real, so the GEMMs' grids and the experts whose weights they read are
those of the routed tokens.

Weight bytes: the routed experts' w1 and w2 with their scales, (1536*6144 + 6144*768) * 33/32
bytes per distinct expert; weight TB/s = those bytes over the layer's time. TFLOP/s: the
layer's useful FLOPs, 2 * T * top_k * (2I*H + H*I), over its time, beside PEAK_FLOPS['fp8']
(gfxasm.perf.params: 5.0 PFLOP/s dense on an MI355X, the conformance README's figure; the
scaled MX-FP8 MFMA v_mfma_scale_f32_16x16x128_f8f6f4 takes the unscaled FP8 one's 8 passes,
65,536 FLOP in 32 clocks per SIMD: 256 CUs x 4 x 2,048 x 2.4 GHz = 5.0e15).

--one-launch models the decode form in one launch (moe_layer.FUSED_MAX_TOKENS; the FUSED
variant of asm/mxfp8_moe_gemm.s, fused_row): each role's workgroup time from gfxasm.perf.estimate
of that object on a grid of that role only (the producers; the sum role with producers = 0, so
its counter wait passes at the first poll), less the launch overhead, per round of the CU;
combined by gfxasm.perf.flagwait.launch_seconds over the timeline of the emulator's concurrent
run of the whole grid, plus one launch overhead; at the flag latency's default (1.5 us) and
the ends of its ASSUMED bracket (0.5 and 4 us). It also prints where the time goes at the
default latency (critical_path): when the last producer ends, and for the workgroup that ends
last, how long it stood at its acquire and how much of its own time the rule places after it.
The flagwait rule places each workgroup's time by its share of wave-instructions, so a sum
workgroup whose weight bytes mostly stream after its wait is placed as if most of its time
came before it, and each role is timed alone, so the HBM the sum role's pre-wait loads take
is charged to nobody. --one-launch therefore also times the phases with the timing model
itself (probe_phases): two objects assembled aside with FUSED_PROBE (asm/mxfp8_moe_gemm.s
header), one whose sum role ends at its acquire (its time up to the wait, alone) and one
whose sum role ends where it would poll (the whole grid: the producers' end with the sum
role's pre-wait loads sharing the HBM); the launch is then overhead + producers' end + flag
latency + (the sum role alone less its time up to the wait). Both figures are printed.
The two-launch rows above stay the decode form in two launches (what --one-launch is compared
with).

--floors prints, per T, the rate the routed weights must stream at to meet the issue's
target with the layer's launches and with one launch (weight bytes and launch costs only,
so lower bounds), beside the model's sustainable HBM rate and the fastest stream measured on
an MI355X in the data we hold (bench.fmoe_validate.fastest_stream_tbps).

Beside it, aiter's FlyDSL fused MoE on an MI355X as the issue quotes it (25.6, 56.6, 99.6,
182.6 us at T = 1, 4, 8, 16; ~6.2 TB/s of weights at 64+ tokens), and the issue's targets
(<= 20 us at T = 1, <= 0.8x FlyDSL at T = 4, 8, 16, >= 6.5 TB/s at T >= 64). Every figure of
ours is modelled, never measured.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gfxasm import build                                        # noqa: E402
from gfxasm.perf import params as perf_params                   # noqa: E402
from gfxasm.ops import moe_align, moe_layer, mxfp8_moe_gemm as gemm, swiglu_quant   # noqa: E402

from bench.common import manifest_case                         # noqa: E402

H, I, E, TOP_K = 6144, 768, 129, 5
FLYDSL_US = {1: 25.6, 4: 56.6, 8: 99.6, 16: 182.6}
FLYDSL_TBPS = 6.2                   # weight bytes at T >= 64 tokens
PEAK_FP8 = perf_params.PEAK_FLOPS["fp8"]
TARGET = dict(t1_us=20.0, ratio=0.8, tbps=6.5)
E4M3 = torch.float8_e4m3fn


def zeros(shape, dtype=E4M3) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.uint8).view(dtype) if dtype == E4M3 else torch.zeros(shape, dtype=dtype)


def unit_scales(shape) -> torch.Tensor:
    return torch.full(shape, 127, dtype=torch.uint8)


def routed(T: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 + T)
    return torch.stack([torch.randperm(E, generator=gen)[:TOP_K] for _ in range(T)]).to(torch.int32)


_WEIGHTS: dict = {}


def weights():
    """w1, w1_scale, w2, w2_scale at the full shape, made once (1.8 GB of zeros)."""
    if not _WEIGHTS:
        _WEIGHTS.update(w1=zeros((E, 2 * I, H)), w1s=unit_scales((E, 2 * I, H // 32)),
                        w2=zeros((E, H, I)), w2s=unit_scales((E, H, I // 32)))
    return _WEIGHTS


def launches(T: int, block_m: int | None = None, fused: bool = True, sort: bool = False,
             used_only: bool = False) -> tuple[list, int, int]:
    """(step, BenchCase) for each of the layer's launches at T tokens (fused=False: the
    five-launch form; sort: the sorted form even where the layer would take the decode form;
    used_only: the sorted form's GEMM grids cut to the used blocks), the distinct experts
    routed to and the block_m used (None: the layer's choice; 0: the decode form)."""
    w = weights()
    ids = routed(T)
    tw = torch.rand(T, TOP_K, generator=torch.Generator().manual_seed(T))
    S = T * TOP_K
    x, xs = zeros((T, H)), unit_scales((T, H // 32))
    if sort or not fused:
        block_m = block_m or moe_layer.choose_block_m(T, TOP_K, E)
    sizes = moe_layer.validate(x, xs, w["w1"], w["w1s"], w["w2"], w["w2s"], tw, ids, None, 1.702, 1.0, 7.0,
                               block_m)
    q, qs = zeros((S, I)), unit_scales((S, I // 32)).view(torch.float8_e8m0fnu)
    if sizes["form"] in ("direct", "fused"):         # fused: modelled in two launches here (fused_row: one)
        out = zeros((T, H), torch.bfloat16)
        steps = (("gate_up", gemm.direct_swiglu_launch_args(x, xs, w["w1"], w["w1s"], ids, None, E, q, qs, 1.702, 1.0,
                                                            7.0)),
                 ("down", gemm.direct_sum_launch_args(q, qs, w["w2"], w["w2s"], ids, None, E, tw, out)))
        return ([(step, manifest_case(kernel, variant, "", "", 0, 0, **kargs)) for step, (kernel, variant, kargs)
                 in steps], int(ids.unique().numel()), 0)
    sorted_ids, expert_ids, post = moe_align.moe_align_block_size(ids, sizes["block_m"], E, None, True, True)
    cases = align_cases(ids, sizes["block_m"], (sorted_ids, expert_ids, post))     # the real routing
    if used_only:
        used = int(post) // sizes["block_m"]
        sorted_ids, expert_ids = sorted_ids[:used * sizes["block_m"]], expert_ids[:used]
    h = zeros((S, 2 * I), torch.bfloat16)
    y = zeros((S, H), torch.bfloat16)
    for step, (a, a_scale, wt, wt_scale, a_div, topk_w, out) in (
            ("gate_up", (x, xs, w["w1"], w["w1s"], TOP_K, None, h)),
            ("down", (q, qs, w["w2"], w["w2s"], 1, tw, y))):
        args = (a, a_scale, wt, wt_scale, sorted_ids, expert_ids, post, a_div, topk_w, out, torch.bfloat16)
        if step == "gate_up" and fused:
            kernel, variant, kargs = gemm.swiglu_launch_args(*args[:8], q, qs, 1.702, 1.0, 7.0)
        else:
            kernel, variant, kargs = gemm.launch_args(*args, gemm.validate(*args))
        cases.append((step, manifest_case(kernel, variant, "", "", 0, 0, **kargs)))
        if step == "gate_up" and not fused:
            variant, sargs = swiglu_quant.launch_args(h, q, qs, 1.702, 1.0, 7.0)
            cases.append(("swiglu_quant", manifest_case("swiglu_mxfp8_quant", variant, "", "", 0, 0, **sargs)))
    out = zeros((T, H), torch.bfloat16)
    cases.append(("moe_sum", manifest_case("moe_sum", None, "", "", 0, 0,
                                           **moe_layer.sum_launch_args(y, ids, None, out, sizes))))
    return cases, int(ids.unique().numel()), sizes["block_m"]


def fused_row(T: int) -> dict:
    """The decode form in one launch at T tokens, modelled (module docstring, --one-launch)."""
    from gfxasm import emu
    from gfxasm.perf import estimate, flagwait
    w, ids = weights(), routed(T)
    tw = torch.rand(T, TOP_K, generator=torch.Generator().manual_seed(T))
    S = T * TOP_K

    def case(**override):
        q, qs = zeros((S, I)), unit_scales((S, I // 32)).view(torch.float8_e8m0fnu)
        kernel, variant, kargs = moe_layer.fused_launch_args(
            zeros((T, H)), unit_scales((T, H // 32)), w["w1"], w["w1s"], w["w2"], w["w2s"], tw, ids, None, E, q, qs,
            torch.zeros(1, dtype=torch.uint32), zeros((T, H), torch.bfloat16), 1.702, 1.0, 7.0)
        return kargs, manifest_case(kernel, variant, "", "", 0, 0, **dict(kargs, **override))

    kargs, whole = case()
    producers = kargs["producers"]
    sum_only = case(producers=0)[1]     # its counter wait passes at the first poll
    roles = {}
    # each timed on buffers of its own: a producer's release would count in another case's counter
    for role, (c, grid) in dict(gate_up=(case()[1], (producers, 1, 1)), down=(sum_only, None)).items():
        est = estimate(c.co, grid or c.grid, c.block, c.kernarg, c.buffers, c.kernel)
        roles[role] = dict(group_us=(est.seconds - est.launch_overhead_s) / est.rounds * 1e6, rounds=est.rounds,
                           overhead_us=est.launch_overhead_s * 1e6)
    run = emu.load(whole.co).kernel(whole.kernel).launch(whole.grid, whole.block, whole.kernarg, whole.buffers,
                                                         schedule="concurrent")
    seconds = {g: roles["gate_up" if g < producers else "down"]["group_us"] * 1e-6 for g in run.timeline.groups}
    overhead = roles["down"]["overhead_us"]
    lats = {f"{lat * 1e6:g}": lat for lat in (flagwait.FLAG_LATENCY_BRACKET[0], flagwait.FLAG_LATENCY_S,
                                                  flagwait.FLAG_LATENCY_BRACKET[1])}
    us = {key: flagwait.launch_seconds(run.timeline, seconds, lat).seconds * 1e6 + overhead
          for key, lat in lats.items()}
    phases = probe_phases(case()[1], sum_only, roles["down"]["group_us"])
    return dict(T=T, grid=list(whole.grid), producers=producers, roles=roles, us_by_flag_latency_us=us,
                us=us[f"{flagwait.FLAG_LATENCY_S * 1e6:g}"], phases=phases,
                phases_us_by_flag_latency_us={
                    key: overhead + phases["producers_us"] + lat * 1e6 + phases["after_wait_us"]
                    for key, lat in lats.items()},
                path=critical_path(run.timeline, flagwait.launch_seconds(run.timeline, seconds), seconds, producers))


def probe_variant(co: str, probe: int):
    """The manifest variant whose object is `co` (a FUSED one) assembled again with
    FUSED_PROBE = probe (asm/mxfp8_moe_gemm.s header) into a build directory of its own,
    never the manifest's; the built variant (its co_path the probe's object)."""
    from gfxasm.manifest import default_manifest
    manifest = default_manifest()
    variant = next(v for k in manifest.kernels.values() for v in k.variants.values() if str(v.co_path) == co)
    aside = dataclasses.replace(manifest, build_dir=Path(tempfile.gettempdir()) / "gfxasm_moe_probes")
    probed = dataclasses.replace(variant, name=f"{variant.name}_probe{probe}",
                                 kernel=dataclasses.replace(variant.kernel, manifest=aside),
                                 defines=dict(variant.defines, FUSED_PROBE=probe))
    build.build_variant(probed, build.ensure_toolchain())
    return probed


def probe_phases(whole, sum_only, sum_group_us: float) -> dict:
    """The one launch's phases timed by the timing model itself rather than placed by the
    flagwait rule's instruction share (module docstring): the producers' end, from the whole
    grid with the sum role stopped where it would poll (FUSED_PROBE 2: the HBM its pre-wait
    loads take is charged), and the sum role's time after its wait, its time alone less its
    time up to its acquire (FUSED_PROBE 1: prologue, first weight loads landed, one poll)."""
    from gfxasm.perf import estimate

    def group_us(c, co) -> float:
        est = estimate(co, c.grid, c.block, c.kernarg, c.buffers, c.kernel)
        return (est.seconds - est.launch_overhead_s) / est.rounds * 1e6

    to_wait = group_us(sum_only, str(probe_variant(sum_only.co, 1).co_path))
    return dict(producers_us=group_us(whole, str(probe_variant(whole.co, 2).co_path)), sum_to_wait_us=to_wait,
                after_wait_us=sum_group_us - to_wait)


def critical_path(timeline, timing, seconds: dict, producers: int) -> dict:
    """Where the one launch's time goes at the default flag latency (us from the launch's
    start, no overhead): when the last producer ends (its release is its last instructions),
    and for the workgroup that ends last, the time it stood at its acquires and the share of
    its own time the flagwait rule places after its last acquire (its wave-instructions past
    the wait over all of them)."""
    last = max(timing.end, key=timing.end.get)
    line = timeline.groups[last]
    past = line.work - max((w.at for w in line.waits), default=0)
    return dict(producers_end_us=max(timing.end[g] for g in range(producers)) * 1e6, last_group=last,
                last_waited_us=timing.waited[last] * 1e6,
                last_after_wait_us=seconds[last] * past / max(line.work, 1) * 1e6, end_us=timing.seconds * 1e6)


def fused_table(rows: list[dict]) -> str:
    lats = list(rows[0]["us_by_flag_latency_us"]) if rows else []
    head = (f"{'T':>3} {'grid':>6} {'gate_up wg us':>13} {'down wg us':>10} "
            + " ".join(f"{'flag ' + lat + ' us':>12}" for lat in lats))
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['T']:3} {r['grid'][0]:6} {r['roles']['gate_up']['group_us']:13.2f} "
                     f"{r['roles']['down']['group_us']:10.2f} "
                     + " ".join(f"{r['us_by_flag_latency_us'][lat]:12.2f}" for lat in lats))
    for r in rows:
        p = r["path"]
        lines.append(f"T={r['T']} at the default latency: launch overhead {r['roles']['down']['overhead_us']:.2f} us + "
                     f"last producer ends {p['producers_end_us']:.2f} us; workgroup {p['last_group']} ends last at "
                     f"{p['end_us']:.2f} us, having stood {p['last_waited_us']:.2f} us at its acquire and run "
                     f"{p['last_after_wait_us']:.2f} us after it")
    for r in rows:
        p = r["phases"]
        lines.append(f"T={r['T']} phases timed by the model (probe objects): producers end {p['producers_us']:.2f} us "
                     f"(whole grid, the sum role's pre-wait loads charged), sum role {p['sum_to_wait_us']:.2f} us to "
                     f"its acquire and {p['after_wait_us']:.2f} us after it; overhead + producers + flag latency + "
                     "after: " + " / ".join(f"{us:.2f}" for us in r["phases_us_by_flag_latency_us"].values())
                     + f" us at flag {' / '.join(lats)} us")
    lines.append("modelled: one launch (one overhead); per-role workgroup times from gfxasm.perf.estimate, combined by "
                 "gfxasm.perf.flagwait over the emulator's concurrent run; flag latency ASSUMED (bracket 0.5-4 us)")
    return "\n".join(lines)


def align_cases(ids: torch.Tensor, block_m: int, outs: tuple) -> list:
    """(step, BenchCase) for moe_align's launches (as the layer runs them) writing copies
    of `outs`, each launch on the workspace as the launches before it leave it (run here on the
    emulator first: the scan's loops and the scatter's stores depend on the counts)."""
    outs = tuple(torch.empty_like(t) for t in outs)
    args = moe_align.launch_args(ids, block_m, E, None, True, outs, moe_align.workspace(ids.numel(), E, "cpu"))
    cases = []
    for launch in moe_align.prepared(args):
        kargs = {k: v.clone() if k == "counts" else v for k, v in moe_align.kernel_args(launch.variant, args).items()}
        cases.append((launch.variant, manifest_case(launch.variant, None, "", "", 0, 0, **kargs)))
        launch(*[args[name] for name, _, _ in launch.pointers])
    return cases


def align_row(slots: int, top_k: int = 8, block_m: int = 64) -> dict:
    """moe_align_block_size alone at `slots` slots (slots / top_k tokens on E experts, seeded),
    each launch modelled."""
    from gfxasm.perf import estimate
    gen = torch.Generator().manual_seed(slots)
    ids = torch.stack([torch.randperm(E, generator=gen)[:top_k] for _ in range(slots // top_k)]).to(torch.int32)
    outs = moe_align.moe_align_block_size(ids, block_m, E, None, True)
    steps = {}
    for step, c in align_cases(ids, block_m, outs):
        est = estimate(c.co, c.grid, c.block, c.kernarg, c.buffers, c.kernel)
        steps[step] = dict(us=est.seconds * 1e6, grid=list(c.grid))
    return dict(slots=slots, top_k=top_k, experts=E, block_m=block_m, chunk=moe_align.choose_chunk(slots)[0],
                us=sum(s["us"] for s in steps.values()), steps=steps)


def align_table(rows: list[dict]) -> str:
    head = f"{'slots':>7} {'chunk':>5} " + " ".join(f"{k[10:]:>8}" for k in moe_align.KERNELS) + f" {'align us':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['slots']:7} {r['chunk']:5} " + " ".join(f"{r['steps'][k]['us']:8.2f}" if k in r['steps']
                                                                 else f"{'-':>8}" for k in moe_align.KERNELS)
                     + f" {r['us']:9.2f}")
    lines.append(f"modelled: gfxasm.perf MI355X timing model, each launch with its overhead; top-8 routing on {E} "
                 f"experts, block_size 64")
    return "\n".join(lines)


def weight_bytes(experts: int) -> float:
    return experts * (2 * I * H + H * I) * 33 / 32


def layer_flops(T: int) -> float:
    """The layer's useful MFMA work: both GEMMs over the T * TOP_K slots (no padding)."""
    return 2.0 * T * TOP_K * (2 * I * H + H * I)


def row(T: int, block_m: int | None = None, fused: bool = True, sort: bool = False, used_only: bool = False) -> dict:
    from gfxasm.perf import estimate
    cases, experts, block_m = launches(T, block_m, fused, sort, used_only)
    steps = {}
    for step, c in cases:
        est = estimate(c.co, c.grid, c.block, c.kernarg, c.buffers, c.kernel)
        steps[step] = dict(us=est.seconds * 1e6, grid=list(c.grid), dram_mb=est.dram_bytes / 1e6)
    total = sum(s["us"] for s in steps.values())
    r = dict(T=T, experts=experts, block_m=block_m, us=total, weight_mb=weight_bytes(experts) / 1e6,
             weight_tbps=weight_bytes(experts) / (total * 1e-6) / 1e12, steps=steps,
             tflops=layer_flops(T) / (total * 1e-6) / 1e12, flydsl_us=FLYDSL_US.get(T))
    r["vs_flydsl"] = total / r["flydsl_us"] if r["flydsl_us"] else None
    return r


def target_us(T: int, weight: float) -> float:
    """The issue's target for the layer at T tokens, as a time (T >= 64: the rate target)."""
    if T == 1:
        return TARGET["t1_us"]
    if T in FLYDSL_US:
        return TARGET["ratio"] * FLYDSL_US[T]
    return weight / (TARGET["tbps"] * 1e12) * 1e6


def floors_table(tokens: list[int]) -> str:
    """Per T: the TB/s the routed weights need to meet the target with the layer's launches
    and with one (bytes and launch costs only: lower bounds)."""
    from bench.fmoe_validate import fastest_stream_tbps
    from gfxasm.perf import params as P
    launch = P.DEFAULT.launch_overhead_us
    lines = [f"{'T':>3} {'experts':>7} {'weight MB':>9} {'target us':>9} {'launches':>8} "
             f"{'TB/s needed':>11} {'one launch':>10}"]
    for T in tokens:
        experts = int(routed(T).unique().numel())
        weight = weight_bytes(experts)
        target = target_us(T, weight)
        n = dict(fused=1, direct=2, sorted=6)[moe_layer.choose_form(T, TOP_K, None)]
        need = [weight / ((target - k * launch) * 1e-6) / 1e12 if target > k * launch else float("inf")
                for k in (n, 1)]
        lines.append(f"{T:3} {experts:7} {weight / 1e6:9.1f} {target:9.1f} {n:8} {need[0]:11.2f} {need[1]:10.2f}")
    lines.append(f"model's sustainable HBM rate {P.DEFAULT.hbm_efficiency * P.HBM_BYTES_PER_S / 1e12:.2f} TB/s; "
                 f"fastest measured MI355X stream {fastest_stream_tbps():.2f} TB/s (aiter fused-MoE stage 1, "
                 f"launch cost taken out); each launch {launch:.2f} us")
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    head = (f"{'T':>3} {'experts':>7} {'bm':>3} {'align':>6} {'gate_up':>8} {'swiglu':>7} {'down':>7} {'sum':>6} "
            f"{'layer us':>9} {'FlyDSL':>7} {'ours/Fly':>8} {'weight MB':>9} {'TB/s':>5} {'TFLOP/s':>7} {'%peak':>5}")
    lines = [head, "-" * len(head)]
    for r in rows:
        s = r["steps"]
        fly = f"{r['flydsl_us']:7.1f}" if r["flydsl_us"] else f"{'~' + str(FLYDSL_TBPS) + 'TB/s':>7}"
        ratio = f"{r['vs_flydsl']:8.2f}" if r["vs_flydsl"] else f"{'-':>8}"
        act = f"{s['swiglu_quant']['us']:7.2f}" if "swiglu_quant" in s else f"{'fused':>7}"
        aligned = [s[k]["us"] for k in moe_align.KERNELS if k in s]
        align = f"{sum(aligned):6.2f}" if aligned else f"{'-':>6}"
        summed = f"{s['moe_sum']['us']:6.2f}" if "moe_sum" in s else f"{'fused':>6}"
        bm = f"{r['block_m']:3}" if r["block_m"] else f"{'dir':>3}"
        lines.append(f"{r['T']:3} {r['experts']:7} {bm} {align} "
                     f"{s['gate_up']['us']:8.2f} {act} {s['down']['us']:7.2f} "
                     f"{summed} {r['us']:9.2f} {fly} {ratio} {r['weight_mb']:9.1f} "
                     f"{r['weight_tbps']:5.2f} {r['tflops']:7.1f} {100 * r['tflops'] * 1e12 / PEAK_FP8:5.1f}")
    lines.append("modelled: gfxasm.perf MI355X timing model, each launch with its overhead; FlyDSL: the issue's "
                 "MI355X figures; bm 'dir': the decode form (down includes the top-k sum)")
    lines.append(f"targets: <= {TARGET['t1_us']} us at T=1, <= {TARGET['ratio']}x FlyDSL at T=4/8/16, "
                 f">= {TARGET['tbps']} TB/s of weights at T >= 64")
    lines.append(f"TFLOP/s: 2*T*top_k*3*H*I over the layer's time; %peak of {PEAK_FP8 / 1e15:.1f} PFLOP/s "
                 f"(MI355X dense FP8 = MX-FP8, gfxasm.perf.params.PEAK_FLOPS)")
    return "\n".join(lines)


def write_rows(out: Path, rows: list) -> None:
    """The modelled rows as JSON beside --out."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(source="modelled", rows=rows), indent=1))
    print(f"wrote {out}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="1,4,8,16,64")
    ap.add_argument("--block-m", type=int, choices=(16, 32, 64), help="instead of the layer's choice")
    form = ap.add_mutually_exclusive_group()
    form.add_argument("--sorted", action="store_true", help="the sorted four-launch form at every T")
    form.add_argument("--unfused", action="store_true", help="the five-launch form (gate_up GEMM, swiglu_mxfp8_quant)")
    ap.add_argument("--used", action="store_true", help="the sorted form's GEMMs on the used blocks only (the model "
                    "charges the padded grid's skipped workgroups in full: the truth lies between the two)")
    ap.add_argument("--one-launch", action="store_true", help="the decode form in one launch (T <= "
                    f"{moe_layer.FUSED_MAX_TOKENS}: module docstring) and stop")
    ap.add_argument("--floors", action="store_true", help="the rates the targets need (no emulation) and stop")
    ap.add_argument("--align", metavar="SLOTS", help="model moe_align_block_size alone at these slot counts "
                    "(e.g. 1024,16384,262144) and stop")
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "moe.json"))
    args = ap.parse_args(argv)
    if args.floors:
        print(floors_table([int(t) for t in args.tokens.split(",")]))
        return 0
    build.build_kernels(moe_layer.kernel_names() + [swiglu_quant.OP])
    if args.align:
        rows = [align_row(int(n)) for n in args.align.split(",")]
        print(align_table(rows))
        write_rows(Path(args.out).with_name("moe_align.json"), rows)
        return 0
    gemm.build_kernels()
    if args.one_launch:
        rows = [fused_row(int(t)) for t in args.tokens.split(",")]
        print(fused_table(rows))
        write_rows(Path(args.out).with_name("moe_one_launch.json"), rows)
        return 0
    rows = []
    for T in (int(t) for t in args.tokens.split(",")):
        t0 = time.time()
        rows.append(row(T, args.block_m, not args.unfused, args.sorted, args.used))
        rows[-1]["wall_s"] = round(time.time() - t0, 1)
        print(table(rows[-1:]).splitlines()[2], flush=True)
    print()
    print(table(rows))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(source="modelled", fused=not args.unfused, sorted=args.sorted, used=args.used,
                                   rows=rows), indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
