"""Wait-state hazards software must cover on gfx950, checked in strict mode.

Each wave has a wait-state clock: every issued instruction advances it by 1 and
`s_nop N` by N+1. Every register remembers the clock value and the kind of the
instruction that last wrote it (`written_at`, `written_by`). A consumer reading (or
overwriting) the register then needs `clock_now - written_at - 1 >= required`.

These counts are the compiler's model, not silicon measurements: an emulator that
ignored them would pass kernels that read stale MFMA results on real hardware.

Rules checked (P = the producing MFMA's passes; sources: [FS] the shared fact sheet
../shared/docs/gfx950-isa-facts.md §4; [LLVM] llvm/lib/Target/AMDGPU/GCNHazardRecognizer.cpp
of LLVM 22 with the gfx950 (`IsGFX950`) terms, function named in brackets):

  producer -> consumer                                           wait states
  XDL MFMA result -> VALU read (incl. v_accvgpr_read), VMEM/DS    P+3+(P!=2): 2-pass 5,
      read of it (store data, address), MFMA srcA/B/scale          4: 8, 8: 12, 16: 20
      [FS; LLVM checkMAIVALUHazards GFX940_XDL_N_PassWriteVgprVALUMemExpReadWaitStates,
      checkMAIHazards90A GFX940_XDL_N_PassWritesVGPROverlappedSrcABWaitStates]
  XDL MFMA result -> VALU/v_accvgpr_write/VMEM or DS load         same as above
      overwriting it (WAW) [FS; LLVM checkMAIVALUHazards GFX940_XDL_N_PassWriteVgprVALUWawWaitStates]
  XDL MFMA -> MFMA srcC, exactly the registers it wrote           0
      ("FullReg": same first register and size) [FS; LLVM checkMAIHazards90A]
  XDL MFMA -> XDL MFMA srcC overlapping but not equal             P+2: 4-pass 6, 8: 10, 16: 18
      [FS; LLVM GFX940_XDL_N_PassWritesVGPROverlappedXDLOrSMFMASrcCWaitStates]
  XDL MFMA -> non-XDL (f32) MFMA srcC overlapping                 P+1+(P!=2)
      [LLVM GFX940_XDL_N_PassWritesVGPROverlappedSGEMMDGEMMSrcCWaitStates]
  non-XDL MFMA result -> VALU/VMEM/DS read, srcA/B, WAW           P+2  [LLVM GFX940_SMFMA_*]
  non-XDL MFMA -> non-XDL srcC overlapping / XDL srcC             P / 0 (2-pass FullReg: 2)
  XDL MFMA reads srcC -> VALU or load overwrites it (WAR)         P-1: 2-pass 1, 4: 3, 8: 7, 16: 15
      [FS; LLVM checkMAIVALUHazards SMFMA*ReadVgprVALUWarWaitStates, GFX940_XDL4Pass...]
  VALU (incl. trans, v_accvgpr_write) writes VGPR -> MFMA reads it (any operand)   2
      [FS; LLVM checkMAIHazards90A LegacyVALUNotDotWritesVGPRWaitStates]
  VALU writes EXEC -> MFMA                                        4  [FS; LLVM VALUWritesExecWaitStates]
  VALU writes EXEC -> DPP                                         5  [FS; LLVM checkDPPHazards]
  VALU writes EXEC -> v_readlane/v_readfirstlane/v_writelane      4
      [LLVM checkVALUHazards VALUWriteEXECRWLane, gfx940+]
  v_cmpx writes EXEC -> v_permlane16/32_swap                      4  [LLVM checkPermlaneHazards]
  VALU writes VGPR -> DPP read of it                              2  [FS; LLVM checkDPPHazards]
  VALU writes VGPR -> v_permlane16/32_swap reads it               2  [FS; LLVM checkPermlaneHazards]
  VALU writes VGPR -> v_readlane/v_readfirstlane reads it         1
      [FS; LLVM checkVALUHazards VALUWriteVGPRReadlaneRead]
  VALU writes SGPR -> VMEM reads it (rsrc, saddr, soffset)        5  [FS; LLVM checkVMEMHazards]
  VALU writes SGPR/VCC -> VALU reads it                           2
      [FS; LLVM checkVALUHazards VALUWriteSGPRVALUReadWaitstates, gfx940+]
      except as the carry-in of v_addc/v_subb/v_subbrev: 0. LLVM counts that read too, but
      AMD's rocRoller (Scheduling/Observers/WaitState/VALUWriteSGPRVCC94x.hpp: "If the
      SGPR/VCC is read as a carry in these cases, 0 NOPs are required") does not, and
      aiter's hardware-proven pa_bf16_noquant_gqa8_1tg_4w.co issues v_addc_co_u32 directly
      after the v_add_co_u32 that writes its VCC carry (160 times).
  VALU writes SGPR -> v_readlane/v_writelane lane select          4  [FS; LLVM checkRWLaneHazards]
  transcendental result -> non-transcendental VALU read           1
      [FS; LLVM checkVALUHazards TransDefWaitstates]
  VALU writing part of a dword at a shifted position (VOP3 op_sel[3] = dst high half,
      SDWA dst_sel != DWORD, fp8 dst byte select, fp4 sr cvt_scalef32; this covers
      v_cvt_scalef32_* high-half writes) -> VALU reading OR writing that VGPR   1
      [FS "CvtScaleForwarding"; LLVM checkVALUHazards Shift16DefWaitstates,
      getDstSelForwardingOperand / consumesDstSelForwardingOperand]
  >64-bit store data (global/flat x3/x4; buffer x3/x4) -> VALU overwrites it
      2; none for a buffer store whose soffset is an SGPR
      [FS; LLVM createsVALUHazard: "this hazard only exists if the instruction is not
      using a register in the soffset field"; llc-22 -mcpu=gfx950 post-RA-hazard-rec
      puts s_nop 1 after buffer_store_dwordx4 with soffset 0 and nothing with soffset
      s4 (docs/conformance.md, f4gemm noBpreShuffle)]

Deliberately not checked:
  * s_mov m0 -> MUBUF LDS DMA (LLVM: 1): aiter's hardware-proven gfx950 kernels put every
    `buffer_load ... lds` directly after the SALU write of m0, and CDNA4 Table 11 lists
    only the global/scratch LDS forms (docs/isa-notes.md); global_load_lds keeps 1.
  * VALU writes VCC -> v_div_fmas (4), s_setreg -> s_getreg (2): the emulator does not
    implement those consumers. DGEMM (f64 MFMA) timings: treated as non-XDL.
  * LLVM's DPP rule also counts any non-VALU writer within 2 wait states (e.g. a load
    landing); results of loads here become visible only at an s_waitcnt, so they carry
    no wait-state writer.

Memory ordering (in-flight loads, LDS races) is checked in machine.py and lds.py; this
module also advances the per-wave barrier epoch that lds.py's race check uses.
"""
from __future__ import annotations

