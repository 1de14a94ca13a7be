"""Decoder tests (loader/emu/decode.py): llvm-objdump's printed forms of tricky gfx950
instructions, parsed into mnemonic, encoding, operands and modifiers.

The instructions are assembled by LLVM and disassembled by llvm-objdump (the real printed
forms), and a few historical printed forms are fed to parse_line directly. Expected
values come from the instruction syntax (LLVM AMDGPUModifierSyntax/AMDGPUOperandSyntax)
and gfx9's SGPR numbering (vcc = s106, ttmp0 = s108, m0 = s124, exec = s126).
"""
import pytest

from asm_harness import snippet_source
from kernel_source import assemble
from gfxasm.emu import decode

LINES = """
  s_endpgm
  v_add_f32_e64 v1, -v2, |v3| clamp mul:2
  v_fma_f32 v1, -|v2|, s4, v5
  v_mul_f32_e32 v1, 0x3fb8aa3b, v2
  v_mul_f32_e32 v1, -4.0, v2
  v_add_u32_e32 v1, -16, v2
  v_sub_f32_e32 v1, 0.15915494, v2
  v_cndmask_b32_e64 v1, -v2, |v3|, s[4:5]
  v_cmp_gt_u32_e32 vcc, s10, v1
  v_cmpx_lt_f32_e64 s[2:3], v1, v2
  s_waitcnt vmcnt(3) lgkmcnt(1)
  s_waitcnt vmcnt(45) expcnt(2) lgkmcnt(0)
  ds_read2st64_b32 v[2:3], v1 offset0:4 offset1:255
  ds_swizzle_b32 v1, v2 offset:swizzle(BITMASK_PERM,"01pip")
  global_load_dword v1, v2, s[4:5] offset:-16
  global_load_dwordx4 v[4:7], v[2:3], off offset:2048
  buffer_load_dword v2, s[4:7], 0 offen offset:16 lds
  buffer_store_dwordx2 v[4:5], v1, s[8:11], s12 offen offset:4095
  s_load_dwordx2 s[0:1], s[2:3], 0x10
  v_accvgpr_write_b32 a0, v1
  v_mfma_f32_16x16x16_bf16 v[0:3], a[4:5], v[6:7], 0 cbsz:1 abid:2 blgp:3
  v_pk_fma_f32 v[0:1], v[2:3], v[4:5], v[6:7] op_sel:[1,0,1] op_sel_hi:[0,1,1] neg_lo:[1,0,0]
  v_mov_b32_sdwa v1, v2 dst_sel:WORD_1 dst_unused:UNUSED_PAD src0_sel:BYTE_0
  s_mov_b32 s5, ttmp3
  s_mov_b64 exec, src_scc
  v_readlane_b32 s1, v2, m0
  s_mov_b32 exec_lo, vcc_hi
  v_mov_b32_dpp v1, v2 quad_perm:[3,2,1,0] row_mask:0x5 bank_mask:0xa bound_ctrl:1
  v_permlane16_swap_b32_e64 v1, v2 bound_ctrl:1 fi:1
  ds_read_b64_tr_b16 v[2:3], v4 offset:1024
  v_cvt_pk_bf16_f32 v1, v2, -v3
  v_lshl_add_u64 v[0:1], v[2:3], 2, s[4:5]
L_back:
  s_cbranch_scc1 L_back
  s_branch L_fwd
  s_nop 0
L_fwd:
  s_endpgm
"""


@pytest.fixture(scope="module")
def insts():
    src = snippet_source(LINES)
    code = assemble(src)
    return decode.decode(code)


def find(insts, prefix):
    hits = [i for i in insts if i.text.startswith(prefix)]
    assert hits, prefix
    return hits[0]


def ops(inst):
    return [(o.kind, o.index, o.count, o.neg, o.abs) if o.kind in ("s", "v", "a") else (o.kind, o.text, o.neg, o.abs)
            for o in inst.ops]


def test_vop3_modifiers(insts):
    i = find(insts, "v_add_f32_e64")
    assert (i.name, i.enc) == ("v_add_f32", "e64")
    assert ops(i) == [("v", 1, 1, False, False), ("v", 2, 1, True, False), ("v", 3, 1, False, True)]
    assert i.mods == {"clamp": True, "mul": 2}
    i = find(insts, "v_fma_f32")
    assert ops(i)[1] == ("v", 2, 1, True, True) and ops(i)[2] == ("s", 4, 1, False, False)


def test_constants(insts):
    i = find(insts, "v_mul_f32_e32 v1, 0x3fb8aa3b")
    assert i.size == 8 and i.words[1] == 0x3FB8AA3B and ops(i)[1] == ("imm", "0x3fb8aa3b", False, False)
    assert ops(find(insts, "v_mul_f32_e32 v1, -4.0"))[1] == ("imm", "-4.0", False, False)
    assert ops(find(insts, "v_add_u32_e32 v1, -16"))[1] == ("imm", "-16", False, False)
    assert ops(find(insts, "v_sub_f32_e32 v1, 0.15915494"))[1] == ("imm", "0.15915494", False, False)


