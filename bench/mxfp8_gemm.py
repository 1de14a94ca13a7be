"""MX-FP8 small-M GEMM benchmark: gfxasm.mxfp8_gemm on the decode shapes of a large MoE model.

    python3 bench/mxfp8_gemm.py [--static-only] [--only TEXT] [--out bench/out/mxfp8_gemm.json]

Shapes: the dense linear layers qkv, gate_up, o_proj and down at TP 1, 2, 4, 8 (N or K divided
by TP) for M = 1, 2, 4, 8, 16, 32, 64 tokens. MODEL below is ASSUMED — the seed names the
layers and TP degrees but not the dense widths; its MoE shapes (gemm1 K = 6144, gemm2
N = 6144) fix the hidden size at 6144, the rest is a typical GQA/MLP layout. Change MODEL to
bench another model.

Three kinds of numbers, each labelled:

* static, from the built code objects (no model): registers (VGPR/AGPR/SGPR), LDS,
  occupancy, and the steady-state main-loop iteration of one wave — found by walking the
  loop from its label with the loop-exit and tail branches not taken — as an instruction
  mix, issue cycles (gfxasm.perf.params: VALU 4 cycles, MFMA 4 x passes, 32-bit integer
  multiply 16, others one 4-cycle slot), and the bytes each global load moves (64 lanes x
  width; for scale bytes also how many are distinct);
* bytes: what the planned launches move — weights and their scales once, the activations
  once per workgroup that needs them (served by L2 after the first), the split-K workspace
  round trip, the output — against the minimum N*K*(1+1/32) + M*K*(1+1/32) + 2*M*N;
* time: measured with device events on a gfx950 (weights rotated beyond the caches), else
  gfxasm.perf's MI355X timing model (labelled "modelled"; it rounds the grid up to whole
  waves of workgroups and charges a launch overhead, so small grids look pessimistic).
  GB/s is the minimum bytes over the time; %HBM is against 8 TB/s.

JSON rows go to --out; a short table is printed. bench/mxfp8_vs_f4gemm.py sets these launches
beside aiter's MX-FP4 GEMMs at equal weight bytes, over the model's brackets.
"""
from __future__ import annotations

import argparse
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

from gfxasm.manifest import default_manifest                   # noqa: E402
from gfxasm.perf import params as P                            # noqa: E402

from bench.common import device_seconds, has_gfx950, manifest_case   # noqa: E402

mx = importlib.import_module("gfxasm.ops.mxfp8_gemm")

HBM = 8.0e12
# ASSUMED dense widths (see the docstring): hidden 6144, 48 query heads and 8 KV heads of 128,
# dense MLP intermediate 16384.
MODEL = dict(hidden=6144, q_heads=48, kv_heads=8, head_dim=128, intermediate=16384)
TPS = (1, 2, 4, 8)
MS = (1, 2, 4, 8, 16, 32, 64)