import re

import numpy as np


# Rules a launch may waive (Kernel.launch(waive=...)): each is contradicted by a
# hardware-proven third-party code object; our own kernels are held to them.
WAIVABLE = {
    "xdl_result_valu_read": (
        "XDL MFMA result read by a VALU op sooner than LLVM's passes+4 wait states. aiter's "
        "fp8gemm_bf16_blockscale_BpreShuffle_128x128.co does it 42 times at 2 wait states (e.g. "
        "v_pk_fma_f32 at pc 0x3178) and needs the final value there; the CDNA4 ISA (ch. 7, §7.6) "
        "says software must wait. docs/isa-notes.md"),
    "valu_write_dpp_read": (
        "VGPR written by a VALU op read by a DPP op 1 wait state later (LLVM and the ISA's "
        "wait-state table: 2). aiter's pa_bf16_pertokenFp8_gqa16_2tg_4w.co does it with the DPP "
        "source (v_mov_b32_dpp v38, v120 row_shr:8 at pc 0x4e84, one op after the "
        "v_cndmask_b32 that writes v120), f8_block_scale_mi350_x32.co with the second source "
        "(pc 0x2f58). docs/isa-notes.md"),
}


def check_waivers(names) -> frozenset:
    unknown = sorted(set(names) - set(WAIVABLE))
    if unknown:
        raise ValueError(f"unknown hazard rule(s) to waive: {', '.join(unknown)}; "
                         f"waivable: {', '.join(WAIVABLE)}")
    return frozenset(names)