def test_special_registers(insts):
    assert ops(find(insts, "v_cmp_gt_u32_e32"))[0] == ("s", 106, 2, False, False)
    assert ops(find(insts, "s_mov_b32 s5, ttmp3"))[1] == ("s", 111, 1, False, False)
    i = find(insts, "s_mov_b64 exec, src_scc")
    assert ops(i) == [("s", 126, 2, False, False), ("scc", "src_scc", False, False)]
    assert ops(find(insts, "v_readlane_b32"))[2] == ("s", 124, 1, False, False)
    assert ops(find(insts, "s_mov_b32 exec_lo")) == [("s", 126, 1, False, False), ("s", 107, 1, False, False)]
    assert ops(find(insts, "v_accvgpr_write_b32"))[0] == ("a", 0, 1, False, False)


def test_waitcnt_counters_from_raw_bits(insts):
    assert decode.waitcnt_fields(find(insts, "s_waitcnt vmcnt(3)")) == (3, 7, 1)
    assert decode.waitcnt_fields(find(insts, "s_waitcnt vmcnt(45)")) == (45, 2, 0)


def test_memory_forms(insts):
    i = find(insts, "ds_read2st64_b32")
    assert i.mods == {"offset0": 4, "offset1": 255} and i.words[0] & 0xFFFF == 0xFF04
    i = find(insts, "ds_swizzle_b32")
    assert i.mods["offset"] == 'swizzle(BITMASK_PERM,"01pip")'
    # BITMASK_PERM "01pip" (lane-id bits 4..0): and_mask keeps the p/i bits 0b00111, or_mask
    # sets the '1' bit 0b01000, xor_mask flips the 'i' bit 0b00010
    assert i.words[0] & 0xFFFF == 0b00111 | 0b01000 << 5 | 0b00010 << 10
    i = find(insts, "global_load_dword v1")
    assert ops(i) == [("v", 1, 1, False, False), ("v", 2, 1, False, False), ("s", 4, 2, False, False)]
    assert i.mods == {"offset": -16}
    i = find(insts, "global_load_dwordx4")
    assert ops(i)[1:] == [("v", 2, 2, False, False), ("off", "off", False, False)] and i.mods == {"offset": 2048}
    i = find(insts, "buffer_load_dword v2")
    assert ops(i) == [("v", 2, 1, False, False), ("s", 4, 4, False, False), ("imm", "0", False, False)]
    assert i.mods == {"offen": True, "offset": 16, "lds": True}
    i = find(insts, "buffer_store_dwordx2")
    assert ops(i)[3] == ("s", 12, 1, False, False) and i.mods == {"offen": True, "offset": 4095}
    i = find(insts, "ds_read_b64_tr_b16")
    assert ops(i) == [("v", 2, 2, False, False), ("v", 4, 1, False, False)] and i.mods == {"offset": 1024}


def test_packed_and_mfma_modifiers(insts):
    i = find(insts, "v_mfma_f32_16x16x16_bf16")
    assert ops(i)[1] == ("a", 4, 2, False, False) and ops(i)[3] == ("imm", "0", False, False)
    assert i.mods == {"cbsz": 1, "abid": 2, "blgp": 3}
    i = find(insts, "v_pk_fma_f32")
    assert i.mods == {"op_sel": (1, 0, 1), "op_sel_hi": (0, 1, 1), "neg_lo": (1, 0, 0)}
    assert ops(find(insts, "v_cvt_pk_bf16_f32"))[2] == ("v", 3, 1, True, False)


def test_sdwa_dpp_and_permlane(insts):
    i = find(insts, "v_mov_b32_sdwa")
    assert (i.name, i.enc) == ("v_mov_b32", "sdwa")
    assert i.mods == {"dst_sel": "WORD_1", "dst_unused": "UNUSED_PAD", "src0_sel": "BYTE_0"}
    i = find(insts, "v_mov_b32_dpp")
    assert (i.name, i.enc) == ("v_mov_b32", "dpp")
    assert i.mods == {"quad_perm": (3, 2, 1, 0), "row_mask": 5, "bank_mask": 0xA, "bound_ctrl": 1}
    i = find(insts, "v_permlane16_swap_b32_e64")
    assert (i.name, i.enc, i.mods) == ("v_permlane16_swap_b32", "e64", {"bound_ctrl": 1, "fi": 1})


def test_branch_targets_from_raw_offset(insts):
    back = find(insts, "s_cbranch_scc1")
    fwd = find(insts, "s_branch")
    assert decode.branch_target(back) == back.pc
    end = [i for i in insts if i.name == "s_endpgm" and i.pc > fwd.pc][0]
    assert decode.branch_target(fwd) == end.pc


def test_parse_line_hand_written_forms():
    i = decode.parse_line("v_add_f32_e64 v1, neg(v2), abs(v3)", 0, (0, 0))
    assert ops(i)[1:] == [("v", 2, 1, True, False), ("v", 3, 1, False, True)]
    i = decode.parse_line("ds_write2_b64 v1, v[2:3], v[4:5] offset0:1 offset1:2", 0, (0, 0))
    assert ops(i) == [("v", 1, 1, False, False), ("v", 2, 2, False, False), ("v", 4, 2, False, False)]
    assert i.mods == {"offset0": 1, "offset1": 2}
    i = decode.parse_line("s_setprio 3", 0, (0,))
    assert ops(i) == [("imm", "3", False, False)] and i.mods == {}
    i = decode.parse_line("s_mov_b64 s[2:3], ttmp[4:5]", 0, (0,))
    assert ops(i)[1] == ("s", 112, 2, False, False)
    i = decode.parse_line("s_endpgm", 0, (0,))
    assert (i.ops, i.mods) == ((), {})
