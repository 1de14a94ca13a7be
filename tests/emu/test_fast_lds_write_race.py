"""A DS write over LDS bytes another wave wrote (its write complete, no s_barrier between):
strict mode reports the race by name, on the numpy path and on lds._write_checked's
compiled path alike (tests/conftest.py lowers fast.MIN_WAVES for tests/emu, so this
2-wave launch takes the compiled path first, which declines, then the numpy path reports).
Before the fix in lds._check_order a write of this kind crashed it (`~False` applied to a
bool array) and the launch failed with an internal error instead of the report."""
import numpy as np

from gfxasm.emu.errors import HazardError
from test_strict import LOAD_X, X, f32, rejects, run

WRITE_AFTER_WRITE = LOAD_X + """
  v_readfirstlane_b32 s20, v1         // 0 in wave 0, 64 in wave 1
  s_cmp_eq_u32 s20, 0
  s_cbranch_scc1 L_second
  // wave 1 (lower pc: the emulator runs it first) writes wave 0's slot and waits for it
  v_subrev_u32 v6, 0x100, v2
  ds_write_b32 v6, v3
  s_waitcnt lgkmcnt(0)
{first_sync}
  s_branch L_end
L_second:                             // wave 0 writes the same slot
{second_sync}
  v_mul_f32 v7, 2.0, v3
  ds_write_b32 v2, v7
  s_waitcnt lgkmcnt(0)
  ds_read_b32 v4, v2
  s_waitcnt lgkmcnt(0)
  global_store_dword v2, v4, s[6:7]
  s_waitcnt vmcnt(0)
L_end:
"""


def test_write_over_another_waves_completed_write_without_barrier_is_reported():
    rejects(WRITE_AFTER_WRITE.format(first_sync="", second_sync=""), HazardError,
            "writes LDS address 0x0 (lane 0)", "which wave 1 of the workgroup wrote", "(LDS race)",
            at="ds_write_b32", block=128, lds=512, out_words=128)


def test_write_over_another_waves_write_after_a_barrier_runs():
    synced = WRITE_AFTER_WRITE.format(first_sync="  s_barrier", second_sync="  s_barrier")
    out = run(synced, block=128, lds=512, out_words=128)
    np.testing.assert_array_equal(f32(out[:64]), 2 * X[:64])
    assert (out[64:] == 0xFFFFFFFF).all()          # wave 1 stores nothing