# Writer codes stored per register. MFMA writers store MFMA_BASE + passes (XDL) or
# SMFMA_BASE + passes (non-XDL: the f32-input and f64 MFMAs); use mfma_writer().
NONE, VALU, TRANS, SALU, DST_SEL, ACCVGPR_WRITE = range(6)
CVT_SCALE_HI = DST_SEL      # v_cvt_scalef32_* with op_sel[3]: one case of dst-sel forwarding
MFMA_BASE = 16
SMFMA_BASE = 48

VMEM_CLASSES = ("vmem", "lds_dma")
VALU_CLASSES = ("valu", "trans")
_VALU_WRITERS = np.array([VALU, TRANS, DST_SEL, ACCVGPR_WRITE])
_NEVER = -(1 << 40)

_NON_XDL = re.compile(r"^v_mfma_(f64_.*|f32_\d+x\d+x\d+(_\d+b)?_?f32)$")


def is_xdl(name: str) -> bool:
    """gfx940+ runs every MFMA on the XDL pipe except the f32-input and f64 ones."""
    return not _NON_XDL.match(name)


def mfma_writer(name: str, passes: int) -> int:
    """The writer code an MFMA handler passes to set_v for its destination."""
    return (MFMA_BASE if is_xdl(name) else SMFMA_BASE) + int(passes)


def wait_states(inst) -> int:
    if inst.name == "s_nop":
        return int(inst.ops[0].text, 0) + 1 if inst.ops else 1
    return 1


# ------------------------------------------------------------------ helpers
def _xdl(writer):
    return (writer >= MFMA_BASE) & (writer < SMFMA_BASE)


def _smfma(writer):
    return writer >= SMFMA_BASE


def _passes(writer):
    return np.where(writer >= SMFMA_BASE, writer - SMFMA_BASE, writer - MFMA_BASE)


def _mfma_result_need(writer):
    """MFMA result -> VALU/VMEM/DS read, MFMA srcA/B, or WAW (0 where not an MFMA)."""
    p = _passes(writer)
    xdl = p + 3 + (p != 2)
    return np.where(_xdl(writer), xdl, np.where(_smfma(writer), p + 2, 0))


_IS_VALU_WRITER = np.zeros(128, bool)
_IS_VALU_WRITER[_VALU_WRITERS] = True


def _valu_writer(writer):
    return _IS_VALU_WRITER[writer]


class _Side:
    """Per-register history beyond the last writer: MFMA srcC reads (for WAR) and
    >64-bit store data reads. Kept on the Waves object, created on first use."""

    def __init__(self, waves):
        shape = waves.busy["v"].shape
        self.srcc_at = {k: np.full(shape, _NEVER, np.int64) for k in ("v", "a")}
        self.srcc_passes = {k: np.zeros(shape, np.int16) for k in ("v", "a")}
        self.store_at = {k: np.full(shape, _NEVER, np.int64) for k in ("v", "a")}
        self.store_window = {k: np.zeros(shape, np.int8) for k in ("v", "a")}


def _side(ex) -> _Side:
    side = getattr(ex.waves, "_hazard_side", None)
    if side is None:
        side = ex.waves._hazard_side = _Side(ex.waves)
    return side


def _full_reg(ex, kind, w, index, count, writer, at):
    """bool[n]: the registers read are exactly the destination of one MFMA."""
    same = _xdl(writer) | _smfma(writer)
    same = same.all(axis=1) & (at == at[:, :1]).all(axis=1) & (writer == writer[:, :1]).all(axis=1)
    waves = ex.waves
    for nb in (index - 1, index + count):
        if 0 <= nb < waves.written_at[kind].shape[1]:
            nb_at = waves.written_at[kind][w, nb]
            nb_by = waves.written_by[kind][w, nb]
            same &= ~((nb_at == at[:, 0]) & (nb_by == writer[:, 0]))
    return same


