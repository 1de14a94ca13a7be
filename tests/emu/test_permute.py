"""Known-answer tests for v_permlane16_swap_b32 / v_permlane32_swap_b32 (families/permute.py).

Reference, from LLVM's intrinsic docs and the fact sheet §3: permlane16_swap trades the odd
16-lane rows of the first operand with the even rows of the second (rows 1<->0 and 3<->2 —
hardware-proven by aiter's fwd_hd128_bf16.co); permlane32_swap trades rows 2-3 of the first
operand with rows 0-1 of the second. Both registers are written.
"""
import numpy as np
import pytest

from asm_harness import run_snippet
from gfxasm.emu.errors import HazardError, UnsupportedInstruction


def rand_u32(r):
    return r.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)


def swap_reference(a, b, rows_a, rows_b):
    """Row k of rows_a in `a` trades places with row k of rows_b in `b`."""
    a, b = a.copy(), b.copy()
    for ra, rb in zip(rows_a, rows_b):
        sa, sb = slice(16 * ra, 16 * ra + 16), slice(16 * rb, 16 * rb + 16)
        a[sa], b[sb] = b[sb].copy(), a[sa].copy()
    return a, b


CASES = [("v_permlane16_swap_b32", (1, 3), (0, 2)), ("v_permlane32_swap_b32", (2, 3), (0, 1))]


@pytest.mark.parametrize("name,rows_a,rows_b", CASES)
def test_swap_both_registers(name, rows_a, rows_b):
    r = np.random.default_rng(len(name) + rows_a[0])
    a, b = rand_u32(r), rand_u32(r)
    out = run_snippet(f"  {name} v1, v2\n  {name}_e64 v3, v4\n",
                      vgprs={1: a, 2: b, 3: a, 4: b}, outputs=["v1", "v2", "v3", "v4"])
    ea, eb = swap_reference(a, b, rows_a, rows_b)
    for reg, want in (("v1", ea), ("v2", eb), ("v3", ea), ("v4", eb)):
        np.testing.assert_array_equal(out[reg], want, err_msg=f"{name} {reg}")


@pytest.mark.parametrize("name,rows_a,rows_b", CASES)
def test_swap_same_register(name, rows_a, rows_b):
    r = np.random.default_rng(7 + rows_a[0])
    a = rand_u32(r)
    out = run_snippet(f"  {name} v1, v1\n", vgprs={1: a}, outputs=["v1"])
    want = a.copy()          # one register: its paired rows trade places
    for ra, rb in zip(rows_a, rows_b):
        want[16 * ra:16 * ra + 16] = a[16 * rb:16 * rb + 16]
        want[16 * rb:16 * rb + 16] = a[16 * ra:16 * ra + 16]
    np.testing.assert_array_equal(out["v1"], want)


def test_swap_pairs_fully_inactive_are_untouched():
    r = np.random.default_rng(31)
    a, b = rand_u32(r), rand_u32(r)
    mask = 0x0000_0000_FFFF_FFFF       # rows 2 and 3 off: the pair (row 3 of v1, row 2 of v2) is off
    body = "  s_mov_b64 exec, s[10:11]\n  v_permlane16_swap_b32 v1, v2\n  s_mov_b64 exec, -1\n"
    out = run_snippet(body, vgprs={1: a, 2: b}, sgprs={10: mask & 0xFFFFFFFF, 11: mask >> 32},
                      outputs=["v1", "v2"])
    ea, eb = swap_reference(a, b, (1,), (0,))
    np.testing.assert_array_equal(out["v1"], ea)
    np.testing.assert_array_equal(out["v2"], eb)


def test_swap_with_half_active_pair_rejected():
    body = "  s_mov_b64 exec, s[10:11]\n  v_permlane32_swap_b32 v1, v2\n  s_mov_b64 exec, -1\n"
    mask = (1 << 64) - 1 - (1 << 40)
    with pytest.raises(UnsupportedInstruction, match="swap partner"):
        run_snippet(body, vgprs={1: np.arange(64, dtype=np.uint32), 2: np.arange(64, dtype=np.uint32)},
                    sgprs={10: mask & 0xFFFFFFFF, 11: mask >> 32}, outputs=[])


@pytest.mark.parametrize("reg", ["v1", "v2"])
def test_valu_write_then_permlane_read_needs_two_wait_states(reg):
    body = f"  v_mov_b32 {reg}, v5\n  s_nop {{n}}\n  v_permlane16_swap_b32 v1, v2\n"
    vg = {1: np.arange(64, dtype=np.uint32), 2: np.arange(64, dtype=np.uint32), 5: np.ones(64, np.uint32)}
    with pytest.raises(HazardError, match="2 are required"):
        run_snippet(body.format(n=0), vgprs=vg, outputs=[])
    run_snippet(body.format(n=1), vgprs=vg, outputs=[])


def test_permlane_result_read_by_permlane_needs_one_wait_state():
    """Regression: a v_permlane*_swap result read by the next swap needs 1 wait state, not the
    2 of an ordinary VALU producer — aiter's hardware-proven fwd_hd128_bf16.co does exactly
    this (v_permlane32_swap v104, v106; one instruction; v_permlane16_swap v96, v104)."""
    r = np.random.default_rng(41)
    a, b, c = rand_u32(r), rand_u32(r), rand_u32(r)
    body = "  v_permlane32_swap_b32 v1, v2\n{gap}  v_permlane16_swap_b32 v3, v1\n"
    with pytest.raises(HazardError, match="after a v_permlane\\*_swap wrote it; 1 are required"):
        run_snippet(body.format(gap=""), vgprs={1: a, 2: b, 3: c}, outputs=[])
    out = run_snippet(body.format(gap="  v_mov_b32 v9, v9\n"), vgprs={1: a, 2: b, 3: c, 9: c},
                      outputs=["v1", "v3"])
    a1, _ = swap_reference(a, b, (2, 3), (0, 1))
    c2, a2 = swap_reference(c, a1, (1, 3), (0, 2))
    np.testing.assert_array_equal(out["v1"], a2)
    np.testing.assert_array_equal(out["v3"], c2)