def layers(tp: int, model=MODEL) -> dict[str, tuple[int, int]]:
    """(N, K) of each dense layer at tensor parallelism tp (column- or row-parallel)."""
    h, d = model["hidden"], model["head_dim"]
    qkv = (model["q_heads"] + 2 * model["kv_heads"]) * d
    return {"qkv": (qkv // tp, h), "gate_up": (2 * model["intermediate"] // tp, h),
            "o_proj": (h, model["q_heads"] * d // tp), "down": (h, model["intermediate"] // tp)}


# ------------------------------------------------------------------ static facts

def _symbols(co_path: Path) -> dict[str, int]:
    from elftools.elf.elffile import ELFFile
    with open(co_path, "rb") as f:
        tab = ELFFile(f).get_section_by_name(".symtab")
        return {s.name: s["st_value"] for s in tab.iter_symbols() if s.name.startswith("L_")}


def _branch_dest(inst) -> int:
    simm = inst.words[0] & 0xFFFF
    simm = simm - 0x10000 if simm & 0x8000 else simm
    return inst.pc + 4 + 4 * simm


def _issue_cycles(inst, klass: str) -> int:
    from gfxasm.perf.model import _IMUL
    prm = P.DEFAULT
    if klass == "valu":
        return prm.imul_cycles if inst.name in _IMUL else prm.valu_cycles
    if klass == "trans":
        return prm.trans_cycles
    if inst.name == "s_nop":
        return (int(inst.ops[0].text, 0) + 1) * prm.issue_quantum
    return prm.issue_quantum


def _load_kind(inst) -> str:
    """What a global load of the main loop reads, from its buffer descriptor operand."""
    rsrc = next((op for op in inst.ops if op.kind == "s" and op.count == 4), None)
    return {8: "a", 12: "a_scale", 16: "b", 20: "b_scale"}.get(rsrc.index if rsrc else -1, "?")


def main_loop(variant) -> dict:
    """One wave's steady-state main-loop iteration: mix, issue cycles, bytes per load."""
    import gfxasm.emu as emu
    from gfxasm.perf.stats import classify, lane_bytes, mfma_passes
    co = variant.co_path
    labels = _symbols(co)
    insts = emu.load(co).kernel(variant.kernel.symbol).program.insts
    by_pc = {i.pc: n for n, i in enumerate(insts)}
    gemv = variant.kernel.name.startswith("mxfp8_gemv")
    # the GEMM's K loop comes from mxfp8.inc's mfma_k_loop macro, one instance per kernel:
    # its labels carry the macro's instance number (L_kloop_<n>, exits L_kdrain*_<n>)
    start = labels["L_chunk_loop"] if gemv else next(labels[k] for k in labels if k.startswith("L_kloop_"))
    never = {labels[k] for k in labels if k.startswith(("L_last", "L_tail", "L_kdrain", "L_kfill"))}
    counts, cycles, loads = Counter(), Counter(), []
    mfma = dict(count=0, cycles=0)
    n, first = by_pc[start], True
    while first or insts[n].pc != start:
        first = False
        inst = insts[n]
        klass = classify(inst)
        counts[klass] += 1
        if klass == "mfma":
            mfma["count"] += 1
            mfma["cycles"] += 4 * mfma_passes(inst)
        else:
            cycles[klass] += _issue_cycles(inst, klass)
        if klass == "vmem":
            width = lane_bytes(inst)[0]
            what = _load_kind(inst)
            # distinct bytes: GEMV scale bytes are shared by lane pairs (two 16-byte halves
            # of one 32-block); every other load reads 64 distinct lane addresses
            distinct = 32 if (gemv and what.endswith("scale")) else 64 * width
            loads.append(dict(instruction=inst.name, reads=what, bytes=64 * width, distinct_bytes=distinct))
        # steady state: conditional branches (loop exit to L_last*, partial step to L_tail*)
        # fall through; unconditional ones (past the tail code, back to the loop head) jump
        if inst.name == "s_branch":
            n = by_pc[_branch_dest(inst)]
            continue
        if inst.name.startswith("s_cbranch") and _branch_dest(inst) not in never:
            raise RuntimeError(f"{variant.name}: unexpected conditional branch in the main loop at {inst.pc:#x}")
        n += 1
    per = 1 if gemv else 2       # the GEMM loop body runs two K steps (register sets X and Y)
    total = sum(counts.values())
    moved = sum(x["bytes"] for x in loads)
    weight = sum(x["distinct_bytes"] for x in loads if x["reads"].startswith("b"))
    return dict(
        unit="1 KiB chunk of K per weight row" if gemv else "128-byte K step",
        per_iteration_units=per, instructions=total, mix=dict(counts),
        issue_cycles_other=sum(cycles.values()), mfma=mfma["count"], mfma_cycles=mfma["cycles"],
        loads=loads, load_instructions=len(loads), bytes_loaded=moved, weight_bytes=weight,
        bytes_per_instruction=moved / total, weight_bytes_per_instruction=weight / total,
        weight_bytes_per_valu=round(weight / counts["valu"], 1) if counts["valu"] else None)


def static_facts(kernel: str) -> dict:
    from gfxasm.perf import analyze
    variant = next(iter(default_manifest().kernel(kernel).variants.values()))
    st = analyze(str(variant.co_path))
    regs, occ = st.registers, st.occupancy
    return dict(kernel=kernel, variant=variant.name, defines=variant.defines, vgprs=regs.vgpr_count,
                agprs=regs.agpr_count, sgprs=regs.sgpr_count, lds_bytes=st.lds_bytes,
                workgroups_per_cu=occ.workgroups_per_cu, waves_per_simd=occ.waves_per_simd,
                occupancy_limited_by=occ.limited_by, main_loop=main_loop(variant))


# ------------------------------------------------------------------ bytes and time

def minimum_bytes(M: int, N: int, K: int) -> float:
    return N * K * (1 + 1 / 32) + M * K * (1 + 1 / 32) + 2 * M * N


def planned_bytes(plan, M: int, N: int, K: int) -> dict:
    """Bytes the plan's launches move. HBM: weights and scales once (each byte is loaded by
    exactly one K worker), activations once, workspace round trip, output. Requested: what
    the loads ask for, counting the activation re-reads (one per workgroup, tile rows padded)."""
    ws = 8 * plan.splits * M * N if plan.splits > 1 else 0
    row = K * (1 + 1 / 32)
    if plan.kind == "gemv":
        a_reads = mx.cdiv(N, plan.rows_n) * plan.rows_m * row
    else:
        a_reads = mx.cdiv(N, plan.rows_n) * mx.cdiv(M, plan.rows_m) * plan.rows_m * row
    hbm = N * row + M * row + ws + 2 * M * N
    return dict(hbm=hbm, requested=N * row + a_reads + ws + 2 * M * N, workspace=ws)


def _operands(M, N, K, device="cpu", fill=True):
    make = torch.zeros if fill else torch.empty
    a = make(M, K, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    sa = torch.full((M, K // 32), 127, dtype=torch.uint8, device=device)
    b = make(N, K, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    sb = torch.full((N, K // 32), 127, dtype=torch.uint8, device=device)
    return a, sa, b, sb


def plan_cases(plan, M, N, K) -> list:
    """The plan's launches (main kernel, then the reduce if split) as BenchCases; the cases
    hold their tensors, so re-modelling them (other Params) reuses the emulator's trace."""
    a, sa, b, sb = _operands(M, N, K)            # zeros: finite values for the emulator's converts
    out = torch.zeros(M, N, dtype=torch.bfloat16)
    ws = torch.zeros(max(1, plan.splits * M * N))
    launches = [manifest_case(plan.kernel, plan.variant, "", "", 0, 0, a=a, a_scale=sa.view(torch.float8_e8m0fnu),
                              b=b, b_scale=sb.view(torch.float8_e8m0fnu), out=out, ws=ws, M=M, N=N, K=K,
                              splits=plan.splits)]
    if plan.splits > 1:
        launches.append(manifest_case("mxfp8_splitk_reduce", "mxfp8_splitk_reduce_bf16", "", "", 0, 0, ws=ws, out=out,
                                      M=M, N=N, splits=plan.splits))
    return launches


def small_cases() -> list:
    """The planned launches of M16 N512 K1024: known launches for `gfxasm stats --lds`."""
    cases = plan_cases(mx.plan(16, 512, 1024), 16, 512, 1024)
    for c in cases:
        c.label = f"{c.kernel} M16 N512 K1024"
    return cases


def modelled_seconds(plan, M, N, K, params=None, cases=None) -> tuple[float, list]:
    """gfxasm.perf.estimate of the plan's launches (plan_cases, or the given cases), with
    gfxasm.perf.params.DEFAULT or the given Params (e.g. a bracket variant)."""
    from gfxasm.perf import estimate
    launches = cases or plan_cases(plan, M, N, K)
    seconds, parts = 0.0, []
    for case in launches:
        est = estimate(case.co, case.grid, case.block, case.kernarg, case.buffers, case.kernel, params=params)
        seconds += est.seconds
        parts.append(dict(kernel=case.kernel, grid=list(case.grid), seconds=est.seconds, rounds=est.rounds,
                          cycles_per_round=est.cycles_per_round, workgroups_per_cu=est.workgroups_per_cu,
                          dram_bytes=est.dram_bytes, requested_bytes=est.requested_global_bytes,
                          clock_hz=est.clock_hz,
                          valu_utilization=est.valu_utilization, mfma_utilization=est.mfma_utilization))
    return seconds, parts


def measured_seconds(M, N, K, iters: int = 50) -> float:
    """Device-event time per call on a gfx950, cycling through weight copies beyond the caches."""
    a, sa, b, sb = _operands(M, N, K, device="cuda", fill=False)
    copies = max(1, math.ceil(512e6 / (N * K)))
    weights = [(torch.randint(0, 0x7E, (N, K), dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn), sb)
               for _ in range(min(copies, 8))]
    a.view(torch.uint8).random_(0, 0x7E)
    out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    import gfxasm
    return device_seconds(lambda i: gfxasm.mxfp8_gemm(a, sa, weights[i % len(weights)][0], sb, out=out), iters=iters)


# ------------------------------------------------------------------ report

def _static_table(facts: list[dict]) -> str:
    head = (f"{'kernel':16} {'VGPR':>4} {'AGPR':>4} {'SGPR':>4} {'LDS KiB':>7} {'waves/SIMD':>10}  main loop per "
            f"iteration: {'insts':>5} {'VALU':>4} {'MFMA':>4} {'VMEM':>4}  {'B/inst':>6} {'wB/VALU':>7}")
    lines = [head, "-" * len(head)]
    for f in facts:
        ml = f["main_loop"]
        lines.append(f"{f['kernel']:16} {f['vgprs']:4} {f['agprs']:4} {f['sgprs']:4} {f['lds_bytes'] / 1024:7.0f} "
                     f"{f['waves_per_simd']:10.0f}  {ml['unit'][:30]:>30}: {ml['instructions']:5} "
                     f"{ml['mix'].get('valu', 0):4} {ml['mfma']:4} {ml['load_instructions']:4}  "
                     f"{ml['bytes_per_instruction']:6.1f} "
                     f"{ml['weight_bytes_per_valu'] if ml['mix'].get('valu') else '-':>7}")
    lines.append("B/inst: global bytes loaded per main-loop instruction; wB/VALU: distinct weight bytes per VALU op")
    return "\n".join(lines)


def _row_table(rows: list[dict]) -> str:
    head = (f"{'layer':8} {'TP':>2} {'M':>3} {'N':>6} {'K':>6}  {'kernel':16} {'S':>2}  {'HBM/min':>7} "
            f"{'req/min':>7}  {'time':>9} {'source':8} {'GB/s':>6} {'%HBM':>5}")
    lines = [head, "-" * len(head)]
    for r in rows:
        t = r.get("seconds")
        ts = f"{t * 1e6:7.2f}us" if t else "        -"
        lines.append(f"{r['layer']:8} {r['tp']:2} {r['M']:3} {r['N']:6} {r['K']:6}  {r['kernel']:16} {r['splits']:2}  "
                     f"{r['hbm_over_min']:7.3f} {r['requested_over_min']:7.2f}  {ts} {r.get('source', '-'):8} "
                     f"{r.get('gbps', 0):6.0f} {r.get('pct_hbm', 0):5.1f}")
    if any(r.get("source") == "modelled" for r in rows):
        lines.append("modelled = gfxasm.perf MI355X timing model (no gfx950 here); not a measurement")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--static-only", action="store_true", help="no timing (static facts and bytes only)")
    ap.add_argument("--only", help="only rows whose 'layer TP M' label contains this, e.g. 'qkv'")
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "mxfp8_gemm.json"))
    args = ap.parse_args(argv)
    mx.build_kernels()
    device = has_gfx950()
    kernels = [f"mxfp8_gemv_m{t}" for t in mx.GEMV_M_TILES] + [f"mxfp8_gemm_m{t}" for t in mx.MFMA_M_TILES]
    facts = [static_facts(k) for k in kernels]
    print(_static_table(facts))
    print()
    rows = []
    for tp in TPS:
        for layer, (N, K) in layers(tp).items():
            for M in MS:
                label = f"{layer} TP{tp} M{M}"
                if args.only and args.only not in label:
                    continue
                plan = mx.plan(M, N, K)
                moved = planned_bytes(plan, M, N, K)
                least = minimum_bytes(M, N, K)
                row = dict(layer=layer, tp=tp, M=M, N=N, K=K, kernel=plan.kernel, splits=plan.splits,
                           min_bytes=least, hbm_bytes=moved["hbm"], requested_bytes=moved["requested"],
                           workspace_bytes=moved["workspace"], hbm_over_min=moved["hbm"] / least,
                           requested_over_min=moved["requested"] / least)
                if not args.static_only:
                    t0 = time.time()
                    if device:
                        row.update(source="measured", seconds=measured_seconds(M, N, K))
                    else:
                        seconds, parts = modelled_seconds(plan, M, N, K)
                        row.update(source="modelled", seconds=seconds, launches=parts)
                    row.update(gbps=least / row["seconds"] / 1e9, pct_hbm=100 * least / row["seconds"] / HBM,
                               wall_s=round(time.time() - t0, 2))
                rows.append(row)
                print(_row_table([row]).splitlines()[2], flush=True)
    print()
    print(_row_table(rows))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(model=MODEL, device="gfx950" if device else None, kernels=facts, rows=rows),
                              indent=1, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
