"""Strict mode catches the bugs hand-written gfx950 assembly really has.

For every check class there is a deliberately broken small kernel that strict mode must
reject — the test asserts the exception type, the register or address it names, and the
pc and instruction it blames — and the corrected kernel, whose numeric result is
checked against an independent numpy reference. Wait-state rules are pinned at their
boundary: one wait state short fails, the required count passes. Every broken kernel
also runs to completion with strict=False (non-strict mode is lenient).

Wait-state counts: ../shared/docs/gfx950-isa-facts.md §4 and LLVM's
GCNHazardRecognizer.cpp (gfx950 terms); loader/emu/hazards.py documents each rule.
"""
from __future__ import annotations

import re
import struct

import numpy as np
import pytest
import torch

import gfxasm.emu as emu
from gfxasm.emu.errors import HazardError, MemoryFault, UnsupportedInstruction
from gfxasm.emu.registry import lookup
from kernel_source import assemble, kernel_source

_CODE = """
  s_load_dwordx4 s[4:7], s[0:1], 0x0        // s[4:5] = in, s[6:7] = out
  s_load_dwordx2 s[8:9], s[0:1], 0x10       // s[8:9] = aux
  v_and_b32 v1, 0x3ff, v0                   // v1 = work-item id
  v_lshlrev_b32 v2, 2, v1                   // v2 = 4 * id
  s_waitcnt lgkmcnt(0)
  s_mov_b32 s12, s4                         // s[12:15] = raw buffer over `in`
  s_and_b32 s13, s5, 0xffff
  s_mov_b32 s14, 0x100000
  s_mov_b32 s15, 0x20000
{body}
  s_endpgm"""


def source(body: str, lds: int = 0) -> str:
    return kernel_source("k", _CODE.format(body=body), args=("in", "out", "aux"), lds=lds, max_workgroup=1024)


RNG = np.random.default_rng(1234)
X = RNG.standard_normal(4096).astype(np.float32)      # the `in` buffer of every kernel


def run(body: str, *, out_words: int = 64, block: int = 64, grid: int = 1, lds: int = 0,
        strict: bool = True, inp: np.ndarray = X) -> np.ndarray:
    """Run `body` in kernel k; returns the first `out_words` of the `out` buffer (4 KiB or
    more, initialised to ~0) as uint32."""
    co = assemble(source(body, lds))
    t_in = torch.from_numpy(np.ascontiguousarray(inp).view(np.int32).copy())
    t_out = torch.full((max(out_words, 1024),), -1, dtype=torch.int32)
    t_aux = torch.zeros(64, dtype=torch.int32)
    kernarg = struct.pack("<QQQ", t_in.data_ptr(), t_out.data_ptr(), t_aux.data_ptr())
    run.out_ptr = t_out.data_ptr()
    emu.load(co).kernel("k").launch(grid=(grid, 1, 1), block=(block, 1, 1), kernarg=kernarg,
                                    buffers=[t_in, t_out, t_aux], strict=strict)
    return t_out.numpy().view(np.uint32)[:out_words].copy()


def f32(bits: np.ndarray) -> np.ndarray:
    return bits.view(np.float32)


def nops(n: int) -> str:
    """s_nop instructions giving exactly n wait states."""
    out = []
    while n > 0:
        k = min(n, 16)
        out.append(f"  s_nop {k - 1}")
        n -= k
    return "\n".join(out)


def rejects(body: str, exc, *names: str, at: str, **kw) -> str:
    """Assert strict mode raises `exc` naming `names` and blaming instruction `at` (its
    mnemonic) with its pc; assert non-strict mode runs the same kernel. Returns the message."""
    with pytest.raises(exc) as info:
        run(body, **kw)
    msg = str(info.value)
    for name in names:
        assert name in msg, f"{name!r} not in: {msg}"
    m = re.search(r"kernel k, workgroup \((\d+),0,0\) wave (\d+), pc (0x[0-9a-f]+) `([^`]*)`", msg)
    assert m, msg
    assert m.group(4).split()[0].startswith(at), msg
    # the pc named is that instruction's
    co = assemble(source(body, kw.get("lds", 0)))
    assert {i.pc: i.text for i in emu.load(co)._insts}[int(m.group(3), 16)] == m.group(4), msg
    if exc is HazardError:
        run(body, **{**kw, "strict": False})          # lenient outside strict mode
    return msg


def needs(*mnemonics: str):
    """Skip (visibly) when an instruction family this test needs is not implemented yet."""
    from gfxasm.emu.decode import Inst
    for name in mnemonics:
        try:
            lookup(Inst(0, 4, name, "", (), {}, (0,), name))
        except UnsupportedInstruction:
            pytest.skip(f"{name} is not implemented by the emulator yet")


LOAD_X = """
  global_load_dword v3, v2, s[4:5]           // v3 = x[id]
  s_waitcnt vmcnt(0)
"""
STORE = """
  global_store_dword v2, v{r}, s[6:7]
  s_waitcnt vmcnt(0)
"""


def store(reg: int) -> str:
    return STORE.format(r=reg)


# =========================================================== (a) VMEM loads, vmcnt
def test_vmem_result_read_before_vmcnt():
    body = "  global_load_dword v3, v2, s[4:5]\n  v_add_f32 v4, v3, v3\n" + store(4)
    rejects(body, HazardError, "v3 read while a load into it is still in flight", at="v_add_f32")
    fixed = "  global_load_dword v3, v2, s[4:5]\n  s_waitcnt vmcnt(0)\n  v_add_f32 v4, v3, v3\n" + store(4)
    np.testing.assert_array_equal(f32(run(fixed)), X[:64] * 2)


def test_vmcnt_with_the_wrong_count_in_order_retirement():
    # Loads retire in issue order: vmcnt(1) leaves the *youngest* load in flight.
    broken = """
  global_load_dword v4, v2, s[4:5] offset:256   // x[64 + id], issued first
  global_load_dword v3, v2, s[4:5]              // x[id], issued second
  s_waitcnt vmcnt(1)                            // retires only the first
  v_add_f32 v5, v3, v3
""" + store(5)
    rejects(broken, HazardError, "v3 read while a load into it is still in flight", at="v_add_f32")
    fixed = """
  global_load_dword v3, v2, s[4:5]              // x[id], issued first
  global_load_dword v4, v2, s[4:5] offset:256   // x[64 + id]
  s_waitcnt vmcnt(1)                            // v3 has landed, v4 has not
  v_add_f32 v5, v3, v3
  s_waitcnt vmcnt(0)
  v_add_f32 v5, v5, v4
""" + store(5)
    np.testing.assert_array_equal(f32(run(fixed)), X[:64] * 2 + X[64:128])


def test_vmcnt_counts_stores_too():
    # A store issued after the load is younger: vmcnt(1) retires the load.
    body = """
  global_load_dword v3, v2, s[4:5]
  global_store_dword v2, v2, s[6:7]
  s_waitcnt vmcnt(1)
  v_add_f32 v5, v3, v3
  global_store_dword v2, v5, s[6:7]
  s_waitcnt vmcnt(0)
"""
    np.testing.assert_array_equal(f32(run(body)), X[:64] * 2)
    broken = body.replace("  global_load_dword v3, v2, s[4:5]\n  global_store_dword v2, v2, s[6:7]\n",
                          "  global_store_dword v2, v2, s[6:7]\n  global_load_dword v3, v2, s[4:5]\n")
    rejects(broken, HazardError, "v3 read while a load", at="v_add_f32")


