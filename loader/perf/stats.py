"""Static analysis of any gfx950 code object: registers, LDS, occupancy, instruction mix,
loops and the hottest loop's MFMA and memory work.

    from gfxasm.perf import stats
    s = stats.analyze("build/x.co")            # or bytes; kernel=NAME if several
    print(stats.format_stats(s))

Occupancy is the emulator's rule (gfxasm.emu.occupancy: LLVM's AMDGPU occupancy math for
gfx90a-class targets, gfx950 included, with the MI355X register/LDS sizes of AMD's ROCm GPU
specification table; every number and its source there).
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import asdict, dataclass, field

from ..emu.occupancy import Occupancy, sgpr_alloc, vgpr_alloc
from ..emu.occupancy import occupancy as occupancy_rule
from ..emu.registry import HANDLERS
from . import params as P

# ---------------------------------------------------------------- classification
TRANS_NAMES = {"v_exp_f32", "v_log_f32", "v_rcp_f32", "v_rcp_iflag_f32", "v_rsq_f32", "v_sqrt_f32",
               "v_sin_f32", "v_cos_f32", "v_exp_f16", "v_log_f16", "v_rcp_f16", "v_rsq_f16",
               "v_sqrt_f16", "v_sin_f16", "v_cos_f16", "v_rcp_f64", "v_rsq_f64", "v_sqrt_f64",
               "v_exp_legacy_f32", "v_log_legacy_f32", "v_prng_b32"}
CLASSES = ("mfma", "valu", "trans", "salu", "smem", "vmem", "lds_dma", "ds", "branch", "waitcnt",
           "barrier", "nop", "end")


def classify(inst) -> str:
    """Issue class of an instruction: the emulator's registry class, or (for instructions
    the emulator does not implement yet) the same class derived from the mnemonic."""
    h = HANDLERS.get(inst.name)
    if h is not None:
        if h.klass == "vmem" and inst.mods.get("lds"):
            return "lds_dma"          # buffer_load_* ... lds: the emulator registers it as vmem
        return h.klass
    n = inst.name
    if n.startswith(("v_mfma", "v_smfmac")):
        return "mfma"
    if n in TRANS_NAMES:
        return "trans"
    if n.startswith(("buffer_", "global_", "flat_", "scratch_")):
        return "lds_dma" if (inst.mods.get("lds") or n.startswith("global_load_lds")) else "vmem"
    if n.startswith("ds_"):
        return "ds"
    if n.startswith(("s_load", "s_buffer_load", "s_store", "s_buffer_store", "s_dcache", "s_memtime",
                     "s_memrealtime", "s_atc_probe", "s_scratch")):
        return "smem"
    if n.startswith(("s_cbranch", "s_branch", "s_setpc", "s_swappc", "s_call")):
        return "branch"
    if n.startswith("s_waitcnt"):
        return "waitcnt"
    if n == "s_barrier":
        return "barrier"
    if n == "s_endpgm":
        return "end"
    if n in ("s_nop", "s_setprio", "s_sleep", "s_sethalt", "s_ttracedata", "s_code_end", "s_icache_inv"):
        return "nop"
    if n.startswith("s_"):
        return "salu"
    return "valu"


# ---------------------------------------------------------------- MFMA facts
# Passes per gfx950 MFMA (fact sheet §2, from LLVM 22's hazard model; cycles = 4 x passes).
_MFMA = re.compile(r"^v_s?mfmac?_(?:scale_)?(?:f32|i32|f64)_(\d+)x(\d+)x(\d+)(?:_?(\d+)b)?_?(\w+)$")


def mfma_shape(inst) -> tuple[int, int, int, int, str] | None:
    """(M, N, K, blocks, dtype) of an MFMA mnemonic."""
    m = _MFMA.match(inst.name)
    if not m:
        return None
    M, N, K = int(m[1]), int(m[2]), int(m[3])
    blocks = int(m[4]) if m[4] else 1
    return M, N, K, blocks, m[5]


def mfma_dtype(inst) -> str:
    """'bf16' (also f16), 'fp8' (fp8/bf8 and f8f6f4 with 8-bit formats), 'fp4/fp6', 'f32', 'f64', 'i8'."""
    shape = mfma_shape(inst)
    if shape is None:
        return "unknown"
    t = shape[4]
    if "f8f6f4" in t:
        cbsz, blgp = int(inst.mods.get("cbsz", 0)), int(inst.mods.get("blgp", 0))
        return "fp8" if (cbsz <= 1 or blgp <= 1) else "fp4/fp6"
    if "fp8" in t or "bf8" in t:
        return "fp8"
    if "bf16" in t or "f16" in t:
        return "bf16"
    if "i8" in t:
        return "i8"
    if "f64" in inst.name[:12]:
        return "f64"
    return "f32"


def mfma_passes(inst) -> int:
    """Passes of one MFMA on gfx950 (fact sheet §2)."""
    shape = mfma_shape(inst)
    if shape is None:
        return 4
    M, N, K, blocks, t = shape
    if inst.name.startswith("v_smfmac"):    # every gfx950 SMFMAC: 4 (16x16) / 8 (32x32) passes, llc-22
        return 4 if M == 16 else 8
    if "f8f6f4" in t:
        eight_bit = mfma_dtype(inst) == "fp8"
        if M == 16:
            return 8 if eight_bit else 4
        return 16 if eight_bit else 8
    flops = 2 * M * N * K * blocks
    if t in ("bf16", "f16", "fp8_fp8", "fp8_bf8", "bf8_fp8", "bf8_bf8", "i8"):
        # 16x16x32 / 32x32x16 (gfx950 double-rate forms): 4096 FLOP per pass;
        # legacy 16x16x16 / 32x32x8 (incl. _1k): 2048 FLOP per pass.
        per_pass = 4096 if K * M >= 512 else 2048
        if t == "i8" and K * M >= 1024:     # gfx950 i32_16x16x64 / 32x32x32_i8: 4 / 8 passes (llc-22)
            per_pass = 8192
        return max(2, flops // per_pass)
    if t.endswith("bf16_1k") or t.endswith("f16_1k"):
        return max(2, flops // 2048)
    # f32 / xf32 / f64 MFMAs: CDNA3 table (16x16x4 f32 = 8 passes, 32x32x2 f32 = 16).
    return max(2, flops // 256)


def mfma_flops(inst) -> int:
    shape = mfma_shape(inst)
    if shape is None:
        return 0
    M, N, K, blocks, _ = shape
    return 2 * M * N * K * blocks


# ---------------------------------------------------------------- memory bytes
_VMEM_SIZE = {"dword": 4, "dwordx2": 8, "dwordx3": 12, "dwordx4": 16, "ubyte": 1, "sbyte": 1,
              "ushort": 2, "sshort": 2, "byte": 1, "short": 2, "ubyte_d16": 1, "sbyte_d16": 1,
              "short_d16": 2, "ubyte_d16_hi": 1, "sbyte_d16_hi": 1, "short_d16_hi": 2, "byte_d16_hi": 1}
_DS = re.compile(r"^ds_(read|write|load|store)(2st64|2)?_(b|u|i)(\d+)")


def lane_bytes(inst) -> tuple[int, int, int, int]:
    """Bytes per active lane: (global read, global write, LDS read, LDS write)."""
    n = inst.name
    klass = classify(inst)
    if klass in ("vmem", "lds_dma"):
        m = re.match(r"^(?:buffer|global|flat|scratch)_(load|store|atomic)_(?:lds_)?(\w+)$", n)
        if not m:
            return (0, 0, 0, 0)
        kind, rest = m[1], m[2]
        if kind == "atomic":
            size = 8 if rest.endswith("x2") else 4
            return (size, size, 0, 0)
        size = _VMEM_SIZE.get(rest, 4)
        if kind == "load":
            return (size, 0, 0, size) if klass == "lds_dma" else (size, 0, 0, 0)
        return (0, size, 0, 0)
    if klass == "ds":
        m = _DS.match(n)
        if m:
            size = int(m[4]) // 8 * (2 if m[2] else 1)
            return (0, 0, size, 0) if m[1] in ("read", "load") else (0, 0, 0, size)
        if n.startswith(("ds_swizzle", "ds_permute", "ds_bpermute")):
            return (0, 0, 0, 0)
        return (0, 0, 4, 4)    # LDS atomics: read-modify-write of a dword
    return (0, 0, 0, 0)


def smem_bytes(inst) -> int:
    m = re.match(r"^s_(?:buffer_)?load_dword(?:x(\d+))?$", inst.name)
    return 4 * int(m[1] or 1) if m else 0


# ---------------------------------------------------------------- loops
def branch_target(inst) -> int | None:
    if classify(inst) != "branch" or not inst.name.startswith(("s_branch", "s_cbranch")):
        return None
    simm16 = inst.words[0] & 0xFFFF
    if simm16 >= 0x8000:
        simm16 -= 0x10000
    return inst.pc + 4 + 4 * simm16


@dataclass
class Mix:
    """Instruction counts by issue class plus the work they carry (per wave)."""
    counts: dict = field(default_factory=dict)
    instructions: int = 0
    mfma: int = 0
    mfma_cycles: int = 0                  # sum of 4 x passes
    mfma_flops: int = 0
    global_read_bytes: int = 0            # per wave, 64 active lanes (incl. LDS DMA)
    global_write_bytes: int = 0
    lds_read_bytes: int = 0
    lds_write_bytes: int = 0              # incl. LDS DMA
    scalar_read_bytes: int = 0
    lds_dma_bytes: int = 0                # global -> LDS directly (counted in both of the above)

    def add(self, inst, times: int = 1):
        k = classify(inst)
        self.counts[k] = self.counts.get(k, 0) + times
        self.instructions += times
        if k == "mfma":
            self.mfma += times
            self.mfma_cycles += times * P.CYCLES_PER_PASS * mfma_passes(inst)
            self.mfma_flops += times * mfma_flops(inst)
        gr, gw, lr, lw = lane_bytes(inst)
        self.global_read_bytes += times * 64 * gr
        self.global_write_bytes += times * 64 * gw
        self.lds_read_bytes += times * 64 * lr
        self.lds_write_bytes += times * 64 * lw
        self.scalar_read_bytes += times * smem_bytes(inst)
        if k == "lds_dma":
            self.lds_dma_bytes += times * 64 * gr


@dataclass
class Loop:
    start: int              # pc of the loop head (the backward branch's target)
    end: int                # pc of the backward branch
    depth: int              # 0 = outermost
    innermost: bool
    forward_branches: int   # conditional/unconditional forward branches inside the body
    exits: int              # branches leaving the body
    mix: Mix = field(default_factory=Mix)
    executed_iterations: int | None = None     # filled from a timing trace


def find_loops(insts) -> list[Loop]:
    loops = []
    for inst in insts:
        t = branch_target(inst)
        if t is not None and t <= inst.pc:
            loops.append(Loop(t, inst.pc, 0, True, 0, 0))
    # the same head reached by several back edges: keep the outermost range
    loops.sort(key=lambda l: (l.start, -l.end))
    for a in loops:
        for b in loops:
            if a is not b and a.start <= b.start and b.end <= a.end and (a.start, a.end) != (b.start, b.end):
                a.innermost = False
                b.depth += 1
    for lp in loops:
        for inst in insts:
            if lp.start <= inst.pc <= lp.end:
                lp.mix.add(inst)
                t = branch_target(inst)
                if t is not None and inst.pc != lp.end:
                    if t > inst.pc and t <= lp.end:
                        lp.forward_branches += 1
                    elif t > lp.end or t < lp.start:
                        lp.exits += 1
    return loops


def hottest_loop(loops: list[Loop]) -> Loop | None:
    """The loop with the most executed MFMA cycles when a trace filled in iteration counts,
    else the innermost loop with the most MFMA cycles (then the most instructions)."""
    if not loops:
        return None
    if any(l.executed_iterations for l in loops):
        return max(loops, key=lambda l: ((l.executed_iterations or 0) * max(l.mix.mfma_cycles, 1),
                                         l.innermost, l.mix.instructions))
    return max(loops, key=lambda l: (l.innermost, l.mix.mfma_cycles, l.mix.instructions))


# ---------------------------------------------------------------- registers and occupancy
@dataclass
class Registers:
    sgpr_count: int          # metadata .sgpr_count (what the kernel declares)
    vgpr_count: int          # metadata .vgpr_count (unified VGPR+AGPR on gfx90a+)
    agpr_count: int          # metadata .agpr_count, or derived
    accum_offset: int
    vgpr_alloc: int          # unified registers the hardware allocates per wave (KD granules)
    sgpr_alloc: int
    highest_v: int           # highest register number used (-1 if none)
    highest_a: int
    highest_s: int


def registers(info, insts) -> Registers:
    kd = info.descriptor
    md = info.metadata
    hi = {"v": -1, "a": -1, "s": -1}
    for inst in insts:
        for op in inst.ops:
            if op.kind in ("v", "a") or (op.kind == "s" and op.index < 102):
                hi[op.kind] = max(hi[op.kind], op.index + op.count - 1)
    vgpr = int(md.get(".vgpr_count", vgpr_alloc(info)))
    if ".agpr_count" in md:
        agpr = int(md[".agpr_count"])
    else:
        agpr = hi["a"] + 1
    return Registers(int(md.get(".sgpr_count", sgpr_alloc(info))), vgpr, agpr, kd.accum_offset,
                     vgpr_alloc(info), sgpr_alloc(info),
                     hi["v"], hi["a"], hi["s"])


def occupancy(regs: Registers, lds_bytes: int, workgroup_size: int) -> Occupancy:
    """The emulator's occupancy rule (emu.occupancy, written once) at these registers."""
    return occupancy_rule(regs.vgpr_alloc, regs.sgpr_alloc, lds_bytes, workgroup_size)


