"""Wave modes that change how later vector instructions run: VSKIP and VGPR index mode.

ISA (Vega / CDNA3 / CDNA4 instruction descriptions):
  s_setvskip S0, S1          VSKIP = S0[S1[4:0]]. "When VSKIP is enabled, no VOP*/M*BUF/
                             MIMG/DS/FLAT/EXP instructions are issued." Skipped here: every
                             VALU, trans, MFMA, VMEM, LDS-DMA and DS instruction.
  s_set_gpr_idx_on S0, mode  MODE.gpr_idx_en = 1; M0[7:0] = S0[7:0]; M0[15:12] = mode (the
                             raw SIMM4: bit 0 SRC0, 1 SRC1, 2 SRC2, 3 DST; LLVM prints
                             gpr_idx(SRC0,SRC1,SRC2,DST)).
  s_set_gpr_idx_off          MODE.gpr_idx_en = 0.
  s_set_gpr_idx_idx S0       M0[7:0] = S0[7:0].
  s_set_gpr_idx_mode mode    M0[15:12] = mode.
While the index mode is on, a VALU instruction's VGPR operands in the enabled fields
address register (number + M0[7:0]); SGPR and constant operands are not moved. Fields:
DST is the first printed operand, SRC0.. the following ones. That an AGPR source moves
too (v_accvgpr_read_b32 vN, aK reads a(K + idx)) is what aiter's hardware-proven
f4gemm_bf16_per1x32Fp4_noBpreShuffle_256x256.co relies on (it steps the index over its
accumulators around unchanged `v_accvgpr_read_b32 v12, a0`).

Rejected as unmodelled (UnsupportedInstruction): a non-VALU vector instruction (MFMA,
VMEM, DS) or a two-destination VALU op (v_*_co_*, v_div_scale, v_mad_*64) while the
index mode is on, and an indexed register beyond the file.

Not enforced: the ISA's notes for s_setvskip ("if any vector operations are
outstanding, S_WAITCNT must be issued before executing"; "requires one wait state
after") — aiter's hardware-proven fused-MoE objects (fmoe/*.co, e.g.
fmoe_fp8_blockscale_g1u1_subGU_256.co) issue a global atomic right after
`s_setvskip s20, k` and switch VSKIP around atomics still in flight, so VSKIP is
modelled as taking effect at the next instruction.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .. import hazards
from ..decode import Operand
from ..errors import UnsupportedInstruction
from ..registry import handles, lookup
from ..state import M0, NUM_VGPRS

SKIPPED = frozenset(("valu", "trans", "mfma", "vmem", "lds_dma", "ds"))
INDEXED = frozenset(("valu", "trans"))
_TWO_DSTS = ("_co_", "v_div_scale", "v_mad_u64", "v_mad_i64")
_M0 = Operand("s", M0, 1, text="m0")


def _waves(ex, w) -> np.ndarray:
    return ex.wave_ids(w)


def _refresh(ex):
    """Route steps through split() exactly while some wave has a mode on."""
    on = ex.waves.vskip.any() or ex.waves.gpr_idx_on.any()
    ex.mode_split = split if on else None


@handles("s_setvskip", klass="salu")
def s_setvskip(ex, inst, w):
    src, bit = inst.ops
    value, index = ex.s32(src, w), ex.s32(bit, w) & np.uint32(31)
    ex.waves.vskip[_waves(ex, w)] = ((value >> index) & np.uint32(1)).astype(bool)
    _refresh(ex)


def _set_m0_fields(ex, w, index=None, mode=None):
    m0 = ex.s32(_M0, w)
    if index is not None:
        m0 = (m0 & ~np.uint32(0xFF)) | (index & np.uint32(0xFF))
    if mode is not None:
        m0 = (m0 & ~np.uint32(0xF000)) | np.uint32((mode & 0xF) << 12)
    ex.set_s32(_M0, w, m0, hazards.SALU)


@handles("s_set_gpr_idx_on", klass="salu")
def s_set_gpr_idx_on(ex, inst, w):
    # SOPC: SSRC1 (word bits [15:8]) carries the raw 4-bit mode.
    _set_m0_fields(ex, w, ex.s32(inst.ops[0], w), (inst.words[0] >> 8) & 0xF)
    ex.waves.gpr_idx_on[_waves(ex, w)] = True
    _refresh(ex)


@handles("s_set_gpr_idx_off", klass="salu")
def s_set_gpr_idx_off(ex, inst, w):
    ex.waves.gpr_idx_on[_waves(ex, w)] = False
    _refresh(ex)


@handles("s_set_gpr_idx_idx", klass="salu")
def s_set_gpr_idx_idx(ex, inst, w):
    _set_m0_fields(ex, w, index=ex.s32(inst.ops[0], w))


@handles("s_set_gpr_idx_mode", klass="salu")
def s_set_gpr_idx_mode(ex, inst, w):
    _set_m0_fields(ex, w, mode=inst.words[0] & 0xF)


def split(ex, w, inst):
    """[(waves, instruction)] to run for `inst` at the waves `w`: waves in VSKIP drop
    vector instructions (their wait-state clock still advances), and waves in index
    mode run a copy of `inst` whose operands are moved by their M0 index."""
    if inst.handler is None:
        inst.handler = lookup(inst)
    klass = inst.handler.klass
    waves = _waves(ex, w)
    if klass not in SKIPPED:
        return [(w, inst)]
    skip = ex.waves.vskip[waves]
    if skip.any():
        ex.waves.clock[waves[skip]] += hazards.wait_states(inst)
        waves = waves[~skip]
    if not waves.size:
        return []
    indexed = ex.waves.gpr_idx_on[waves]
    m0 = ex.waves.sgpr[waves, M0]
    fields = np.where(indexed, (m0 >> np.uint32(12)) & np.uint32(0xF), 0)
    shift = np.where(fields != 0, m0 & np.uint32(0xFF), 0)
    runs = []
    for f, s in sorted(set(zip(fields.tolist(), shift.tolist()))):
        members = waves[(fields == f) & (shift == s)]
        runs.append((members, _indexed(ex, inst, f, s) if f else inst))
    return runs


def _indexed(ex, inst, fields: int, shift: int):
    """`inst` with the VGPR/AGPR operands of the enabled fields moved by `shift`
    (cached per instruction, field set and shift)."""
    cache = inst.__dict__.setdefault("_gpr_idx", {})
    key = (fields, shift)
    if key in cache:
        return cache[key]
    if inst.handler.klass not in INDEXED or any(t in inst.name for t in _TWO_DSTS):
        raise UnsupportedInstruction(f"{inst.name} in VGPR index mode (s_set_gpr_idx_on) is not modelled "
                                     f"({ex.where()})")
    ops = list(inst.ops)
    for pos, bit in ((1, 0), (2, 1), (3, 2), (0, 3)):        # SRC0, SRC1, SRC2, DST
        if fields >> bit & 1 and pos < len(ops) and ops[pos].kind in ("v", "a"):
            op = ops[pos]
            if op.index + shift + op.count > NUM_VGPRS:
                raise UnsupportedInstruction(f"{inst.name}: indexed register {op.kind}{op.index + shift} "
                                             f"is beyond the register file ({ex.where()})")
            ops[pos] = replace(op, index=op.index + shift, text=f"{op.text}+{shift}")
    moved = replace(inst, ops=tuple(ops), text=f"{inst.text} (gpr_idx +{shift})")
    cache[key] = moved
    return moved