# =========================================================== (n) WAW with a load in flight
@pytest.mark.parametrize("load,wait,reg", [
    ("global_load_dword v3, v2, s[4:5]", "s_waitcnt vmcnt(0)", "v3"),
    ("ds_read_b32 v3, v2", "s_waitcnt lgkmcnt(0)", "v3"),
    ("s_load_dword s20, s[4:5], 0x0", "s_waitcnt lgkmcnt(0)", "s20"),
])
def test_register_overwritten_while_a_load_into_it_is_in_flight(load, wait, reg):
    write = "v_mov_b32 v3, 1.0" if reg == "v3" else "s_mov_b32 s20, 1.0"
    tail = "" if reg == "v3" else "  v_mov_b32 v3, s20\n"
    prologue = "  v_mov_b32 v9, 0\n  ds_write_b32 v2, v9\n  s_waitcnt lgkmcnt(0)\n"
    broken = prologue + f"  {load}\n  {write}\n" + tail + store(3)
    rejects(broken, HazardError, f"{reg} overwritten while a load into it is still in flight",
            at=write.split()[0], lds=256)
    fixed = prologue + f"  {load}\n  {wait}\n  {write}\n" + tail + store(3)
    np.testing.assert_array_equal(f32(run(fixed, lds=256)), np.ones(64, np.float32))


# =========================================================== (b) SMEM, lgkmcnt
def test_smem_result_read_before_lgkmcnt():
    broken = "  s_load_dword s20, s[4:5], 0x4\n  v_mov_b32 v3, s20\n" + store(3)
    rejects(broken, HazardError, "s20 read while a load into it is still in flight", at="v_mov_b32")
    fixed = "  s_load_dword s20, s[4:5], 0x4\n  s_waitcnt lgkmcnt(0)\n  v_mov_b32 v3, s20\n" + store(3)
    np.testing.assert_array_equal(f32(run(fixed)), np.full(64, X[1]))


def test_lgkmcnt_nonzero_with_scalar_loads_in_flight():
    # Scalar loads return out of order: only lgkmcnt(0) is a safe wait for them.
    broken = """
  s_load_dword s20, s[4:5], 0x0
  s_load_dword s21, s[4:5], 0x4
  s_waitcnt lgkmcnt(1)
  v_mov_b32 v3, s20
""" + store(3)
    rejects(broken, HazardError, "lgkmcnt(1) with scalar loads in flight", "only lgkmcnt(0) is safe",
            at="s_waitcnt")
    fixed = broken.replace("lgkmcnt(1)", "lgkmcnt(0)").replace(
        "  v_mov_b32 v3, s20\n", "  v_mov_b32 v3, s20\n  v_add_f32 v3, s21, v3\n")
    np.testing.assert_array_equal(f32(run(fixed)), np.full(64, X[0] + X[1]))


# =========================================================== (c) DS reads, lgkmcnt
def test_ds_read_result_read_before_lgkmcnt():
    broken = LOAD_X + "  ds_write_b32 v2, v3\n  ds_read_b32 v4, v2\n  v_add_f32 v5, v4, v4\n" + store(5)
    rejects(broken, HazardError, "v4 read while a load into it is still in flight", at="v_add_f32",
            lds=256)
    fixed = broken.replace("  v_add_f32", "  s_waitcnt lgkmcnt(0)\n  v_add_f32")
    np.testing.assert_array_equal(f32(run(fixed, lds=256)), X[:64] * 2)


def test_ds_reads_retire_in_order():
    body = LOAD_X + """
  ds_write_b32 v2, v3
  v_mul_f32 v6, 4.0, v3
  ds_write_b32 v2, v6 offset:256
  ds_read_b32 v4, v2
  ds_read_b32 v5, v2 offset:256
  s_waitcnt lgkmcnt(1)               // v4 landed; v5 not yet
  v_add_f32 v7, v{first}, v{first}
  s_waitcnt lgkmcnt(0)
  v_add_f32 v7, v7, v5
""" + store(7)
    rejects(body.format(first=5), HazardError, "v5 read while a load", at="v_add_f32", lds=512)
    np.testing.assert_array_equal(f32(run(body.format(first=4), lds=512)), X[:64] * 6)


# =========================================================== (d) LDS races between waves
EXCHANGE = LOAD_X + """
  v_xor_b32 v6, 0x100, v2            // the partner wave's slot: id ^ 64
  ds_write_b32 v2, v3
{sync}
  ds_read_b32 v4, v6
  s_waitcnt lgkmcnt(0)
""" + store(4)


@pytest.mark.parametrize("sync,message", [
    ("", "that another wave wrote without s_waitcnt lgkmcnt(0) + s_barrier"),
    ("  s_barrier", "that another wave wrote without s_waitcnt lgkmcnt(0) + s_barrier"),
    ("  s_waitcnt lgkmcnt(0)", "LDS race"),
    ("  s_barrier\n  s_waitcnt lgkmcnt(0)", "LDS race"),
], ids=["no-wait-no-barrier", "barrier-without-wait", "wait-without-barrier", "wait-after-barrier"])
def test_lds_written_by_one_wave_read_by_another(sync, message):
    msg = rejects(EXCHANGE.format(sync=sync), HazardError, message, "LDS address 0x", at="ds_read_b32",
                  block=128, lds=512, out_words=128)
    assert "lane " in msg


def test_lds_exchange_with_waitcnt_and_barrier():
    out = run(EXCHANGE.format(sync="  s_waitcnt lgkmcnt(0)\n  s_barrier"), block=128, lds=512, out_words=128)
    np.testing.assert_array_equal(f32(out), np.concatenate([X[64:128], X[:64]]))


SECOND_ROUND = EXCHANGE.format(sync="  s_waitcnt lgkmcnt(0)\n  s_barrier") + """
  v_mul_f32 v7, 4.0, v3
{sync}
  ds_write_b32 v2, v7                // overwrite the slot the partner just read
  s_waitcnt lgkmcnt(0)
  s_barrier
  ds_read_b32 v8, v6
  s_waitcnt lgkmcnt(0)
  global_store_dword v2, v8, s[6:7] offset:512
  s_waitcnt vmcnt(0)
"""


def test_lds_overwritten_before_the_other_wave_read_it_war():
    rejects(SECOND_ROUND.format(sync=""), HazardError, "overwrites LDS address 0x", "which wave",
            "read, with no s_barrier in between", at="ds_write_b32", block=128, lds=512, out_words=256)
    out = run(SECOND_ROUND.format(sync="  s_barrier"), block=128, lds=512, out_words=256)
    np.testing.assert_array_equal(f32(out[:128]), np.concatenate([X[64:128], X[:64]]))
    np.testing.assert_array_equal(f32(out[128:]), 4 * np.concatenate([X[64:128], X[:64]]))


DIVERGENT = LOAD_X + """
  v_readfirstlane_b32 s20, v1         // 0 in wave 0, 64 in wave 1
  s_cmp_eq_u32 s20, 0
  s_cbranch_scc1 L_writer
  // wave 1 (lower pc: the emulator runs it first)
{reader_sync}
  v_subrev_u32 v6, 0x100, v2          // the slot wave 0 writes
  ds_read_b32 v4, v6
  s_waitcnt lgkmcnt(0)
  global_store_dword v2, v4, s[6:7]
  s_waitcnt vmcnt(0)
  s_branch L_end
L_writer:                             // wave 0
  ds_write_b32 v2, v3
{writer_sync}
L_end:
"""