def _rule(klass, role, kind, xdl_inst, carry_in, waived, writer, full):
    """Wait states a consumer (klass, role) of a `kind` register needs after each last
    writer code in `writer`. xdl_inst: the consumer is an XDL MFMA; carry_in: the SGPR is
    read as a carry-in / lane mask; full: the srcC registers are exactly one MFMA's
    destination (bool[n, 1] or a scalar); waived: the WAIVABLE rule names not enforced."""
    waived_xdl = "xdl_result_valu_read" in waived
    waived_dpp = "valu_write_dpp_read" in waived
    need = np.zeros(writer.shape, np.int64)
    valu_w = _valu_writer(writer)
    if kind in ("v", "a"):
        if klass == "mfma":
            need = np.where(valu_w, 2, need)
            if role == "c":
                p = _passes(writer)
                if xdl_inst:
                    xdl_c = p + 2                                   # gfx950: XDL -> XDL srcC
                    smfma_c = np.zeros_like(p)                      # non-XDL -> XDL srcC: none
                else:
                    xdl_c = p + 1 + (p != 2)
                    smfma_c = np.where(full, np.where(p == 2, 2, 0), p)
                need = np.where(_xdl(writer), np.where(full, 0, xdl_c), need)
                need = np.where(_smfma(writer), smfma_c, need)
            else:
                need = np.maximum(need, _mfma_result_need(writer))
        else:
            # VALU (incl. v_accvgpr_read), VMEM/DS store data and addresses.
            need = _mfma_result_need(writer)
            if klass in VALU_CLASSES and waived_xdl:
                need = np.where(_xdl(writer), 0, need)
            if klass in VALU_CLASSES:
                need = np.where(writer == DST_SEL, np.maximum(need, 1), need)
                if klass == "valu":
                    need = np.where(writer == TRANS, np.maximum(need, 1), need)
            if role == "permlane" or (role == "dpp" and not waived_dpp):
                need = np.where(valu_w, np.maximum(need, 2), need)
            elif role == "dpp":
                need = np.where(valu_w, np.maximum(need, 1), need)
            elif role == "readlane":
                need = np.where(valu_w, np.maximum(need, 1), need)
    else:  # SGPRs
        if role == "m0_dma":
            return np.where(writer == SALU, 1, need)   # SALU m0 -> global_load_lds (mem.py)
        if klass in VMEM_CLASSES:
            need = np.where(valu_w, 5, need)
        elif klass in VALU_CLASSES or klass == "mfma":
            if carry_in:
                return need         # a carry-in read needs none (see the module docstring)
            need = np.where(valu_w, 4 if role == "lane_select" else 2, need)
    return need


_NEED_TABLES: dict = {}
_FULL_NOT_LARGER: dict = {}     # id(full table) -> its needs never exceed the not-full table's
_ALL_WRITERS = np.arange(128)[None, :]


def _need_tables(ex, kind, index):
    """(need if not full, need if full, the larger of the two): int64[128] per writer
    code, for the current consumer; _rule evaluated once per consumer class over every
    writer code."""
    klass, role = ex.klass, getattr(ex, "role", None)
    xdl_inst = klass == "mfma" and role == "c" and is_xdl(ex.inst.name)
    carry_in = kind == "s" and (klass in VALU_CLASSES or klass == "mfma") and _is_carry_in(ex.inst, index)
    key = (klass, role, kind, xdl_inst, carry_in, ex.waived)
    tables = _NEED_TABLES.get(key)
    if tables is None:
        tables = tuple(np.ascontiguousarray(np.broadcast_to(
            _rule(klass, role, kind, xdl_inst, carry_in, ex.waived, _ALL_WRITERS, full), _ALL_WRITERS.shape)[0])
            for full in (False, True))
        if np.array_equal(tables[0], tables[1]):
            tables = (tables[0], tables[0])
        tables += (np.maximum(tables[0], tables[1]),)
        for t in tables:
            t.flags.writeable = False
        # setdefault, not a plain store: when two threads build the same key at once, both
        # use the first one stored, which stays alive for good — _FULL_NOT_LARGER is keyed
        # by id(table), and a losing thread's table, freed after its call, could hand its
        # id to another array.
        tables = _NEED_TABLES.setdefault(key, tables)
    return tables