# ---------------------------------------------------------------- the report
@dataclass
class Stats:
    path: str
    kernel: str
    registers: Registers
    lds_bytes: int
    occupancy: Occupancy
    mix: Mix
    loops: list
    hottest: Loop | None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["hottest_index"] = self.loops.index(self.hottest) if self.hottest else None
        return d


def workgroup_size_of(info) -> int:
    md = info.metadata
    reqd = md.get(".reqd_workgroup_size")
    if reqd:
        return int(math.prod(int(v) for v in reqd))
    return int(md.get(".max_flat_workgroup_size", 256))


def analyze(src, kernel: str | None = None, workgroup_size: int | None = None) -> Stats:
    from .. import emu
    mod = emu.load(src)
    k = mod.kernel(kernel)
    return analyze_kernel(k, workgroup_size, src if isinstance(src, str) else getattr(src, "name", "<bytes>"))


def analyze_kernel(k, workgroup_size: int | None = None, path: str = "<bytes>") -> Stats:
    insts = k.program.insts
    # Only this kernel's instructions: from its entry to the next s_endpgm-terminated
    # stretch owned by another kernel is not knowable in general; a .co with one kernel
    # (all of ours and the conformance objects) has them all.
    regs = registers(k.info, insts)
    occ = occupancy(regs, k.info.lds_bytes, workgroup_size or workgroup_size_of(k.info))
    mix = Mix()
    for inst in insts:
        mix.add(inst)
    loops = find_loops(insts)
    return Stats(str(path), k.name, regs, k.info.lds_bytes, occ, mix, loops, hottest_loop(loops))