def test_lds_race_is_caught_whatever_order_the_waves_run_in():
    broken = DIVERGENT.format(reader_sync="", writer_sync="")
    rejects(broken, HazardError, "overwrites LDS address 0x", "which wave 1 of the workgroup read",
            at="ds_write_b32", block=128, lds=512, out_words=128)
    fixed = DIVERGENT.format(reader_sync="  s_barrier", writer_sync="  s_waitcnt lgkmcnt(0)\n  s_barrier")
    out = run(fixed, block=128, lds=512, out_words=128)
    np.testing.assert_array_equal(f32(out[64:]), X[:64])
    assert (out[:64] == 0xFFFFFFFF).all()


def test_two_waves_writing_the_same_lds_bytes_race():
    body = LOAD_X + "  ds_write_b32 v1, v3 offset:0\n  s_waitcnt lgkmcnt(0)\n" \
        "  v_and_b32 v6, 0xfc, v2\n  ds_write_b32 v6, v3\n  s_waitcnt lgkmcnt(0)\n"
    rejects(body, HazardError, "several waves write LDS address 0x", at="ds_write_b32", block=128, lds=512)


# =========================================================== (e) LDS DMA
DMA = """
  s_mov_b32 m0, 0
  buffer_load_dword v2, s[12:15], 0 offen lds     // lane l: x[l] -> LDS[4l]
{wait}
  ds_read_b32 v4, v2
  s_waitcnt lgkmcnt(0)
""" + store(4)


@pytest.mark.parametrize("wait", ["", "  s_waitcnt lgkmcnt(0)"], ids=["no-wait", "wrong-counter"])
def test_lds_dma_data_read_before_vmcnt(wait):
    rejects(DMA.format(wait=wait), HazardError, "LDS address 0x0 (lane 0)",
            "before the LDS DMA load writing it has landed (missing s_waitcnt vmcnt)",
            at="ds_read_b32", lds=256)


def test_lds_dma_with_vmcnt():
    np.testing.assert_array_equal(f32(run(DMA.format(wait="  s_waitcnt vmcnt(0)"), lds=256)), X[:64])


DMA_EXCHANGE = """
  v_readfirstlane_b32 s20, v2         // 0 in wave 0, 256 in wave 1
  s_nop 4
  s_mov_b32 m0, s20                    // each wave fills its own 256 B of LDS
  buffer_load_dword v2, s[12:15], 0 offen lds
  s_waitcnt vmcnt(0)
{sync}
  v_xor_b32 v6, 0x100, v2
  ds_read_b32 v4, v6                   // the other wave's DMA data
  s_waitcnt lgkmcnt(0)
""" + store(4)


def test_lds_dma_data_of_another_wave_needs_a_barrier():
    rejects(DMA_EXCHANGE.format(sync=""), HazardError, "LDS race", "which wave", at="ds_read_b32",
            block=128, lds=512, out_words=128)
    out = run(DMA_EXCHANGE.format(sync="  s_barrier"), block=128, lds=512, out_words=128)
    np.testing.assert_array_equal(f32(out), np.concatenate([X[64:128], X[:64]]))


# Two waves DMA into the same LDS bytes, no barrier between (docs/conformance.md F6): a
# race only if the bytes differ. {src}: the voffset (of wave 0 where they run apart); v5
# = 4 * lane is the same source in both waves, v2 = 4 * work-item id and v6 = v5 + 256 not.
DMA_SAME_BYTES = """
  v_and_b32 v5, 63, v1
  v_lshlrev_b32 v5, 2, v5
  s_mov_b32 m0, 0
  buffer_load_dword {src}, s[12:15], 0 offen lds
  s_waitcnt vmcnt(0)
  s_barrier
  ds_read_b32 v4, v5
  s_waitcnt lgkmcnt(0)
""" + store(4)

DMA_SAME_BYTES_APART = """
  v_and_b32 v5, 63, v1
  v_lshlrev_b32 v5, 2, v5
  v_add_u32 v6, 0x100, v5
  s_mov_b32 m0, 0
  v_readfirstlane_b32 s20, v1         // 0 in wave 0, 64 in wave 1
  s_cmp_eq_u32 s20, 0
  s_cbranch_scc1 L_w0
  buffer_load_dword v5, s[12:15], 0 offen lds          // wave 1 (lower pc: runs first)
  s_branch L_join
L_w0:
  buffer_load_dword {src}, s[12:15], 0 offen lds        // wave 0
L_join:
  s_waitcnt vmcnt(0)
  s_barrier
  ds_read_b32 v4, v5
  s_waitcnt lgkmcnt(0)
""" + store(4)


@pytest.mark.parametrize("apart", [False, True], ids=["lockstep", "one-after-the-other"])
def test_lds_dma_of_the_same_bytes_by_two_waves_is_no_race(apart):
    body = (DMA_SAME_BYTES_APART if apart else DMA_SAME_BYTES).format(src="v5")
    out = run(body, block=128, lds=512, out_words=128)
    np.testing.assert_array_equal(f32(out), np.concatenate([X[:64], X[:64]]))


@pytest.mark.parametrize("apart", [False, True], ids=["lockstep", "one-after-the-other"])
def test_lds_dma_of_different_bytes_by_two_waves_races(apart):
    # wave 1 loads x[64 + lane] (lockstep) or wave 0 does (apart): what LDS holds depends
    # on which lands last
    body = DMA_SAME_BYTES_APART.format(src="v6") if apart else DMA_SAME_BYTES.format(src="v2")
    message = "LDS DMA load writing it has landed" if apart else "several waves write LDS address 0x"
    rejects(body, HazardError, message, at="buffer_load_dword", block=128, lds=512, out_words=128)


# =========================================================== (f) M0 -> LDS DMA
def test_m0_write_right_before_lds_dma_is_accepted():
    # LLVM asks for 1 wait state here; aiter's hardware-proven gfx950 GEMMs put all their
    # LDS DMAs directly after the SALU write of m0 (docs/isa-notes.md), so the emulator
    # does not demand it. The DMA must see the new m0.
    body = """
  s_mov_b32 m0, 0
  s_mov_b32 m0, 0x100
  buffer_load_dword v2, s[12:15], 0 offen lds     // lands at LDS[0x100 + 4l]
  s_waitcnt vmcnt(0)
  ds_read_b32 v4, v2 offset:256
  s_waitcnt lgkmcnt(0)
""" + store(4)
    np.testing.assert_array_equal(f32(run(body, lds=512)), X[:64])


# =========================================================== (g) VALU SGPR -> VMEM (5)
SGPR_ADDR = """
  v_mov_b32 v8, s4
  v_mov_b32 v9, s5
  v_readfirstlane_b32 s20, v8
  v_readfirstlane_b32 s21, v9         // s[20:21] = `in`, written by VALU
{nops}
  global_load_dword v3, v2, s[20:21]
  s_waitcnt vmcnt(0)
""" + store(3)


def test_valu_sgpr_write_then_vmem_address_needs_5():
    rejects(SGPR_ADDR.format(nops=nops(4)), HazardError,
            "s21 read 4 wait states after a VALU op wrote it; 5 are required", at="global_load_dword")
    np.testing.assert_array_equal(f32(run(SGPR_ADDR.format(nops=nops(5)))), X[:64])