def _required_for_read(ex, kind, w, index, count, writer, at, gap=None):
    """Wait states the current instruction needs after each register's last writer.

    With `gap` given, may return a need no smaller than the exact one when even that one
    leaves no register short (then the exact one does not either)."""
    not_full, full_t, _ = _need_tables(ex, kind, index)
    need = not_full[writer]
    if full_t is not not_full and ex.klass == "mfma" and getattr(ex, "role", None) == "c":
        monotone = _FULL_NOT_LARGER.get(id(full_t))
        if monotone is None:
            monotone = _FULL_NOT_LARGER[id(full_t)] = bool((full_t <= not_full).all())
        if gap is not None and monotone and not (gap < need).any():
            return need
        alt = full_t[writer]
        if (alt != need).any():
            full = _full_reg(ex, kind, w, index, count, writer, at)[:, None]
            need = np.where(full, alt, need)
    return need


_CARRY_IN_OPS = ("v_addc_co_u32", "v_subb_co_u32", "v_subbrev_co_u32")


def _is_carry_in(inst, index: int) -> bool:
    """The SGPR pair is read as a per-lane carry-in or v_cndmask's lane mask.

    CDNA4 ISA Table 11: "VALU reads SGPR as carry-in" needs 0 wait states after a VALU
    write (2 only when read as a constant). v_cndmask's mask is the same kind of per-lane
    read; aiter's hardware-proven fwd and paged-attention kernels read a fresh v_cmp mask
    with v_cndmask 0-1 wait states later about 220 times (docs/research-hazards-oob.md)."""
    ops = inst.ops
    if inst.name in _CARRY_IN_OPS:
        return len(ops) > 4 and ops[4].kind == "s" and ops[4].index == index
    if inst.name == "v_cndmask_b32":
        return len(ops) > 3 and ops[3].kind == "s" and ops[3].index == index
    return False


def _writer_name(code: int) -> str:
    if code >= SMFMA_BASE:
        return f"a {code - SMFMA_BASE}-pass non-XDL MFMA"
    if code >= MFMA_BASE:
        return f"a {code - MFMA_BASE}-pass MFMA"
    return {VALU: "a VALU op", TRANS: "a transcendental op", SALU: "a SALU op",
            DST_SEL: "a VALU op writing part of the register (op_sel/SDWA dst_sel/cvt_scalef32 high half)",
            ACCVGPR_WRITE: "v_accvgpr_write"}.get(code, "?")


# ------------------------------------------------------------------ checks
# No rule asks for more wait states than a 16-pass XDL result (16 + 4); registers
# written longer ago than that need no rule lookup (the common case, and the fast path).
MAX_WAIT_STATES = 20


def _all_settled(clock: np.ndarray, at: np.ndarray) -> bool:
    """Every (clock - at - 1) exceeds MAX_WAIT_STATES."""
    if at.size == 0:
        return True
    return bool((clock[:, None] - at).min() > MAX_WAIT_STATES + 1)


def note_recent(waves, kind: str, index: int, count: int, clock: int) -> None:
    """Raise waves.recent for the registers to `clock` (see _settled)."""
    recent = waves.recent[kind]
    for i in range(index, index + count):
        if recent[i] < clock:
            recent[i] = clock


def _settled(ex, kind: str, w, index: int, count: int) -> bool:
    """True when no wave wrote the registers (or read them as MFMA srcC or wide-store
    data) within MAX_WAIT_STATES of the clocks of `w`: every rule is met, for reads and
    for overwrites, without looking at the per-wave records."""
    return ex.clocks(w)[1] - max(ex.waves.recent[kind][index:index + count]) > MAX_WAIT_STATES + 1


