"""VSKIP (s_setvskip) and VGPR index mode (s_set_gpr_idx_on/off), from the ISA's
definitions (loader/emu/families/modes.py): VSKIP = S0[S1[4:0]] drops vector
instructions while set; index mode adds M0[7:0] to the VGPR/AGPR operands of the VALU
fields M0[15:12] enables (SRC0, SRC1, SRC2, DST).
"""
import numpy as np
import pytest

from gfxasm.emu.errors import UnsupportedInstruction
from asm_harness import run_snippet

RNG = np.random.default_rng(31)
REGS = {r: RNG.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32) for r in range(1, 12)}


def test_setvskip_selects_a_bit_and_skips_vector_work():
    """s20 = 0b0101: bits 0 and 2 set skip the v_add after them; bit 1 does not; the
    skipped store leaves memory alone; s_setvskip 0, 0 ends the mode."""
    body = """
  s_mov_b32 s20, 5
  v_mov_b32 v20, v1
  s_setvskip s20, 0
  v_add_u32 v20, v20, v2           // skipped
  s_setvskip s20, 1
  v_add_u32 v20, v20, v3           // runs
  s_setvskip s20, 2
  v_add_u32 v20, v20, v4           // skipped
  s_add_u32 s21, s20, 1            // scalar work still runs
  s_setvskip 0, 0
  v_add_u32 v20, v20, v5           // runs
  v_mov_b32 v21, s21
"""
    out = run_snippet(body, vgprs=REGS, outputs=["v20", "v21"])
    np.testing.assert_array_equal(out["v20"], REGS[1] + REGS[3] + REGS[5])
    assert (out["v21"] == 6).all()


def test_gpr_idx_moves_src0_only():
    """mode SRC0, index 3: v_add_u32 v20, v1, v2 reads v4 (= v1 + 3) and v2; the
    destination and SRC1 stay; M0[7:0] and M0[15:12] hold index and mode."""
    body = """
  s_mov_b32 s22, 3
  s_set_gpr_idx_on s22, gpr_idx(SRC0)
  v_add_u32 v20, v1, v2
  v_accvgpr_write_b32 a5, v7
  s_set_gpr_idx_off
  s_mov_b32 s23, m0
  v_add_u32 v21, v1, v2
  v_mov_b32 v22, s23
"""
    out = run_snippet(body, vgprs=REGS, outputs=["v20", "v21", "v22", "a5"])
    np.testing.assert_array_equal(out["v20"], REGS[4] + REGS[2])
    np.testing.assert_array_equal(out["v21"], REGS[1] + REGS[2])
    np.testing.assert_array_equal(out["a5"], REGS[10])                  # src0 v7 -> v10
    assert ((out["v22"] & 0xF0FF) == 0x1003).all()


def test_gpr_idx_dst_and_agpr_source():
    """mode SRC0|DST, index 2: v_accvgpr_read_b32 v20, a1 writes v22 from a3."""
    body = """
  v_accvgpr_write_b32 a3, v6
  s_nop 1
  s_mov_b32 s22, 2
  s_set_gpr_idx_on s22, gpr_idx(SRC0,DST)
  v_accvgpr_read_b32 v20, a1
  s_set_gpr_idx_off
"""
    regs = {**REGS, 20: np.zeros(64, np.uint32), 22: np.zeros(64, np.uint32)}
    out = run_snippet(body, vgprs=regs, outputs=["v20", "v22"])
    np.testing.assert_array_equal(out["v22"], REGS[6])
    assert (out["v20"] == 0).all()


def test_gpr_idx_with_memory_instruction_is_rejected():
    body = """
  s_mov_b32 s22, 1
  s_set_gpr_idx_on s22, gpr_idx(SRC0)
  global_store_dword v255, v1, s[90:91]
  s_set_gpr_idx_off
"""
    with pytest.raises(UnsupportedInstruction, match="index mode"):
        run_snippet(body, vgprs=REGS)