def test_valu_sgpr_write_then_buffer_soffset_needs_5():
    body = """
  v_mov_b32 v8, 0x100
  s_nop 0
  v_readfirstlane_b32 s20, v8         // soffset 256, written by VALU
{nops}
  buffer_load_dword v3, v2, s[12:15], s20 offen
  s_waitcnt vmcnt(0)
""" + store(3)
    rejects(body.format(nops=nops(2)), HazardError, "s20 read 2 wait states", "5 are required",
            at="buffer_load_dword")
    np.testing.assert_array_equal(f32(run(body.format(nops=nops(5)))), X[64:128])


# =========================================================== (m) readlane / SGPR -> VALU
def test_valu_vgpr_write_then_readfirstlane_needs_1_and_sgpr_to_valu_needs_2():
    body = LOAD_X + """
  v_add_f32 v4, v3, v3
{n1}
  v_readfirstlane_b32 s20, v4         // 2 * x[0]
{n2}
  v_add_f32 v5, s20, v3
""" + store(5)
    rejects(body.format(n1="", n2=nops(2)), HazardError,
            "v4 read 0 wait states after a VALU op wrote it; 1 are required", at="v_readfirstlane_b32")
    rejects(body.format(n1=nops(1), n2=nops(1)), HazardError,
            "s20 read 1 wait states after a VALU op wrote it; 2 are required", at="v_add_f32")
    np.testing.assert_array_equal(f32(run(body.format(n1=nops(1), n2=nops(2)))), 2 * X[0] + X[:64])


def test_valu_sgpr_write_then_valu_read_as_constant_needs_2():
    # CDNA4 ISA Table 11: "VALU reads SGPR as constant" needs 2 after a VALU write of it.
    body = LOAD_X + """
  v_readfirstlane_b32 s20, v3          // VALU writes s20 = x[0] bits
{n}
  v_add_f32 v5, s20, v3                // s20 read as a constant operand
""" + store(5)
    rejects(body.format(n=nops(1)), HazardError, "s20 read 1 wait states after a VALU op wrote it; 2 are required",
            at="v_add_f32")
    np.testing.assert_array_equal(f32(run(body.format(n=nops(2)))), X[0] + X[:64])


def test_carry_in_and_lane_mask_written_by_valu_need_no_wait_state():
    # CDNA4 ISA Table 11: "VALU reads SGPR as carry-in" needs 0 (rocRoller VALUWriteSGPRVCC94x
    # agrees; LLVM counts 2). v_cndmask's lane mask is the same per-lane read, and aiter's
    # hardware-proven fwd/PA kernels read fresh v_cmp masks 0-1 wait states later ~220 times.
    body = LOAD_X + """
  v_mov_b32 v4, -1
  v_mov_b32 v5, 7
  v_add_co_u32 v6, vcc, v4, v1         // 0xffffffff + id: carries for id > 0
  v_addc_co_u32 v7, vcc, 0, v5, vcc    // carry-in read at once
  v_mov_b32 v8, v7
""" + store(8)
    expect = np.where(np.arange(64) > 0, 8, 7).astype(np.uint32)
    np.testing.assert_array_equal(run(body), expect)
    mask = LOAD_X + """
  v_cmp_gt_f32 vcc, 0, v3             // vcc = x < 0
  v_cndmask_b32 v5, v3, 0, vcc        // read as a lane mask at once
""" + store(5)
    np.testing.assert_array_equal(f32(run(mask)), np.where(X[:64] < 0, 0, X[:64]))


def test_readlane_lane_select_written_by_valu_needs_4():
    body = LOAD_X + """
  v_mov_b32 v8, 5
  s_nop 0
  v_readfirstlane_b32 s20, v8         // lane 5, written by VALU
{n}
  v_readlane_b32 s21, v3, s20         // x[5]
  s_nop 1
  v_mov_b32 v4, s21
""" + store(4)
    rejects(body.format(n=nops(3)), HazardError, "s20 read 3 wait states after a VALU op wrote it; 4 are required",
            at="v_readlane_b32")
    np.testing.assert_array_equal(f32(run(body.format(n=nops(4)))), np.full(64, X[5]))


def test_writelane_data_sgpr_is_not_a_lane_select():
    # Only the lane select of v_writelane needs 4; its data SGPR is an ordinary VALU read (2).
    body = LOAD_X + """
  v_mov_b32 v8, 7
  v_readfirstlane_b32 s20, v3         // x[0]
  s_nop 1
  v_mov_b32 v4, 0
  v_writelane_b32 v4, s20, 3          // lane 3 <- x[0]
""" + store(4)
    expect = np.zeros(64, np.float32)
    expect[3] = X[0]
    np.testing.assert_array_equal(f32(run(body)), expect)


def test_valu_exec_write_then_readlane_needs_4():
    body = LOAD_X + """
  v_cmpx_le_u32 vcc, 0, v1            // all lanes stay on; EXEC written by VALU
{n}
  v_readfirstlane_b32 s20, v3
  s_nop 1
  v_mov_b32 v4, s20
""" + store(4)
    rejects(body.format(n=nops(3)), HazardError, "EXEC written by a VALU op (v_cmpx) 3 wait states earlier",
            "4 are required before v_readfirstlane_b32", at="v_readfirstlane_b32")
    np.testing.assert_array_equal(f32(run(body.format(n=nops(4)))), np.full(64, X[0]))


# =========================================================== (j) EXEC -> DPP (5)
DPP = LOAD_X + """
  v_mov_b32 v4, 0
  v_cmpx_gt_u32 vcc, 48, v1           // lanes 0..47 stay on
{n}
  v_mov_b32_dpp v4, v3 quad_perm:[1,0,3,2] row_mask:0xf bank_mask:0xf
  s_mov_b64 exec, -1
""" + store(4)


def test_valu_exec_write_then_dpp_needs_5():
    rejects(DPP.format(n=nops(4)), HazardError, "EXEC written by a VALU op (v_cmpx) 4 wait states earlier",
            "5 are required before DPP", at="v_mov_b32_dpp")
    lane = np.arange(64)
    expect = np.where(lane < 48, X[lane ^ 1], 0).astype(np.float32)
    np.testing.assert_array_equal(f32(run(DPP.format(n=nops(5)))), expect)


def test_valu_vgpr_write_then_dpp_read_needs_2():
    body = LOAD_X + """
  v_add_f32 v5, v3, v3
{n}
  v_mov_b32_dpp v4, v5 quad_perm:[1,0,3,2] row_mask:0xf bank_mask:0xf
""" + store(4)
    rejects(body.format(n=nops(1)), HazardError, "v5 read 1 wait states after a VALU op wrote it; 2 are required",
            at="v_mov_b32_dpp")
    np.testing.assert_array_equal(f32(run(body.format(n=nops(2)))), 2 * X[np.arange(64) ^ 1])


def test_valu_vgpr_write_then_permlane_swap_needs_2():
    needs("v_permlane32_swap_b32")
    body = LOAD_X + """
  v_add_f32 v5, v3, v3
  v_mov_b32 v6, 0
{n}
  v_permlane32_swap_b32 v5, v6        // v5 lanes 32..63 <-> v6 lanes 0..31
""" + store(6)
    rejects(body.format(n=nops(1)), HazardError, "read 1 wait states after a VALU op wrote it; 2 are required",
            at="v_permlane32_swap")
    lane = np.arange(64)
    expect = np.where(lane < 32, 2 * X[(lane + 32) % 64], 0).astype(np.float32)
    np.testing.assert_array_equal(f32(run(body.format(n=nops(2)))), expect)


