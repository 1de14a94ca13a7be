"""Cycle-approximate model of one MI355X compute unit running recorded wave streams.

Input: the instruction stream each wave executed (trace.py: real control flow from the
emulator) and which SIMD/workgroup it belongs to. The model replays the streams on one
CU and returns the cycles the CU needs.

The machine (every number from params.Params):
  * 4 SIMDs. Each SIMD is offered one issue slot every `issue_quantum` (4) cycles. In a
    slot it issues at most one instruction per category — vector (VALU, transcendental,
    MFMA), scalar (SALU, SMEM), vector memory (global/buffer, LDS DMA), LDS (ds_*),
    branch — each from a different wave, and a wave issues at most one instruction per
    slot (GCN/CDNA issue rules). Internal instructions (s_waitcnt, s_nop, s_setprio,
    s_barrier) use the wave's slot but no unit. Waves compete in the order
    (s_setprio priority, then age).
  * In-order issue per wave: an instruction waits for its source registers (register
    scoreboard with producer latencies), and s_waitcnt waits for the modelled completion
    of the memory operations it covers (vmcnt / lgkmcnt, in issue order).
  * VALU ops keep the SIMD's vector ALU busy `valu_cycles` (transcendentals
    `trans_cycles`, 32-bit integer multiplies `imul_cycles`). An MFMA takes one vector
    issue slot and then occupies the SIMD's matrix pipe for 4 x passes cycles; VALU ops
    (of any wave) run alongside, except in the operand-read hold after each MFMA issue
    (`mfma_hold`: 1 + widest A/B source bytes / 16 issue slots; SGEMM/DGEMM passes + 2;
    on the whole SIMD or only the issuing wave, params.mfma_hold_scope). Packed-FP32
    (v_pk_{fma,mul,add}_f32, v_pk_mov_b32) and DOT ops never issue in an MFMA's shadow:
    they wait until passes + 2 slots after the last MFMA issue on their SIMD (+1 for an A
    source of 16 bytes or more). A trans result reaches a non-trans VALU reader
    `trans_forward_slots` later. An MFMA issues only when the matrix pipe is free; its
    result is readable by non-accumulating consumers (P + 4 wait states after issue).
    A VALU op issued while its SIMD's matrix pipe is busy costs `valu_under_mfma_cycles`
    more (0: a sensitivity knob, no evidence for it).
  * LDS: one pipe per CU (read and write bandwidths); global memory: one pipe per CU at
    the smaller of the CU's sustained L2 bandwidth and its share of HBM bandwidth (scaled
    by the fraction of requested bytes that must come from DRAM), plus a loaded latency
    in nanoseconds (cycles at the launch's clock) to which the DRAM share of the bytes
    adds the extra latency of a DRAM access over a cache hit. Lanes outside a buffer's
    range move no bytes. With params.vmem_inflight_bytes set, a request enters the memory
    system only when the CU's bytes in flight leave room for it (Little's law with a capped
    window: cache hits and DRAM reads share the cap).
  * s_barrier releases `barrier_cycles` after the last live wave of the workgroup arrives.
"""
from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass, field

from ..emu.decode import waitcnt_fields
from . import params as P
from .stats import classify, lane_bytes, mfma_passes, mfma_shape

INF = float("inf")

# issue categories
VEC, SCAL, VMEM, LDS, BR, INTERNAL = range(6)
_CATEGORY = {"valu": VEC, "trans": VEC, "mfma": VEC, "salu": SCAL, "smem": SCAL, "vmem": VMEM,
             "lds_dma": VMEM, "ds": LDS, "branch": BR, "waitcnt": INTERNAL, "barrier": INTERNAL,
             "nop": INTERNAL, "end": INTERNAL}
_IMUL = {"v_mul_lo_u32", "v_mul_hi_u32", "v_mul_hi_i32", "v_mul_lo_i32", "v_mad_u64_u32", "v_mad_i64_i32",
         "v_mad_u32_u24_hi"}
_TWO_DST = re.compile(r"^v_(add|sub|subrev|addc|subb|subbrev)_co_|^v_div_scale|^v_mad_(u|i)64")

