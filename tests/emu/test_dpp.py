"""Known-answer tests for DPP (loader/emu/families/dpp.py, driven through vop.py).

The reference below is written from LLVM's AMDGPUModifierSyntax descriptions of each
dpp_ctrl ("row_shr: row shift right by 1-15 threads", "row_bcast:15: broadcast the 15th
thread of each row to the next row", "row_newbcast: broadcast a thread within a row to
the whole row", ...), its bound_ctrl/fi text ("accessing data from an invalid lane will
return zero"; with fi:0 inactive lanes are invalid lanes) and the row/bank mask
definitions (row r = lanes 16r..16r+15, bank k = lanes 4k..4k+3 of every row; masks gate
the destination write only). Lane i "shifted right by n" receives lane i-n.
"""
import numpy as np
import pytest

from asm_harness import run_snippet
from gfxasm.emu import decode
from gfxasm.emu.errors import HazardError, UnsupportedInstruction
from gfxasm.emu.families import dpp

FULL = (1 << 64) - 1


def rand_u32(r, n=64):
    return r.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)


def source(ctrl: str, i: int):
    """(source lane, in range) for lane i, from the control's documented meaning."""
    name, _, arg = ctrl.partition(":")
    row, pos = divmod(i, 16)
    if name == "quad_perm":
        sel = [int(x) for x in arg.strip("[]").split(",")]
        return 4 * (i // 4) + sel[i % 4], True
    if name == "row_shl":
        n = int(arg)
        return i + n, pos + n <= 15
    if name == "row_shr":
        n = int(arg)
        return i - n, pos - n >= 0
    if name == "row_ror":
        return 16 * row + (pos - int(arg)) % 16, True
    if name == "wave_shl":
        return i + 1, i < 63
    if name == "wave_shr":
        return i - 1, i > 0
    if name == "wave_rol":
        return (i + 1) % 64, True
    if name == "wave_ror":
        return (i - 1) % 64, True
    if name == "row_mirror":
        return 16 * row + 15 - pos, True
    if name == "row_half_mirror":
        return 8 * (i // 8) + 7 - i % 8, True
    if name == "row_bcast" and arg == "15":
        return 16 * row - 1, row >= 1
    if name == "row_bcast" and arg == "31":
        return 31, row >= 2
    if name == "row_newbcast":
        return 16 * row + int(arg), True
    raise AssertionError(ctrl)


def reference(ctrl, src, old, exec_mask, row_mask=0xF, bank_mask=0xF, bound_ctrl=False):
    out = []
    for i in range(64):
        active = (exec_mask >> i) & 1
        enabled = (row_mask >> (i // 16)) & 1 and (bank_mask >> ((i % 16) // 4)) & 1
        if not active or not enabled:
            out.append(int(old[i]))
            continue
        s, ok = source(ctrl, i)
        if ok and (exec_mask >> s) & 1:
            out.append(int(src[s]))
        elif bound_ctrl:
            out.append(0)
        else:
            out.append(int(old[i]))
    return np.array(out, np.uint32)


CONTROLS = ["quad_perm:[1,0,3,2]", "quad_perm:[3,3,0,1]", "quad_perm:[0,0,0,0]",
            "row_shl:1", "row_shl:7", "row_shl:15", "row_shr:1", "row_shr:3", "row_shr:8",
            "row_ror:1", "row_ror:5", "row_ror:15", "wave_shl:1", "wave_shr:1", "wave_rol:1",
            "wave_ror:1", "row_mirror", "row_half_mirror", "row_bcast:15", "row_bcast:31",
            "row_newbcast:0", "row_newbcast:9", "row_newbcast:15"]


def _run_controls(controls, masks, exec_mask, seed, bound_ctrl):
    """One kernel: v1 = source, v[10+k] = old values; each control moves v1 into v[10+k]."""
    r = np.random.default_rng(seed)
    src = rand_u32(r)
    olds = {10 + k: rand_u32(r) for k in range(len(controls))}
    bc = " bound_ctrl:1" if bound_ctrl else ""
    lines = ["  s_mov_b64 exec, s[20:21]"]
    for k, (ctrl, (rm, bm)) in enumerate(zip(controls, masks)):
        lines.append(f"  v_mov_b32_dpp v{10 + k}, v1 {ctrl} row_mask:{rm:#x} bank_mask:{bm:#x}{bc}")
    lines.append("  s_mov_b64 exec, -1")
    out = run_snippet("\n".join(lines) + "\n", vgprs={1: src, **olds},
                      sgprs={20: exec_mask & 0xFFFFFFFF, 21: exec_mask >> 32},
                      outputs=[f"v{10 + k}" for k in range(len(controls))])
    for k, (ctrl, (rm, bm)) in enumerate(zip(controls, masks)):
        want = reference(ctrl, src, olds[10 + k], exec_mask, rm, bm, bound_ctrl)
        np.testing.assert_array_equal(out[f"v{10 + k}"], want, err_msg=f"{ctrl} rm={rm:#x} bm={bm:#x} bc={bound_ctrl}")


@pytest.mark.parametrize("bound_ctrl", [False, True])
def test_every_control_full_exec(bound_ctrl):
    _run_controls(CONTROLS, [(0xF, 0xF)] * len(CONTROLS), FULL, 11 + bound_ctrl, bound_ctrl)


@pytest.mark.parametrize("bound_ctrl", [False, True])
def test_every_control_masks_and_partial_exec(bound_ctrl):
    r = np.random.default_rng(21 + bound_ctrl)
    masks = [(int(a), int(b)) for a, b in r.integers(0, 16, (len(CONTROLS), 2))]
    exec_mask = int(r.integers(0, 2**64, dtype=np.uint64))
    _run_controls(CONTROLS, masks, exec_mask, 31 + bound_ctrl, bound_ctrl)


def test_vop2_dpp_with_modifiers():
    """DPP moves src0 only; neg/abs apply to the moved value; src1 is the lane's own."""
    r = np.random.default_rng(41)
    a = r.standard_normal(64).astype(np.float32)
    b = r.standard_normal(64).astype(np.float32)
    old = rand_u32(r)
    out = run_snippet("  v_add_f32_dpp v3, -v1, |v2| row_shr:2 row_mask:0xf bank_mask:0xf bound_ctrl:1\n"
                      "  v_mov_b32 v4, v5\n"
                      "  v_sub_f32_dpp v4, |v1|, v2 row_ror:3 row_mask:0x5 bank_mask:0xf\n",
                      vgprs={1: a.view(np.uint32), 2: b.view(np.uint32), 3: old, 5: old},
                      outputs=["v3", "v4"])
    for i in range(64):
        s = i - 2
        moved = a[s] if i % 16 >= 2 else np.float32(0)
        assert out["v3"][i] == np.float32(-moved + abs(b[i])).view(np.uint32), i
        if (0x5 >> (i // 16)) & 1:
            s = 16 * (i // 16) + (i % 16 - 3) % 16
            assert out["v4"][i] == np.float32(abs(a[s]) - b[i]).view(np.uint32), i
        else:
            assert out["v4"][i] == old[i], i


def test_mov_b64_dpp_newbcast():
    """Regression: 64-bit DPP sources used to be read without the lane move."""
    r = np.random.default_rng(51)
    lo, hi, o0, o1 = (rand_u32(r) for _ in range(4))
    out = run_snippet("  v_mov_b64_dpp v[6:7], v[2:3] row_newbcast:6 row_mask:0xf bank_mask:0xf\n",
                      vgprs={2: lo, 3: hi, 6: o0, 7: o1}, outputs=["v6", "v7"])
    src = 16 * (np.arange(64) // 16) + 6
    np.testing.assert_array_equal(out["v6"], lo[src])
    np.testing.assert_array_equal(out["v7"], hi[src])


def test_bound_ctrl_comes_from_the_raw_bit():
    """Regression: LLVM before 13 printed the set BOUND_CTRL bit as `bound_ctrl:0`; the
    control must come from bit 19 of the DPP dword, not from the printed value."""
    words = (0x7E0202FA, 0xFF091302)       # v_mov_b32_dpp v1, v2 row_shr:3, BOUND_CTRL set
    old_text = "v_mov_b32_dpp v1, v2 row_shr:3 row_mask:0xf bank_mask:0xf bound_ctrl:0"
    inst = decode.parse_line(old_text, 0, words)
    f = dpp.fields(inst)
    assert (f["ctrl"], f["bound_ctrl"], f["row_mask"], f["bank_mask"]) == (0x113, 1, 0xF, 0xF)
    clear = decode.parse_line("v_mov_b32_dpp v1, v2 row_shr:3 row_mask:0xa bank_mask:0x5", 0,
                              (0x7E0202FA, 0xA5011302))
    f = dpp.fields(clear)
    assert (f["ctrl"], f["bound_ctrl"], f["row_mask"], f["bank_mask"]) == (0x113, 0, 0xA, 0x5)


@pytest.mark.parametrize("ctrl", [0x100, 0x131, 0x144, 0x160])
def test_reserved_controls_rejected(ctrl):
    with pytest.raises(UnsupportedInstruction, match="reserved"):
        dpp.source_lanes(ctrl)


def test_valu_write_then_dpp_read_needs_two_wait_states():
    body_bad = "  v_mov_b32 v2, v1\n  s_nop 0\n  v_mov_b32_dpp v3, v2 row_shl:1 row_mask:0xf bank_mask:0xf\n"
    with pytest.raises(HazardError, match="2 are required"):
        run_snippet(body_bad, vgprs={1: np.arange(64, dtype=np.uint32)}, outputs=[])
    run_snippet(body_bad.replace("s_nop 0", "s_nop 1"), vgprs={1: np.arange(64, dtype=np.uint32)}, outputs=[])


def test_valu_exec_write_then_dpp_needs_five_wait_states():
    body = "  v_cmpx_le_u32 vcc, v1, v1\n  s_nop {n}\n  v_mov_b32_dpp v3, v1 row_shl:1 row_mask:0xf bank_mask:0xf\n"
    with pytest.raises(HazardError, match="EXEC"):
        run_snippet(body.format(n=3), vgprs={1: np.arange(64, dtype=np.uint32)}, outputs=[])
    run_snippet(body.format(n=4), vgprs={1: np.arange(64, dtype=np.uint32)}, outputs=[])


def test_dpp_write_mask_does_not_leak_into_exec():
    """Regression: the DPP write mask was and-ed in place into the (cached) EXEC lane mask,
    so lanes with an invalid DPP source stayed disabled for the following instructions."""
    r = np.random.default_rng(61)
    a, b = rand_u32(r), rand_u32(r)
    out = run_snippet("  v_mov_b32_dpp v3, v1 row_shr:4 row_mask:0x3 bank_mask:0x9\n  v_mov_b32 v4, v2\n",
                      vgprs={1: a, 2: b, 3: a}, outputs=["v4"])
    np.testing.assert_array_equal(out["v4"], b)