# =========================================================== (k) trans -> VALU (1)
def test_trans_result_read_by_non_trans_valu_needs_1():
    body = LOAD_X + "  v_exp_f32 v4, v3\n{n}\n  v_add_f32 v5, v4, v4\n" + store(5)
    rejects(body.format(n=""), HazardError, "v4 read 0 wait states after a transcendental op wrote it; "
            "1 are required", at="v_add_f32")
    got = f32(run(body.format(n=nops(1))))
    np.testing.assert_allclose(got, 2 * np.exp2(X[:64].astype(np.float64)), rtol=2e-7)
    # trans -> trans is not a hazard (LLVM: the consumer must be a non-trans VALU)
    chain = LOAD_X + "  v_exp_f32 v4, v3\n  v_exp_f32 v5, v4\n" + store(5)
    np.testing.assert_allclose(f32(run(chain)), np.exp2(np.exp2(X[:64].astype(np.float64))), rtol=5e-7)


# =========================================================== dst-sel forwarding (1)
DST_SEL_FORMS = {
    # instruction: writes part of the dword at a shifted position (LLVM getDstSelForwardingOperand)
    "v_cvt_pk_fp8_f32 v4, v3, v3 op_sel:[0,0,1]": True,          # op_sel[3]: high word
    "v_cvt_pk_fp8_f32 v4, v3, v3": False,
    "v_cvt_sr_fp8_f32 v4, v3, v5 op_sel:[0,0,1,0]": True,        # fp8 dst byte select op_sel[2]
    "v_cvt_sr_fp8_f32 v4, v3, v5": False,
    "v_cvt_scalef32_pk_fp8_f32 v4, v3, v3, v7 op_sel:[0,0,0,1]": True,
    "v_cvt_scalef32_pk_fp8_f32 v4, v3, v3, v7": False,
    "v_cvt_scalef32_pk_f32_fp8 v[4:5], v3, v7 op_sel:[1,0,0]": False,   # source select only
    "v_cvt_scalef32_sr_pk_fp4_f32 v4, v[6:7], v5, v8": True,      # LLVM: every op_sel value
    "v_pk_fma_f32 v[4:5], v[6:7], v[6:7], v[6:7] op_sel:[0,0,1]": False,  # VOP3P: no dst select
    "v_add_f32 v4, v3, v3": False,
}


def test_dst_sel_forwarding_producers_are_classified():
    from gfxasm.emu import hazards
    co = assemble(source("\n".join(f"  {t}" for t in DST_SEL_FORMS)))
    insts = emu.load(co)._insts
    first = next(n for n, i in enumerate(insts) if i.text.startswith("s_mov_b32 s15")) + 1
    for (text, expect), inst in zip(DST_SEL_FORMS.items(), insts[first:]):
        assert inst.name == text.split()[0], (inst.text, text)
        assert hazards._dst_sel(inst) is expect, inst.text


def test_valu_partial_dst_write_then_valu_read_or_write_needs_1():
    needs("v_cvt_pk_fp8_f32")
    body = LOAD_X + """
  v_mov_b32 v4, 0
  v_cvt_pk_fp8_f32 v4, v3, v3 op_sel:[0,0,1]   // bytes 2, 3 of v4 = fp8(x)
{n}
  {use}
""" + store(4)
    rejects(body.format(n="", use="v_add_u32 v4, 1, v4"), HazardError,
            "v4 read 0 wait states after a VALU op writing part of the register", "1 are required", at="v_add_u32")
    rejects(body.format(n="", use="v_mov_b32 v4, 0"), HazardError,
            "v4 overwritten 0 wait states after a VALU op writing part of the register", at="v_mov_b32")
    out = run(body.format(n=nops(1), use="v_add_u32 v4, 1, v4"))
    fp8 = torch.from_numpy(X[:64].copy()).to(torch.float8_e4m3fn).view(torch.uint8).numpy().astype(np.uint32)
    np.testing.assert_array_equal(out, ((fp8 | (fp8 << 8)) << 16) + 1)


def test_cvt_scalef32_high_half_then_read_needs_1():
    needs("v_cvt_scalef32_pk_fp8_f32")
    body = LOAD_X + """
  v_mov_b32 v4, 0
  v_mov_b32 v5, 1.0                   // scale
  s_nop 1
  v_cvt_scalef32_pk_fp8_f32 v4, v3, v3, v5 op_sel:[0,0,0,1]   // bytes 2,3 of v4
{n}
  v_lshrrev_b32 v4, 16, v4
""" + store(4)
    rejects(body.format(n=""), HazardError, "v4 read 0 wait states", "1 are required", at="v_lshrrev_b32")
    out = run(body.format(n=nops(1)))
    fp8 = torch.from_numpy(X[:64].copy()).to(torch.float8_e4m3fn).view(torch.uint8).numpy().astype(np.uint32)
    np.testing.assert_array_equal(out, fp8 | (fp8 << 8))


# =========================================================== wide store data (2 / 0)
# LLVM 22 (createsVALUHazard; llc -mcpu=gfx950 -run-pass=post-RA-hazard-rec): 2 wait
# states after a >64-bit global store or a buffer store with an inline-constant soffset,
# none when soffset is an SGPR (docs/conformance.md, f4gemm noBpreShuffle).
@pytest.mark.parametrize("store_inst,need", [
    ("global_store_dwordx4 v10, v[4:7], s[6:7]", 2),
    ("buffer_store_dwordx4 v[4:7], v10, s[16:19], 0 offen", 2),
    ("buffer_store_dwordx4 v[4:7], v10, s[16:19], s22 offen", 0),
])
def test_valu_overwrites_wide_store_data(store_inst, need):
    body = LOAD_X + """
  s_mov_b32 s16, s6
  s_and_b32 s17, s7, 0xffff
  s_mov_b32 s18, 0x400
  s_mov_b32 s19, 0x20000
  s_mov_b32 s22, 0
  v_lshlrev_b32 v10, 4, v1            // 16 bytes per lane
  v_mov_b32 v4, v3
  v_add_f32 v5, v3, v3
  v_mov_b32 v6, 1.0
  v_mov_b32 v7, 2.0
  {store}
{n}
  v_mov_b32 v4, 0                     // reuse the data register
  s_waitcnt vmcnt(0)
""".replace("{store}", store_inst)
    if need:
        rejects(body.format(n=nops(need - 1)), HazardError,
                f"v4 overwritten {need - 1} wait states after a >64-bit store read it as data; {need} are "
                f"required", at="v_mov_b32")
    out = f32(run(body.format(n=nops(need)), out_words=256)).reshape(64, 4)
    np.testing.assert_array_equal(out, np.stack([X[:64], 2 * X[:64], np.ones(64), 2 * np.ones(64)], 1))


# =========================================================== (l) faults
def test_lds_read_beyond_the_allocation():
    body = LOAD_X + """
  ds_write_b32 v2, v3
  s_waitcnt lgkmcnt(0)
  ds_read_b32 v4, v2 offset:4          // lane 63 reads bytes 256..259 of a 256 B allocation
  s_waitcnt lgkmcnt(0)
""" + store(4)
    msg = rejects(body, MemoryFault, "ds_read_b32 of 4 B at LDS address 0x100 (lane 63)",
                  "outside the workgroup's 256 B allocation", at="ds_read_b32", lds=256)
    assert "workgroup (0,0,0) wave 0" in msg
    # Outside strict mode the hardware's behaviour: the out-of-range lane reads 0.
    out = f32(run(body, lds=256, strict=False))
    np.testing.assert_array_equal(out, np.append(X[1:64], 0))