# Packed-FP32 and DOT ops: never in an MFMA's shadow (LLVM PR #233721, ATT-fitted; LLVM
# SIInstrInfo::isNeverCoissue lists them; the gluon tutorials' cost table). Packed 16-bit
# ops issue like plain VALU (#233721).
_NO_SHADOW = re.compile(r"^v_pk_(fma|mul|add|mov)_(f32|b32)$|^v_dot")


def mfma_holds(inst, passes: int, prm: P.Params) -> tuple[int, int]:
    """(cycles every VALU is held after this MFMA's issue, cycles a packed-FP32/DOT op is
    held): the operand-read hold 1 + (widest A/B source, bytes per lane) / 16 issue slots
    (+ params.mfma_hold_extra_slots, never below the MFMA's own slot), passes + 2 slots for
    f32/f64-input MFMAs (SGEMM/DGEMM); packed FP32 and DOT wait passes + 2 slots, one more
    for an A source of 16 bytes or more (LLVM PR #233721, ATT-fitted on MI350X)."""
    Q = prm.issue_quantum
    ab = max((4 * o.count for o in inst.ops[1:3] if o.kind in ("v", "a")), default=4)
    shape = mfma_shape(inst)
    if shape is not None and shape[4] in ("f32", "f64"):
        slots = passes + 2
    else:
        slots = max(1, 1 + ab // 16 + prm.mfma_hold_extra_slots)
    return Q * slots, Q * (passes + 2 + (1 if ab >= 16 else 0))


SGPR_BASE, AGPR_BASE = 512, 256
NREGS = 640


def _regs(op) -> range | None:
    if op.kind == "v":
        return range(op.index, op.index + op.count)
    if op.kind == "a":
        return range(AGPR_BASE + op.index, AGPR_BASE + op.index + op.count)
    if op.kind == "s" and op.index < 128:
        return range(SGPR_BASE + op.index, SGPR_BASE + op.index + op.count)
    return None


QUEUE_FORMS = ("mm1", "md1")


def _queue_form(form: str) -> str:
    if form not in QUEUE_FORMS:
        raise ValueError(f"params.dram_queue must be one of {QUEUE_FORMS}, got {form!r}")
    return form


def dram_loaded_latency(prm: P.Params, rho: float) -> float:
    """Latency (ns) of a DRAM-served load at HBM utilisation rho: the unloaded latency
    (cache path + DRAM) stretched by the open-queue form params.dram_queue names: "mm1"
    1 / (1 - rho) (exponential service), "md1" 1 + rho / (2 (1 - rho)) (constant service,
    the Pollaczek-Khinchine mean wait). Both are flat at low load and without bound as the
    achieved bandwidth nears the HBM's sustainable rate; M/D/1 rises half as fast."""
    if not 0.0 <= rho < 1.0:
        raise ValueError(f"rho must be in [0, 1), got {rho}")
    if _queue_form(prm.dram_queue) == "md1":
        return (prm.global_latency_ns + prm.dram_extra_latency_ns) * (1.0 + rho / (2.0 * (1.0 - rho)))
    return (prm.global_latency_ns + prm.dram_extra_latency_ns) / (1.0 - rho)


def hbm_utilisation(demand: float, sustainable: float, form: str = "mm1") -> float:
    """HBM utilisation rho of a launch whose CUs, at unloaded latency, would ask for
    `demand` bytes/s from an HBM that sustains `sustainable` bytes/s. Latency-bound streams
    (Little's law: rate = bytes in flight / latency) slow down as the latency stretches, and
    the achieved rate must be rho x sustainable. a = demand / sustainable; under `form` "mm1"
    (stretch 1 / (1 - rho)) rho = a / (1 + a); under "md1" (stretch 1 + rho / (2 (1 - rho)))
    a (1 - rho) = rho (1 - rho / 2), whose root in [0, 1) is 1 + a - sqrt(1 + a^2)."""
    a = demand / sustainable
    if _queue_form(form) == "md1":
        return (1.0 + a) - math.sqrt(1.0 + a * a)
    return a / (1.0 + a)


@dataclass
class StaticInst:
    klass: str
    cat: int
    busy: int = 0                 # vector ALU cycles (VEC) / 0
    passes: int = 0
    hold: int = 0                 # MFMA: cycles after its issue no VALU may issue (mfma_holds)
    pk_hold: int = 0              # MFMA: cycles after its issue no packed-FP32/DOT op may issue
    no_shadow: bool = False       # a packed-FP32 or DOT op (waits out pk_hold)
    srcs: tuple = ()              # register numbers read
    srcs_c: tuple = ()            # MFMA srcC registers
    dsts: tuple = ()
    vmcnt: int = 63
    lgkmcnt: int = 15
    nop: int = 0
    prio: int = 0
    bytes: tuple = (0, 0, 0, 0)   # per active lane: global read, global write, LDS read, LDS write
    is_load: bool = False
    is_setprio: bool = False
    dram_fraction: float | None = None   # share of this op's bytes that come from DRAM (None: launch-wide)
    in_range: float = 1.0         # share of its active lanes' bytes inside the buffer (trace.py)
    lds_extra: float = 0.0        # bank-conflict cycles per execution charged to the LDS pipe


def register_roles(inst, k: str) -> tuple[tuple, tuple, tuple, bool]:
    """(registers read, registers written, MFMA srcC registers, is a load) of one
    instruction of class `k`, as register numbers (_regs: VGPR, AGPR, SGPR incl. vcc/exec/m0);
    only the registers the instruction names (implicit ones are the caller's business)."""
    ops = inst.ops
    regs = [_regs(o) for o in ops]
    name = inst.name
    dst_idx: set[int] = set()
    is_load = False
    if k in ("valu", "trans", "mfma", "salu", "smem"):
        if ops and not name.startswith(("s_cmp", "s_bitcmp", "s_setprio", "s_nop")):
            dst_idx.add(0)
        if _TWO_DST.match(name):
            dst_idx.add(1)
        if "permlane" in name and "swap" in name:
            dst_idx.update({0, 1})
    elif k in ("vmem", "lds_dma", "ds"):
        gr, gw, lr, lw = lane_bytes(inst)
        loads = (k == "vmem" and gr and not gw) or (k == "ds" and lr and not lw)
        atomic_ret = ("atomic" in name and inst.mods.get("glc")) or ("_rtn" in name)
        if (loads or atomic_ret) and ops:
            dst_idx.add(0)
            is_load = True
    dsts, srcs = [], []
    for n, r in enumerate(regs):
        if r is None:
            continue
        if n in dst_idx:
            dsts.extend(r)
            if "permlane" in name:
                srcs.extend(r)
        elif not (k == "mfma" and n == 3):
            srcs.extend(r)
    srcs_c = tuple(regs[3]) if k == "mfma" and len(ops) > 3 and regs[3] is not None else ()
    return tuple(srcs), tuple(dsts), srcs_c, is_load


def prepare(insts, prm: P.Params) -> list[StaticInst]:
    out = []
    for inst in insts:
        k = classify(inst)
        s = StaticInst(k, _CATEGORY.get(k, VEC))
        ops = inst.ops
        name = inst.name
        srcs, dsts, s.srcs_c, s.is_load = register_roles(inst, k)
        if k in ("vmem", "lds_dma", "ds"):
            s.bytes = lane_bytes(inst)
        if k == "mfma":
            s.passes = mfma_passes(inst)
            s.busy = prm.issue_quantum
            s.hold, s.pk_hold = mfma_holds(inst, s.passes, prm)
        elif k == "trans":
            s.busy = prm.trans_cycles
        elif k == "valu":
            s.busy = prm.imul_cycles if name in _IMUL else prm.valu_cycles
            s.no_shadow = bool(_NO_SHADOW.match(name))
        s.srcs, s.dsts = tuple(srcs), tuple(dsts)
        if k == "waitcnt":
            s.vmcnt, _, s.lgkmcnt = waitcnt_fields(inst)
        elif name == "s_nop":
            s.nop = int(ops[0].text, 0) if ops else 0
        elif name == "s_setprio":
            s.prio = int(ops[0].text, 0) if ops else 0
            s.is_setprio = True
        out.append(s)
    return out


@dataclass
class WaveStream:
    stream: object              # int array of instruction indices
    mem_lanes: object           # active lanes per memory instruction, in order
    group: int                  # index of its workgroup in the CU's queue
    wave: int                   # wave index in the workgroup


@dataclass
class CuResult:
    cycles: float
    mfma_busy: list              # per SIMD, cycles the matrix pipe was busy
    valu_busy: list              # per SIMD, cycles the vector ALU was busy
    issued: dict                 # class -> dynamic instruction count (all waves)
    global_bytes: float
    lds_bytes: float
    barrier_wait: float          # wave-cycles spent waiting at barriers
    group_done: list = field(default_factory=list)   # completion cycle of each workgroup
    dram_bytes: float = 0.0      # bytes its memory instructions moved, times their DRAM share

    @property
    def mfma_utilization(self) -> float:
        return sum(self.mfma_busy) / (len(self.mfma_busy) * self.cycles) if self.cycles else 0.0


class Wave:
    """One wave's issue state on a CU. `head`: index (in the static list) of its next
    instruction; `ws`: its recorded stream when replayed (simulate_cu), else None."""
    __slots__ = ("ws", "pos", "head", "simd", "prio", "age", "earliest", "ready", "ready_m", "ready_c",
                 "vm", "lgkm", "mem_i", "done", "group", "at_barrier", "last_slot", "deps", "hold")

    def __init__(self, group, simd, age, start, head, ws=None):
        self.ws = ws
        self.pos = 0
        self.head = head
        self.simd = simd
        self.prio = 0
        self.age = age
        self.earliest = start
        self.ready = [0.0] * NREGS      # for VALU/SALU/memory consumers
        self.ready_m = [0.0] * NREGS    # for MFMA srcA/srcB
        self.ready_c = [0.0] * NREGS    # for MFMA srcC
        self.vm = []                    # completion times of outstanding vmcnt ops (issue order)
        self.lgkm = []
        self.mem_i = 0
        self.done = False
        self.group = group
        self.at_barrier = False
        self.last_slot = -1
        self.deps = None                # head instruction's register/waitcnt readiness (cached)
        self.hold = 0.0                 # its VALU may not issue before (mfma_hold_scope "wave")


class Cu:
    """One compute unit under the rules of the module docstring: the waves that `join` it,
    issued one slot time at a time by `sweep`. simulate_cu replays recorded streams on it;
    the emulator's hardware-like schedule (gfxasm.perf.timed) drives it live, its issue
    order and load completions deciding which wave runs next and when each load lands.
    A subclass says how many lanes a memory instruction moves (`lanes`), how a wave moves
    on after an issue (`advance`) and what follows a workgroup's end (`group_finished`).
    `load_scoreboard`: a load's destination registers hold back their readers until it
    completes (the replay's assumption; without it only s_waitcnt waits, as on hardware)."""

    def __init__(self, static: list[StaticInst], prm: P.Params, *, clock_hz: float | None = None,
                 dram_fraction: float = 1.0, active_cus: int = P.NUM_CUS, dram_load: float = 0.0,
                 load_scoreboard: bool = True):
        self.st = static
        self.prm = prm
        self.Q = prm.issue_quantum
        clock = clock_hz or prm.clock_hz
        self.global_latency = prm.global_latency_ns * 1e-9 * clock
        # what a DRAM-served byte adds to a cache hit's latency, queueing included
        self.dram_latency = (dram_loaded_latency(prm, dram_load) - prm.global_latency_ns) * 1e-9 * clock
        self.hbm_per_cu = P.HBM_BYTES_PER_S * prm.hbm_efficiency / clock / max(1, active_cus)
        self.cost_lds_r = 1.0 / prm.lds_read_bytes_per_clk
        self.cost_lds_w = 1.0 / prm.lds_write_bytes_per_clk
        self.dram_fraction = dram_fraction
        self.load_scoreboard = load_scoreboard
        nsimd = P.SIMDS_PER_CU
        self.valu_free = [0.0] * nsimd
        self.mfma_free = [0.0] * nsimd
        self.mfma_busy = [0.0] * nsimd
        self.valu_busy = [0.0] * nsimd
        if prm.mfma_hold_scope not in P.HOLD_SCOPES:
            raise ValueError(f"params.mfma_hold_scope must be one of {P.HOLD_SCOPES}, got {prm.mfma_hold_scope!r}")
        self.hold_per_wave = prm.mfma_hold_scope == "wave"
        self.hold_free = [0.0] * nsimd     # no VALU issues before (MFMA operand-read hold, scope "simd")
        self.pk_free = [0.0] * nsimd       # no packed-FP32/DOT op issues before (MFMA shadow)
        self.gpipe = 0.0
        self.lpipe = 0.0
        self.cap = prm.vmem_inflight_bytes
        self.flight: list[tuple[float, float]] = []     # (completion, bytes) of requests in flight
        self.flight_bytes = 0.0
        self.issued: dict[str, int] = {}
        self.totals = {"global": 0.0, "lds": 0.0, "barrier": 0.0, "dram": 0.0}
        self.waves_of: dict[int, list[Wave]] = {}
        self.group_done: dict[int, float] = {}
        self.arrive: dict[int, float] = {}
        self.fresh: list[Wave] = []         # joined waves, entering the arbitration next sweep
        # Per SIMD, its unfinished waves in arbitration order (s_setprio priority, then age),
        # re-sorted only when a wave joins, finishes or changes priority.
        self.by_simd: list[list[Wave]] = [[] for _ in range(nsimd)]
        self.dirty = [True] * nsimd

    # ------------------------------------------------------------ subclass hooks
    def lanes(self, wv: Wave) -> int:
        """Active lanes of the wave's memory instruction being issued."""
        raise NotImplementedError

    def advance(self, wv: Wave, i: int, klass: str, nxt: float) -> float:
        """Move the wave past instruction `i` (set wv.head); returns when it may issue next."""
        raise NotImplementedError

    def group_finished(self, g: int, end: float) -> None:
        """Every wave of workgroup `g` has ended; its last store drains at `end`."""

    # ------------------------------------------------------------------ the rules
    def join(self, g: int, waves: list[Wave]) -> None:
        self.waves_of[g] = waves
        self.fresh.extend(waves)

    def head_deps(self, wv: Wave) -> float:
        """When the wave's next instruction's registers are ready and its waits satisfied
        (its issue slot, wv.earliest, aside). Only the wave's own issues change them, so they
        are computed once per instruction and cached in wv.deps."""
        t = wv.deps
        if t is None:
            s = self.st[wv.head]
            t = 0.0
            if s.cat == VEC and s.klass == "mfma":
                rm = wv.ready_m
                for r in s.srcs:
                    if rm[r] > t:
                        t = rm[r]
                rc = wv.ready_c
                for r in s.srcs_c:
                    if rc[r] > t:
                        t = rc[r]
            else:
                rd = wv.ready
                for r in s.srcs:
                    if rd[r] > t:
                        t = rd[r]
            if s.klass == "waitcnt":
                if len(wv.vm) > s.vmcnt:
                    t = max(t, wv.vm[len(wv.vm) - s.vmcnt - 1])
                if len(wv.lgkm) > s.lgkmcnt:
                    t = max(t, max(wv.lgkm[:len(wv.lgkm) - s.lgkmcnt]))
            wv.deps = t
        return t

    def issue(self, wv: Wave, t: float) -> None:
        """Issue the wave's head instruction at cycle `t`."""
        prm = self.prm
        i = wv.head
        s = self.st[i]
        k = s.klass
        issued = self.issued
        issued[k] = issued.get(k, 0) + 1
        simd = wv.simd
        Q = self.Q
        nxt = t + Q
        if k == "mfma":
            start = t
            dur = P.CYCLES_PER_PASS * s.passes
            self.mfma_free[simd] = start + dur
            self.mfma_busy[simd] += dur
            self.valu_free[simd] = max(self.valu_free[simd], t + Q)
            self.valu_busy[simd] += Q
            if self.hold_per_wave:
                wv.hold = t + s.hold
            elif t + s.hold > self.hold_free[simd]:
                self.hold_free[simd] = t + s.hold
            if t + s.pk_hold > self.pk_free[simd]:
                self.pk_free[simd] = t + s.pk_hold
            rdy = start + dur + prm.mfma_read_extra_slots * Q
            for r in s.dsts:
                wv.ready[r] = rdy
                wv.ready_m[r] = rdy
                wv.ready_c[r] = start + dur - Q      # in-place accumulation: pipe order
        elif k in ("valu", "trans"):
            busy = s.busy + (prm.valu_under_mfma_cycles if self.mfma_free[simd] > t else 0)
            self.valu_free[simd] = t + busy
            self.valu_busy[simd] += busy
            r1 = t + busy
            r2 = max(r1, t + prm.valu_to_mfma_slots * Q)
            r0 = r1 + prm.trans_forward_slots * Q if k == "trans" else r1
            for r in s.dsts:
                wv.ready[r] = r0
                wv.ready_m[r] = r2
                wv.ready_c[r] = r2
        elif k == "salu":
            for r in s.dsts:
                wv.ready[r] = t + Q
                wv.ready_m[r] = t + Q
                wv.ready_c[r] = t + Q
        elif k == "smem":
            done = t + prm.smem_latency
            wv.lgkm.append(done)
            if self.load_scoreboard:
                for r in s.dsts:
                    wv.ready[r] = wv.ready_m[r] = wv.ready_c[r] = done
        elif k in ("vmem", "lds_dma"):
            lanes = self.lanes(wv)
            nbytes = lanes * (s.bytes[0] + s.bytes[1]) * s.in_range
            start = self.window(max(t, self.gpipe), nbytes)
            frac = self.dram_fraction if s.dram_fraction is None else s.dram_fraction
            cost = max(1.0 / prm.l2_bytes_per_clk_per_cu, frac / self.hbm_per_cu)
            self.gpipe = start + nbytes * cost
            done = self.gpipe + self.global_latency + frac * self.dram_latency
            if wv.vm and wv.vm[-1] > done:
                done = wv.vm[-1]
            wv.vm.append(done)
            if self.cap is not None:
                heapq.heappush(self.flight, (done, nbytes))
                self.flight_bytes += nbytes
            self.totals["global"] += nbytes
            self.totals["dram"] += nbytes * frac
            if s.is_load and self.load_scoreboard:
                for r in s.dsts:
                    wv.ready[r] = wv.ready_m[r] = wv.ready_c[r] = done
        elif k == "ds":
            lanes = self.lanes(wv)
            rb, wb = lanes * s.bytes[2], lanes * s.bytes[3]
            start = max(t, self.lpipe)
            self.lpipe = start + rb * self.cost_lds_r + wb * self.cost_lds_w + s.lds_extra
            done = self.lpipe + prm.lds_latency
            if wv.lgkm and wv.lgkm[-1] > done:
                done = wv.lgkm[-1]
            wv.lgkm.append(done)
            self.totals["lds"] += rb + wb
            if s.is_load and self.load_scoreboard:
                for r in s.dsts:
                    wv.ready[r] = wv.ready_m[r] = wv.ready_c[r] = done
        elif k == "waitcnt":
            if len(wv.vm) > s.vmcnt:
                del wv.vm[:len(wv.vm) - s.vmcnt]
            if len(wv.lgkm) > s.lgkmcnt:
                del wv.lgkm[:len(wv.lgkm) - s.lgkmcnt]
        elif k == "nop":
            if s.nop:
                nxt = t + (s.nop + 1) * Q
            if s.is_setprio:
                wv.prio = s.prio
        nxt = self.advance(wv, i, k, nxt)
        wv.deps = None
        wv.earliest = nxt
        wv.last_slot = t
        if k == "barrier":
            wv.at_barrier = True
            wv.earliest = INF
            self._try_release(wv.group, t)
        elif k == "end" or wv.head < 0:
            finish = max([t + Q] + wv.lgkm)     # stores drain after the wave ends (vm not waited)
            wv.done = True
            wv.earliest = finish
            self._try_release(wv.group, t)
            waves = self.waves_of[wv.group]
            if all(w.done for w in waves):
                end = max(w.earliest for w in waves)
                self.group_done[wv.group] = end
                self.group_finished(wv.group, end)

    def window(self, start: float, nbytes: float) -> float:
        """When a vector-memory request of `nbytes` may enter the memory system, at `start` or
        later: once the CU's bytes in flight (params.vmem_inflight_bytes) leave room for it,
        earlier requests leaving in completion order (a request holds its bytes until its wave
        may count it returned: in issue order, as vmcnt does). A request larger than the cap
        waits for all in flight."""
        if self.cap is None:
            return start
        flight = self.flight
        while flight and (flight[0][0] <= start or self.flight_bytes + nbytes > self.cap):
            done, b = heapq.heappop(flight)
            self.flight_bytes -= b
            if done > start:
                start = done
        return start

    def _try_release(self, g: int, t: float) -> None:
        """s_barrier releases `barrier_cycles` after the last live wave of `g` arrives."""
        arrive = self.arrive
        arrive[g] = max(arrive.get(g, 0.0), t)
        alive = [w for w in self.waves_of[g] if not w.done]
        if alive and all(w.at_barrier for w in alive):
            rel = arrive[g] + self.prm.barrier_cycles
            for w in alive:
                self.totals["barrier"] += rel - w.last_slot
                w.at_barrier = False
                w.earliest = rel
            arrive[g] = 0.0

    def sweep(self, now: float) -> float | None:
        """One issue slot at cycle `now` on every SIMD: issue what may issue (`issue`), in
        arbitration order. Returns the earliest cycle at which anything may issue next, or
        None when every wave has ended."""
        by_simd, dirty, fresh, st = self.by_simd, self.dirty, self.fresh, self.st
        valu_free, mfma_free = self.valu_free, self.mfma_free
        hold_free, pk_free, hold_per_wave = self.hold_free, self.pk_free, self.hold_per_wave
        Q = self.Q
        for w in fresh:
            by_simd[w.simd].append(w)
            dirty[w.simd] = True
        fresh.clear()
        for simd in range(len(by_simd)):
            if dirty[simd]:
                by_simd[simd] = sorted((w for w in by_simd[simd] if not w.done), key=_order_key)
                dirty[simd] = False
        if not any(by_simd):
            return None
        next_t = INF
        for simd in range(len(by_simd)):
            cands = by_simd[simd]
            used = set()
            for w in cands:
                if w.at_barrier or w.done:
                    continue
                t = w.deps
                if t is None:
                    t = self.head_deps(w)
                if w.earliest > t:
                    t = w.earliest
                s = st[w.head]
                cat = s.cat
                if cat == VEC:
                    unit = valu_free[simd]
                    if s.klass == "mfma":
                        if mfma_free[simd] > unit:
                            unit = mfma_free[simd]
                    else:
                        hold = w.hold if hold_per_wave else hold_free[simd]
                        if hold > unit:
                            unit = hold
                        if s.no_shadow and pk_free[simd] > unit:
                            unit = pk_free[simd]
                    if unit > t:
                        t = unit
                if t > now:
                    if t < next_t:
                        next_t = t
                    continue
                if cat != INTERNAL and cat in used:
                    if now + Q < next_t:
                        next_t = now + Q
                    continue
                if cat != INTERNAL:
                    used.add(cat)
                self.issue(w, now)
                if w.done or s.is_setprio:
                    dirty[simd] = True
                w_next = w.earliest
                if w_next < next_t and not w.done and not w.at_barrier:
                    next_t = w_next
        # waves released from barriers / new launches may be ready earlier
        for group in by_simd + [fresh]:
            for w in group:
                if not w.done and not w.at_barrier and w.earliest < next_t:
                    next_t = w.earliest
        if next_t == INF and any(not w.done for group in by_simd + [fresh] for w in group):
            raise RuntimeError("timing model deadlock: waves wait at a barrier that cannot release")
        return next_t


def _order_key(w: Wave):
    return (-w.prio, w.age)


class _Replay(Cu):
    """simulate_cu's CU: recorded streams, at most `groups_resident` workgroups at once."""

    def __init__(self, static, prm, streams: list[WaveStream], waves_per_group: int, groups_resident: int, **kw):
        super().__init__(static, prm, **kw)
        self.waves_per_group = waves_per_group
        self.by_group: dict[int, list[WaveStream]] = {}
        for ws in streams:
            self.by_group.setdefault(ws.group, []).append(ws)
        self.order = sorted(self.by_group)
        self.pending = list(self.order)
        self.group_slot: dict[int, int] = {}
        self.free_slots = list(range(groups_resident))
        self.age = 0
        while self.pending and self.free_slots:
            self.launch(self.pending.pop(0), 0.0)

    def launch(self, g: int, t: float) -> None:
        slot = self.free_slots.pop(0)
        self.group_slot[g] = slot
        waves = []
        for ws in sorted(self.by_group[g], key=lambda w: w.wave):
            simd = (ws.wave + slot * self.waves_per_group) % P.SIMDS_PER_CU
            waves.append(Wave(g, simd, self.age, t, ws.stream[0], ws))
            self.age += 1
        self.join(g, waves)

    def lanes(self, wv: Wave) -> int:
        mem_lanes = wv.ws.mem_lanes
        lanes = int(mem_lanes[wv.mem_i]) if wv.mem_i < len(mem_lanes) else 64
        wv.mem_i += 1
        return lanes

    def advance(self, wv: Wave, i: int, klass: str, nxt: float) -> float:
        stream = wv.ws.stream
        wv.pos += 1
        if wv.pos >= len(stream):
            wv.head = -1
            return nxt
        wv.head = stream[wv.pos]
        if klass == "branch" and wv.head != i + 1:
            nxt += self.prm.branch_taken_cycles
        return nxt

    def group_finished(self, g: int, end: float) -> None:
        self.free_slots.append(self.group_slot[g])
        self.free_slots.sort()
        if self.pending:
            self.launch(self.pending.pop(0), end)


def simulate_cu(streams: list[WaveStream], insts, *, waves_per_group: int, groups_resident: int,
                prm: P.Params = P.DEFAULT, dram_fraction: float = 1.0,
                active_cus: int = P.NUM_CUS, static: list[StaticInst] | None = None,
                clock_hz: float | None = None, dram_load: float = 0.0) -> CuResult:
    """Replay the wave streams of one CU's workgroups; at most `groups_resident` at once.
    `clock_hz`: the engine clock the cycles run at (default the peak), which sets the
    cycles of the memory system's per-second rates and nanosecond latencies.
    `dram_load`: the chip's HBM utilisation rho (0 <= rho < 1) while the launch runs; a
    DRAM access then waits 1 / (1 - rho) times its unloaded latency (queueing at the
    memory controllers, see dram_loaded_latency)."""
    st = static or prepare(insts, prm)
    cu = _Replay(st, prm, streams, waves_per_group, groups_resident, clock_hz=clock_hz,
                 dram_fraction=dram_fraction, active_cus=active_cus, dram_load=dram_load)
    Q = prm.issue_quantum
    now = 0.0
    while True:
        next_t = cu.sweep(now)
        if next_t is None or next_t == INF:
            break
        now = math.ceil(max(next_t, now + Q) / Q) * Q
    done = cu.group_done
    cycles = max(done.values()) if done else now
    cycles = max(cycles, cu.gpipe, cu.lpipe)       # stores still draining after the last wave
    t = cu.totals
    return CuResult(cycles, cu.mfma_busy, cu.valu_busy, cu.issued, t["global"], t["lds"], t["barrier"],
                    [done[g] for g in cu.order if g in done], t["dram"])
