"""In-flight loads: which overlapping loads into one register are legal.

VMEM loads return in issue order, and so do DS loads: a second load into a register
whose first load has not landed is fine (the later one wins, as on hardware — aiter's
hardware-proven fwd kernel does this with ds_read_b64_tr_b16). Loads from different
queues, or a VALU write, racing a pending load make the final value unpredictable.
"""
import numpy as np
import pytest

from asm_harness import run_snippet
from gfxasm.emu import HazardError

rng = np.random.default_rng(11)
ADDR = (np.arange(64) * 4).astype(np.uint32)


def _lds_init():
    vals = rng.integers(1, 2**32, size=(2, 64), dtype=np.uint64).astype(np.uint32)
    return vals, ("ds_write_b32 v0, v1\n ds_write_b32 v0, v2 offset:256\n s_waitcnt lgkmcnt(0)\n")


def test_two_ds_reads_into_one_register_land_in_order():
    vals, init = _lds_init()
    out = run_snippet(init + "ds_read_b32 v3, v0\n ds_read_b32 v3, v0 offset:256\n s_waitcnt lgkmcnt(0)",
                      vgprs={0: ADDR, 1: vals[0], 2: vals[1]}, outputs=["v3"], lds_bytes=512)
    np.testing.assert_array_equal(out["v3"], vals[1])


def test_valu_write_racing_a_pending_ds_read_is_a_hazard():
    vals, init = _lds_init()
    with pytest.raises(HazardError, match="v3 overwritten while a load into it is still in flight"):
        run_snippet(init + "ds_read_b32 v3, v0\n v_mov_b32 v3, 0\n s_waitcnt lgkmcnt(0)",
                    vgprs={0: ADDR, 1: vals[0], 2: vals[1]}, outputs=["v3"], lds_bytes=512)


def test_ds_read_racing_a_pending_global_load_is_a_hazard():
    vals, init = _lds_init()
    with pytest.raises(HazardError, match="v3 overwritten while a load into it is still in flight"):
        run_snippet(init + "global_load_dword v3, v255, s[90:91]\n ds_read_b32 v3, v0\n s_waitcnt vmcnt(0) lgkmcnt(0)",
                    vgprs={0: ADDR, 1: vals[0], 2: vals[1]}, outputs=["v3"], lds_bytes=512)