def test_lds_write_beyond_the_allocation():
    body = LOAD_X + """
  ds_write_b32 v2, v3 offset:4         // lane 63 writes bytes 256..259 of a 256 B allocation
  s_waitcnt lgkmcnt(0)
  ds_read_b32 v4, v2
  s_waitcnt lgkmcnt(0)
""" + store(4)
    rejects(body, MemoryFault, "ds_write_b32 of 4 B at LDS address 0x100 (lane 63)",
            "outside the workgroup's 256 B allocation", at="ds_write_b32", lds=256)
    # Non-strict: the out-of-range write is dropped, the others land.
    out = f32(run(body, lds=256, strict=False))
    np.testing.assert_array_equal(out, np.insert(X[:63], 0, 0))


def test_misaligned_ds_read_b128_faults():
    body = LOAD_X + """
  v_lshlrev_b32 v6, 4, v1             // 16 * id
  {addr}
  global_load_dwordx4 v[10:13], v6, s[4:5]
  s_waitcnt vmcnt(0)
  ds_write_b128 v6, v[10:13]
  s_waitcnt lgkmcnt(0)
  ds_read_b128 v[20:23], v7
  s_waitcnt lgkmcnt(0)
  global_store_dwordx4 v6, v[20:23], s[6:7]
  s_waitcnt vmcnt(0)
"""
    rejects(body.replace("{addr}", "v_add_u32 v7, 8, v6"), MemoryFault,
            "ds_read_b128 at LDS address 0x8 (lane 0) is not 16-byte aligned", at="ds_read_b128", lds=1024)
    out = run(body.replace("{addr}", "v_mov_b32 v7, v6"), lds=1024, out_words=256)
    np.testing.assert_array_equal(f32(out), X[:256])