def check_read(ex, kind: str, w, index: int, count: int) -> None:
    if not ex.strict:
        return
    waves = ex.waves
    if kind != "s":
        if ex.klass == "mfma" and getattr(ex, "role", None) == "c":
            _note_srcc_read(ex, kind, w, index, count)
        elif getattr(ex, "role", None) == "store" and ex.klass == "vmem" and count > 2:
            _note_wide_store(ex, kind, w, index, count)
    if count and _settled(ex, kind, w, index, count):
        return
    clock = ex.clocks(w)[0]
    fast = getattr(ex, "fast", None)
    if fast is not None:
        not_full, full_t, larger = _need_tables(ex, kind, index)
        # srcC: the FullReg choice made per wave (_required_for_read); else one table
        srcc = full_t is not not_full and ex.klass == "mfma" and getattr(ex, "role", None) == "c"
        if fast.reads_settled(waves.written_at[kind], waves.written_by[kind], ex.wave_ids(w), index, count,
                              clock, not_full if srcc else larger, full_t, srcc):
            return
    at = waves.written_at[kind][w, index:index + count]
    if _all_settled(clock, at):
        return
    writer = waves.written_by[kind][w, index:index + count]
    if not writer.any():
        return
    gap = clock[:, None] - at - 1
    need = _required_for_read(ex, kind, w, index, count, writer, at, gap)
    _require(ex, w, kind, index, gap, need, "read",
             lambda row, col: f"{_writer_name(int(writer[row, col]))} wrote it")


def _require(ex, w, kind: str, index: int, gap: np.ndarray, need: np.ndarray, verb: str, producer):
    """HazardError where a register's `gap` is below its `need`; `producer(row, col)` says
    what the register waits for."""
    short = gap < need
    if short.any():
        row, col = np.argwhere(short)[0]
        ex.hazard(w, short.any(axis=1),
                  f"{kind}{index + col} {verb} {int(gap[row, col])} wait states after "
                  f"{producer(row, col)}; {int(need[row, col])} are required (insert s_nop)")


def _waw_need(valu: bool) -> np.ndarray:
    writer = np.arange(128)
    need = _mfma_result_need(writer)
    if valu:
        need = np.where(writer == DST_SEL, np.maximum(need, 1), need)
    need.flags.writeable = False
    return need


# Wait states a VALU (True) or VMEM/DS (False) write needs after each last-writer code.
_WAW_NEED = {False: _waw_need(False), True: _waw_need(True)}


def check_write(ex, kind: str, w, index: int, count: int) -> None:
    """WAW after an MFMA or a dst-sel VALU write; WAR after an MFMA srcC read or a wide store."""
    if not ex.strict or kind == "s" or ex.klass not in ("valu", "trans", "vmem", "ds"):
        return
    if count and _settled(ex, kind, w, index, count):
        return
    waves = ex.waves
    side = getattr(waves, "_hazard_side", None)
    valu = ex.klass in VALU_CLASSES
    fast = getattr(ex, "fast", None)
    if fast is not None:
        records = (side.srcc_at[kind], side.srcc_passes[kind], side.store_at[kind], side.store_window[kind]) \
            if side is not None else (waves.written_at[kind], waves.written_by[kind]) * 2
        if fast.writes_settled(waves.written_at[kind], waves.written_by[kind], _WAW_NEED[valu], *records,
                               side is not None, valu, ex.wave_ids(w), index, count, ex.clocks(w)[0]):
            return
    clock = ex.clocks(w)[0][:, None]
    at = waves.written_at[kind][w, index:index + count]
    writer = None if _all_settled(clock[:, 0], at) else waves.written_by[kind][w, index:index + count]
    if writer is not None and writer.any():
        _require(ex, w, kind, index, clock - at - 1, _WAW_NEED[valu][writer],
                 "overwritten", lambda row, col: f"{_writer_name(int(writer[row, col]))} wrote it")
    if side is None:
        return
    passes = side.srcc_passes[kind][w, index:index + count]
    if passes.any():
        passes = passes.astype(np.int64)
        _require(ex, w, kind, index, clock - side.srcc_at[kind][w, index:index + count] - 1,
                 np.where(passes > 0, passes - 1, 0), "overwritten",
                 lambda row, col: f"a {int(passes[row, col])}-pass MFMA read it as srcC")
    if valu:
        window = side.store_window[kind][w, index:index + count]
        if window.any():
            window = window.astype(np.int64)
            _require(ex, w, kind, index, clock - side.store_at[kind][w, index:index + count] - 1, window,
                     "overwritten", lambda row, col: "a >64-bit store read it as data")