def _kb(n: int) -> str:
    return f"{n / 1024:.1f} KiB"


def format_mix(mix: Mix) -> str:
    order = [c for c in CLASSES if mix.counts.get(c)]
    return " ".join(f"{c}={mix.counts[c]}" for c in order)


def format_stats(s: Stats) -> str:
    r, o = s.registers, s.occupancy
    lines = [
        f"{s.path}: kernel {s.kernel}",
        f"  registers  SGPR {r.sgpr_count} (alloc {r.sgpr_alloc}, highest s{r.highest_s})  "
        f"VGPR {r.vgpr_count} unified (alloc {r.vgpr_alloc}, accum_offset {r.accum_offset}, "
        f"highest v{r.highest_v})  AGPR {r.agpr_count} (highest a{r.highest_a})",
        f"  LDS        {s.lds_bytes} B ({_kb(s.lds_bytes)}) of {_kb(P.LDS_BYTES_PER_CU)} per CU",
        f"  occupancy  workgroup {o.workgroup_size} threads = {o.waves_per_workgroup} waves; "
        f"limits: VGPR {o.limit_vgpr} waves/SIMD, SGPR {o.limit_sgpr} waves/SIMD, "
        f"LDS {o.limit_lds if o.limit_lds < 10 ** 6 else 'none'} WG/CU",
        f"             -> {o.workgroups_per_cu} workgroup(s)/CU, {o.waves_per_simd:g} waves/SIMD "
        f"(limited by {o.limited_by})",
        f"  static mix {s.mix.instructions} instructions: {format_mix(s.mix)}",
        f"  loops      {len(s.loops)} (backward branches)",
    ]
    for n, lp in enumerate(s.loops):
        mark = " <- hottest" if lp is s.hottest else ""
        it = f", executed {lp.executed_iterations} iterations" if lp.executed_iterations else ""
        lines.append(f"    [{n}] {lp.start:#x}..{lp.end:#x} depth {lp.depth}"
                     f"{' innermost' if lp.innermost else ''}, {lp.mix.instructions} instructions, "
                     f"{lp.forward_branches} forward branch(es), {lp.exits} exit(s){it}{mark}")
        lines.append(f"        mix: {format_mix(lp.mix)}")
    h = s.hottest
    if h is not None:
        m = h.mix
        other = {k: v for k, v in m.counts.items() if k != "mfma"}
        lines += [
            f"  hottest loop {h.start:#x}..{h.end:#x}, per iteration per wave (straight-line body):",
            f"    MFMA {m.mfma} instructions, {m.mfma_cycles} MFMA cycles (passes x 4), "
            f"{m.mfma_flops} FLOP",
            f"    other issue: VALU {other.get('valu', 0)}, trans {other.get('trans', 0)}, "
            f"SALU {other.get('salu', 0)}, SMEM {other.get('smem', 0)}, DS {other.get('ds', 0)}, "
            f"VMEM {other.get('vmem', 0)}, LDS-DMA {other.get('lds_dma', 0)}, branch {other.get('branch', 0)}, "
            f"waitcnt {other.get('waitcnt', 0)}, barrier {other.get('barrier', 0)}, nop/prio {other.get('nop', 0)}",
            f"    bytes from global memory {m.global_read_bytes} (of which LDS-DMA "
            f"{m.lds_dma_bytes}), to global {m.global_write_bytes}; "
            f"LDS read {m.lds_read_bytes}, LDS write {m.lds_write_bytes}",
        ]
        if h.forward_branches:
            lines.append(f"    note: the body has {h.forward_branches} forward branch(es); straight-line "
                         f"counts include code a given iteration may skip")
    return "\n".join(lines)