def test_misaligned_ds_read_b64_tr_b16_faults():
    needs("ds_read_b64_tr_b16")
    body = """
  v_lshlrev_b32 v6, 3, v1             // 8 * id
  {addr}
  global_load_dwordx2 v[10:11], v6, s[4:5]
  s_waitcnt vmcnt(0)
  ds_write_b64 v6, v[10:11]
  s_waitcnt lgkmcnt(0)
  ds_read_b64_tr_b16 v[20:21], v7
  s_waitcnt lgkmcnt(0)
  global_store_dwordx2 v6, v[20:21], s[6:7]
  s_waitcnt vmcnt(0)
"""
    rejects(body.replace("{addr}", "v_add_u32 v7, 4, v6"), MemoryFault, "ds_read_b64_tr_b16 at LDS address 0x4",
            "not 8-byte aligned", at="ds_read_b64_tr_b16", lds=512)
    out = run(body.replace("{addr}", "v_mov_b32 v7, v6"), lds=512, out_words=128)
    # Fact sheet §3 (settled): out[16b+n].h[j] = in[16b + 4j + n/4].h[n%4].
    h = X[:128].view(np.uint16).reshape(64, 4)
    expect = np.empty((64, 4), np.uint16)
    for lane in range(64):
        b, n = divmod(lane, 16)
        for j in range(4):
            expect[lane, j] = h[16 * b + 4 * j + n // 4, n % 4]
    np.testing.assert_array_equal(out.view(np.uint16).reshape(64, 4), expect)


def test_store_outside_registered_buffers_faults():
    body = """
  s_mul_i32 s20, s2, 0x40000000      // workgroup 1 stores 1 GiB past `out`: 64 KiB could
                                      // land in another small registered buffer
  v_add_u32 v6, s20, v2
  v_mov_b32 v3, 1.0
  global_store_dword v6, v3, s[6:7]
  s_waitcnt vmcnt(0)
"""
    for strict in (True, False):
        with pytest.raises(MemoryFault) as info:
            run(body, grid=2, out_words=64, strict=strict)
        msg = str(info.value)
        addr = run.out_ptr + 0x40000000
        for part in ("global_store_dword", f"address {addr:#x}", "outside every registered buffer",
                     "kernel k", "workgroup (1,0,0) wave 0", "pc 0x"):
            assert part in msg, msg
    # the control: workgroup 1 stores next to workgroup 0 (the same bytes would be a race)
    out = run(body.replace("0x40000000", "0x100"), grid=2, out_words=128)
    np.testing.assert_array_equal(f32(out), np.ones(128, np.float32))


# =========================================================== MFMA helpers (independent)
def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (round to nearest even), via torch."""
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def bf16_value(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def pack_ab(mat_bits: np.ndarray, m: int, per_lane: int, esize: int) -> np.ndarray:
    """Operand matrix [m, K] of element bit patterns -> uint32[64, R] lane registers
    (fact sheet §2: lane l holds row l % m, k = per_lane*(l // m) + e, little-endian)."""
    lanes = np.arange(64)
    ks = per_lane * (lanes // m)[:, None] + np.arange(per_lane)[None, :]
    elems = mat_bits[(lanes % m)[:, None], ks]                      # [64, per_lane]
    raw = np.ascontiguousarray(elems.astype({2: np.uint16, 1: np.uint8}[esize]))
    return raw.view(np.uint32).reshape(64, -1)


def d_matrix(regs: np.ndarray, m: int) -> np.ndarray:
    """uint32[R, 64] result registers -> float32 D[m, m] (fact sheet §2 C/D layouts)."""
    d = np.zeros((m, m), np.float32)
    for r in range(regs.shape[0]):
        for lane in range(64):
            if m == 16:
                d[4 * (lane // 16) + r, lane % 16] = regs[r, lane].view(np.float32)
            else:
                d[8 * (r // 4) + 4 * (lane // 32) + r % 4, lane % 32] = regs[r, lane].view(np.float32)
    return d


def regs_of(dmat: np.ndarray, m: int, count: int) -> np.ndarray:
    out = np.zeros((count, 64), np.float32)
    for r in range(count):
        for lane in range(64):
            if m == 16:
                out[r, lane] = dmat[4 * (lane // 16) + r, lane % 16]
            else:
                out[r, lane] = dmat[8 * (r // 4) + 4 * (lane // 32) + r % 4, lane % 32]
    return out


def mfma_inputs(m: int, k: int, fmt: str = "bf16", ints: bool = False):
    """(input words for `in`, A values [m,k], B values [m,k]): A's lane registers at
    in[0:64*R] lane-major (R per lane), B's right after."""
    rng = np.random.default_rng(m * 1000 + k)
    draw = (lambda shape: rng.integers(-2, 3, shape).astype(np.float32)) if ints else rng.standard_normal
    if fmt == "bf16":
        a_bits, b_bits = bf16_bits(draw((m, k))), bf16_bits(draw((m, k)))
        a, b = bf16_value(a_bits), bf16_value(b_bits)
        per_lane, esize = k * m // 64, 2
    else:   # OCP fp8 e4m3 via torch
        a_t = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(torch.float8_e4m3fn)
        b_t = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(torch.float8_e4m3fn)
        a, b = a_t.to(torch.float64).numpy(), b_t.to(torch.float64).numpy()
        a_bits, b_bits = a_t.view(torch.uint8).numpy(), b_t.view(torch.uint8).numpy()
        per_lane, esize = 32, 1
    if fmt == "bf16":
        ra, rb = pack_ab(a_bits, m, per_lane, esize), pack_ab(b_bits, m, per_lane, esize)
    else:   # f8f6f4 FP8 K order: byte t of lane l holds k = 16*(l//m) + t%16 + 16*(64//m)*(t//16)
        lanes = np.arange(64)
        t = np.arange(32)
        ks = 16 * (lanes // m)[:, None] + (t % 16)[None, :] + 16 * (64 // m) * (t // 16)[None, :]
        ra = np.ascontiguousarray(a_bits[(lanes % m)[:, None], ks]).view(np.uint32).reshape(64, -1)
        rb = np.ascontiguousarray(b_bits[(lanes % m)[:, None], ks]).view(np.uint32).reshape(64, -1)
    words = np.concatenate([ra.reshape(-1), rb.reshape(-1), np.zeros(64, np.uint32)]).view(np.float32)
    return words, a, b, ra.shape[1]


def mfma_loads(nregs: int) -> str:
    """Load A into v[10:..] and B into v[40:..] (nregs per lane, lane-major), then wait."""
    size = {2: "dwordx2", 4: "dwordx4", 8: "dwordx4"}[nregs]
    lines = [f"  v_lshlrev_b32 v6, {int(np.log2(4 * nregs))}, v1"]
    for base, off in ((10, 0), (40, 64 * 4 * nregs)):
        lines.append(f"  global_load_{size} v[{base}:{base + min(nregs, 4) - 1}], v6, s[4:5] offset:{off}")
        if nregs == 8:
            lines.append(f"  global_load_{size} v[{base + 4}:{base + 7}], v6, s[4:5] offset:{off + 16}")
    lines.append("  s_waitcnt vmcnt(0)")
    return "\n".join(lines) + "\n"


def store_regs(first: int, count: int, kind: str = "v") -> str:
    lines = []
    for r in range(count):
        src = f"v{first + r}"
        if kind == "a":
            lines.append(f"  v_accvgpr_read_b32 v250, a{first + r}\n  s_nop 1")
            src = "v250"
        lines.append(f"  global_store_dword v2, {src}, s[6:7] offset:{256 * r}")
    lines.append("  s_waitcnt vmcnt(0)")
    return "\n".join(lines) + "\n"


MFMA_CASES = {
    # name: (instruction, m, k, A/B regs, D regs, passes, fmt)
    "16x16x32_bf16": ("v_mfma_f32_16x16x32_bf16", 16, 32, 4, 4, 4, "bf16"),
    "32x32x16_bf16": ("v_mfma_f32_32x32x16_bf16", 32, 16, 4, 16, 8, "bf16"),
    "32x32x64_f8f6f4": ("v_mfma_f32_32x32x64_f8f6f4", 32, 64, 8, 16, 16, "fp8"),
}


def mfma_op(case: str, dst: str, a: str, b: str, c: str) -> str:
    return f"  {MFMA_CASES[case][0]} {dst}, {a}, {b}, {c}\n"


def rng(first: int, count: int, kind: str = "v") -> str:
    return f"{kind}[{first}:{first + count - 1}]"


# =========================================================== (i) MFMA result -> VALU
@pytest.mark.parametrize("case", list(MFMA_CASES))
def test_mfma_result_read_by_valu_needs_passes_plus_4(case):
    inst, m, k, ab, dregs, passes, fmt = MFMA_CASES[case]
    needs(inst)
    need = passes + 4                      # gfx950: 4-pass 8, 8-pass 12, 16-pass 20
    words, a, b, _ = mfma_inputs(m, k, fmt)
    body = mfma_loads(ab) + mfma_op(case, rng(60, dregs), rng(10, ab), rng(40, ab), "0") + \
        "{n}\n  v_mov_b32 v100, v60\n" + store_regs(60, dregs)
    rejects(body.format(n=nops(need - 1)), HazardError,
            f"v60 read {need - 1} wait states after a {passes}-pass MFMA wrote it; {need} are required",
            at="v_mov_b32", inp=words, out_words=64 * dregs)
    out = run(body.format(n=nops(need)), inp=words, out_words=64 * dregs).reshape(dregs, 64)
    np.testing.assert_allclose(d_matrix(out, m), a @ b.T, rtol=1e-5, atol=1e-5)


def test_mfma_result_overwritten_by_valu_too_early_waw():
    case = "16x16x32_bf16"
    needs(MFMA_CASES[case][0])
    words, a, b, _ = mfma_inputs(16, 32)
    body = mfma_loads(4) + mfma_op(case, "v[60:63]", "v[10:13]", "v[40:43]", "0") + \
        "{n}\n  v_mov_b32 v63, 0\n  s_nop 1\n" + store_regs(60, 4)
    rejects(body.format(n=nops(7)), HazardError,
            "v63 overwritten 7 wait states after a 4-pass MFMA wrote it; 8 are required", at="v_mov_b32", inp=words)
    out = run(body.format(n=nops(8)), inp=words, out_words=256).reshape(4, 64)
    expect = regs_of((a @ b.T).astype(np.float32), 16, 4)
    expect[3] = 0
    np.testing.assert_allclose(out.view(np.float32), expect, rtol=1e-5, atol=1e-5)


def test_mfma_result_read_by_accvgpr_read_and_store_data():
    case = "16x16x32_bf16"
    needs(MFMA_CASES[case][0])
    words, a, b, _ = mfma_inputs(16, 32)
    to_agpr = "".join(f"  v_accvgpr_write_b32 a{r}, v{10 + r}\n" for r in range(4)) + \
        "".join(f"  v_accvgpr_write_b32 a{4 + r}, v{40 + r}\n" for r in range(4)) + "  s_nop 1\n"
    body = mfma_loads(4) + to_agpr + mfma_op(case, "a[60:63]", "a[0:3]", "a[4:7]", "0") + "{n}\n" + \
        store_regs(60, 4, kind="a")
    rejects(body.format(n=nops(7)), HazardError, "a60 read 7 wait states after a 4-pass MFMA wrote it; 8 are required",
            at="v_accvgpr_read_b32", inp=words)
    out = run(body.format(n=nops(8)), inp=words, out_words=256).reshape(4, 64)
    np.testing.assert_allclose(d_matrix(out, 16), a @ b.T, rtol=1e-5, atol=1e-5)
    # a global store of the result registers is a read too
    direct = mfma_loads(4) + mfma_op(case, "v[60:63]", "v[10:13]", "v[40:43]", "0") + "{n}\n" + store_regs(60, 4)
    rejects(direct.format(n=nops(7)), HazardError, "v60 read 7 wait states", "8 are required",
            at="global_store_dword", inp=words)


# =========================================================== MFMA -> MFMA
def test_mfma_accumulating_in_place_needs_no_wait():
    case = "16x16x32_bf16"
    needs(MFMA_CASES[case][0])
    words, a, b, _ = mfma_inputs(16, 32)
    body = mfma_loads(4) + mfma_op(case, "v[60:63]", "v[10:13]", "v[40:43]", "0") + \
        mfma_op(case, "v[60:63]", "v[10:13]", "v[40:43]", "v[60:63]") + \
        mfma_op(case, "v[64:67]", "v[10:13]", "v[40:43]", "v[60:63]") + nops(8) + "\n" + store_regs(64, 4)
    out = run(body, inp=words, out_words=256).reshape(4, 64)
    np.testing.assert_allclose(d_matrix(out, 16), 3 * (a @ b.T), rtol=1e-5, atol=1e-5)


def test_mfma_srcc_partial_overlap_needs_passes_plus_2():
    case = "16x16x32_bf16"
    needs(MFMA_CASES[case][0])
    words, a, b, _ = mfma_inputs(16, 32)
    body = mfma_loads(4) + "  v_mov_b32 v64, 0\n  v_mov_b32 v65, 0\n" + \
        mfma_op(case, "v[60:63]", "v[10:13]", "v[40:43]", "0") + "{n}\n" + \
        mfma_op(case, "v[70:73]", "v[10:13]", "v[40:43]", "v[62:65]") + nops(8) + "\n" + store_regs(70, 4)
    rejects(body.format(n=nops(5)), HazardError, "v62 read 5 wait states after a 4-pass MFMA wrote it; "
            "6 are required", at="v_mfma_f32_16x16x32_bf16", inp=words)
    out = run(body.format(n=nops(6)), inp=words, out_words=256).reshape(4, 64)
    first = regs_of((a @ b.T).astype(np.float32), 16, 4)
    c = np.stack([first[2], first[3], np.zeros(64), np.zeros(64)])
    expect = regs_of((a @ b.T).astype(np.float32), 16, 4) + c
    np.testing.assert_allclose(out.view(np.float32), expect, rtol=1e-5, atol=1e-5)


def test_mfma_result_as_srcab_of_next_mfma_needs_passes_plus_4():
    case = "16x16x32_bf16"
    needs(MFMA_CASES[case][0])
    # D of the first (f32 bits) is fed as bf16 A data of the second. Small integer inputs make
    # every D entry exact in bf16, so each f32 reads as the bf16 pair (0, value).
    words, a, b, _ = mfma_inputs(16, 32, ints=True)
    body = mfma_loads(4) + mfma_op(case, "v[60:63]", "v[10:13]", "v[40:43]", "0") + "{n}\n" + \
        mfma_op(case, "v[70:73]", "v[60:63]", "v[40:43]", "0") + nops(8) + "\n" + store_regs(70, 4)
    rejects(body.format(n=nops(7)), HazardError, "v60 read 7 wait states after a 4-pass MFMA wrote it; "
            "8 are required", at="v_mfma_f32_16x16x32_bf16", inp=words)
    out = run(body.format(n=nops(8)), inp=words, out_words=256).reshape(4, 64)
    d1 = regs_of((a @ b.T).astype(np.float32), 16, 4).view(np.uint32).T     # [64, 4] lane registers
    halves = np.ascontiguousarray(d1).view(np.uint16).reshape(64, 8)         # 8 bf16 per lane
    a2 = np.zeros((16, 32))
    for lane in range(64):
        for e in range(8):
            a2[lane % 16, 8 * (lane // 16) + e] = bf16_value(halves[lane, e])
    assert np.count_nonzero(a2) > 200
    np.testing.assert_array_equal(d_matrix(out, 16), a2 @ b.T)


def test_mfma_srcc_read_then_valu_overwrites_it_war():
    case = "16x16x32_bf16"
    needs(MFMA_CASES[case][0])
    words, a, b, _ = mfma_inputs(16, 32)
    body = mfma_loads(4) + "".join(f"  v_mov_b32 v{60 + r}, 1.0\n" for r in range(4)) + "  s_nop 1\n" + \
        mfma_op(case, "v[70:73]", "v[10:13]", "v[40:43]", "v[60:63]") + "{n}\n  v_mov_b32 v60, 0\n" + \
        nops(8) + "\n" + store_regs(70, 4)
    rejects(body.format(n=nops(2)), HazardError, "v60 overwritten 2 wait states after a 4-pass MFMA read it "
            "as srcC; 3 are required", at="v_mov_b32", inp=words)
    out = run(body.format(n=nops(3)), inp=words, out_words=256).reshape(4, 64)
    np.testing.assert_allclose(d_matrix(out, 16), a @ b.T + 1, rtol=1e-5, atol=1e-5)


# =========================================================== (h) VALU -> MFMA (2)
def test_valu_vgpr_write_then_mfma_read_needs_2():
    case = "16x16x32_bf16"
    needs(MFMA_CASES[case][0])
    words, a, b, _ = mfma_inputs(16, 32)
    body = mfma_loads(4) + "  v_mov_b32 v43, v43\n{n}\n" + \
        mfma_op(case, "v[60:63]", "v[10:13]", "v[40:43]", "0") + nops(8) + "\n" + store_regs(60, 4)
    rejects(body.format(n=nops(1)), HazardError, "v43 read 1 wait states after a VALU op wrote it; 2 are required",
            at="v_mfma_f32_16x16x32_bf16", inp=words)
    out = run(body.format(n=nops(2)), inp=words, out_words=256).reshape(4, 64)
    np.testing.assert_allclose(d_matrix(out, 16), a @ b.T, rtol=1e-5, atol=1e-5)
    # v_accvgpr_write -> MFMA srcC needs 2 as well
    acc = mfma_loads(4) + "".join(f"  v_accvgpr_write_b32 a{r}, 1.0\n" for r in range(4)) + "{n}\n" + \
        mfma_op(case, "a[0:3]", "v[10:13]", "v[40:43]", "a[0:3]") + nops(8) + "\n" + store_regs(0, 4, kind="a")
    rejects(acc.format(n=nops(1)), HazardError, "a3 read 1 wait states after v_accvgpr_write wrote it; 2 are required",
            at="v_mfma", inp=words)
    out = run(acc.format(n=nops(2)), inp=words, out_words=256).reshape(4, 64)
    np.testing.assert_allclose(d_matrix(out, 16), a @ b.T + 1, rtol=1e-5, atol=1e-5)


# =========================================================== (j) EXEC -> MFMA (4)
def test_valu_exec_write_then_mfma_needs_4():
    case = "16x16x32_bf16"
    needs(MFMA_CASES[case][0])
    words, a, b, _ = mfma_inputs(16, 32)
    body = mfma_loads(4) + "  v_cmpx_le_u32 vcc, 0, v1\n{n}\n" + \
        mfma_op(case, "v[60:63]", "v[10:13]", "v[40:43]", "0") + nops(8) + "\n" + store_regs(60, 4)
    rejects(body.format(n=nops(3)), HazardError, "EXEC written by a VALU op (v_cmpx) 3 wait states earlier",
            "4 are required before an MFMA", at="v_mfma_f32_16x16x32_bf16", inp=words)
    out = run(body.format(n=nops(4)), inp=words, out_words=256).reshape(4, 64)
    np.testing.assert_allclose(d_matrix(out, 16), a @ b.T, rtol=1e-5, atol=1e-5)


# =========================================================== non-strict mode is lenient
def test_non_strict_mode_reports_no_hazard_for_any_broken_kernel():
    broken = [
        ("  global_load_dword v3, v2, s[4:5]\n  v_add_f32 v4, v3, v3\n", {}),
        (EXCHANGE.format(sync="  s_waitcnt lgkmcnt(0)"), dict(block=128, lds=512, out_words=128)),
        (DMA.format(wait=""), dict(lds=256)),
        (SGPR_ADDR.format(nops=""), {}),
        (DPP.format(n=""), {}),
        (LOAD_X + "  v_exp_f32 v4, v3\n  v_add_f32 v5, v4, v4\n", {}),
    ]
    for body, kw in broken:
        with pytest.raises(HazardError):
            run(body, **kw)
        run(body, strict=False, **kw)      # no HazardError