def _note_srcc_read(ex, kind, w, index, count):
    side = _side(ex)
    clock, _, hi = ex.clocks(w)
    side.srcc_at[kind][w, index:index + count] = clock[:, None]
    note_recent(ex.waves, kind, index, count, hi)
    side.srcc_passes[kind][w, index:index + count] = 0      # filled in when the MFMA writes
    ex.srcc_noted.append((kind, index, count))             # ... by note_write, this step


def _note_wide_store(ex, kind, w, index, count):
    inst = ex.inst
    if inst.name.startswith("buffer_") and inst.ops and inst.ops[-1].kind == "s":
        return              # MUBUF with an SGPR soffset: no hazard (module docstring)
    window = 2
    side = _side(ex)
    clock, _, hi = ex.clocks(w)
    side.store_at[kind][w, index:index + count] = clock[:, None]
    note_recent(ex.waves, kind, index, count, hi)
    side.store_window[kind][w, index:index + count] = window


def note_write(ex, kind: str, w, index: int, count: int, writer: int) -> int:
    """Called by the executor for every register write; returns the writer code to record.

    Refines a VALU writer into DST_SEL when the instruction writes part of the dword at a
    shifted position, and completes the WAR record of an MFMA's srcC read with its passes.
    """
    if not ex.strict or kind == "s":
        return writer
    if writer == VALU and _dst_sel(ex.inst):
        return DST_SEL
    if writer >= MFMA_BASE:
        side = getattr(ex.waves, "_hazard_side", None)
        if side is not None:
            # The srcC reads of this instruction: the registers whose srcc_at is now (the
            # clock advances by at least 1 per instruction, so no earlier read has it).
            passes = writer - MFMA_BASE if writer < SMFMA_BASE else 0   # WAR rule: XDL only
            for k, i, c in ex.srcc_noted:
                side.srcc_passes[k][w, i:i + c] = passes
    return writer


def _dst_sel(inst) -> bool:
    cached = getattr(inst, "_hazard_dst_sel", None)
    if cached is not None:
        return cached
    name, mods = inst.name, inst.mods
    sel = False
    if inst.enc == "sdwa":
        sel = mods.get("dst_sel", "DWORD") != "DWORD"
    else:
        op_sel = mods.get("op_sel")
        vop3p = bool(inst.words) and (inst.words[0] >> 23) == 0x1A7
        if isinstance(op_sel, tuple) and not vop3p and name.startswith("v_"):
            sel = bool(op_sel[-1])
            if "_sr_" in name and ("fp8" in name or "bf8" in name) and len(op_sel) >= 3:
                sel = sel or bool(op_sel[-2])              # fp8 dst byte select op_sel[3:2]
        if "_sr_" in name and ("fp8" in name or "bf8" in name) and mods.get("byte_sel"):
            sel = True
        if name.startswith("v_cvt_scalef32_sr_pk_fp4"):
            sel = True                                      # LLVM: every op_sel value
    inst._hazard_dst_sel = sel
    return sel


def before_issue(ex, w) -> None:
    """EXEC hazards, and the barrier epoch of the LDS race check."""
    if not ex.strict:
        return
    klass, inst = ex.klass, ex.inst
    if klass == "barrier":
        ex.lds.arrive(ex.wave_ids(w))
        return
    name = inst.name
    need, what = 0, ""
    if getattr(inst, "enc", "") == "dpp":
        need, what = 5, "DPP"
    elif klass == "mfma":
        need, what = 4, "an MFMA"
    elif name in ("v_readlane_b32", "v_readfirstlane_b32", "v_writelane_b32"):
        need, what = 4, name
    elif name.startswith(("v_permlane16_swap", "v_permlane32_swap")):
        need, what = 4, name
    if need and ex.waves.exec_valu_written:
        gap = ex.waves.clock[w] - ex.waves.exec_written_at[w] - 1
        short = gap < need
        if short.any():
            ex.hazard(w, short, f"EXEC written by a VALU op (v_cmpx) {int(gap[short][0])} wait states "
                                f"earlier; {need} are required before {what} (insert s_nop)")
