"""Named hazard waivers: only the rules hazards.WAIVABLE lists, only when asked for."""
import numpy as np
import pytest

from asm_harness import run_snippet
from gfxasm.emu import HazardError

rng = np.random.default_rng(5)
A = rng.standard_normal(64).astype(np.float32)

# A 4-pass XDL MFMA, then a VALU read of its result 2 wait states later (LLVM: 8).
BODY = """
  v_mfma_f32_16x16x32_bf16 v[10:13], v[0:3], v[4:7], 0
  s_nop 1
  v_mov_b32 v20, v10
"""


def _inputs():
    bf16 = rng.integers(0x3E00, 0x4000, size=(8, 64), dtype=np.uint32)   # bf16 in [0.125, 2)
    return {r: bf16[r] | (bf16[(r + 1) % 8] << 16) for r in range(8)}


def test_early_xdl_read_is_a_hazard_unless_waived():
    vgprs = _inputs()
    with pytest.raises(HazardError, match="v10 read 2 wait states after a 4-pass MFMA"):
        run_snippet(BODY, vgprs=vgprs, outputs=["v20"])
    waived = run_snippet(BODY, vgprs=vgprs, outputs=["v20", "v10"], waive=("xdl_result_valu_read",))
    padded = run_snippet(BODY.replace("s_nop 1", "s_nop 7"), vgprs=vgprs, outputs=["v20"])
    np.testing.assert_array_equal(waived["v20"], padded["v20"])     # the final MFMA value


def test_unknown_waiver_is_refused():
    with pytest.raises(ValueError, match="unknown hazard rule"):
        run_snippet("v_mov_b32 v1, 0", outputs=["v1"], waive=("no_such_rule",))


# A VALU result read as a DPP source 1 wait state later (LLVM and the ISA: 2).
DPP_BODY = """
  v_add_f32 v1, v0, v0
  v_mov_b32 v3, 0
  v_mov_b32_dpp v2, v1 row_shr:1 row_mask:0xf bank_mask:0xf
"""


def test_dpp_read_one_wait_state_after_valu_is_a_hazard_unless_waived():
    vgprs = {0: A.view(np.uint32)}
    with pytest.raises(HazardError, match="v1 read 1 wait states after a VALU op wrote it; 2 are required"):
        run_snippet(DPP_BODY, vgprs=vgprs, outputs=["v2"])
    waived = run_snippet(DPP_BODY, vgprs=vgprs, outputs=["v2"], waive=("valu_write_dpp_read",))
    padded = run_snippet(DPP_BODY.replace("v_mov_b32 v3, 0", "v_mov_b32 v3, 0\n  s_nop 0"),
                         vgprs=vgprs, outputs=["v2"])
    np.testing.assert_array_equal(waived["v2"], padded["v2"])
    # The waiver lowers the rule to 1 wait state, not to none.
    with pytest.raises(HazardError, match="v1 read 0 wait states"):
        run_snippet(DPP_BODY.replace("  v_mov_b32 v3, 0\n", ""), vgprs=vgprs, outputs=["v2"],
                    waive=("valu_write_dpp_read",))
