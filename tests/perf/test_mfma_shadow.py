"""The VALU/MFMA co-execution rules (docs/model-ruler.md) on streams whose cycles are
derived by hand: per repetition of [one MFMA, k shadow ops] on one wave the period is
max(MFMA pipe cycles, hold + the shadow ops' VALU cycles), or, for a packed-FP32/DOT op,
its shadow bar + its own 4 cycles."""
from __future__ import annotations

import dataclasses

import pytest

from gfxasm import perf
from gfxasm.perf import params as P

from . import microkernels as mk

F8 = "v_mfma_f32_32x32x64_f8f6f4 v[0:15], v[16:23], v[24:31], v[0:15]"   # 16 passes = 64 clk, 32-B A/B
BF16 = "v_mfma_f32_32x32x16_bf16 v[0:15], v[16:19], v[20:23], v[0:15]"    # 8 passes = 32 clk, 16-B A/B


def period(mfma: str, shadow: list[str], prm: P.Params = P.DEFAULT, waves: int = 1) -> float:
    """Steady-state cycles of one [MFMA + shadow] repetition (difference of 16 and 8 reps)."""
    def cyc(n):
        est = perf.estimate(mk.mfma_shadow(n, mfma, shadow), grid=(1, 1, 1), block=(64 * waves, 1, 1), params=prm)
        return est.cycles_per_round
    return (cyc(16) - cyc(8)) / 8


def adds(k: int) -> list[str]:
    return [f"v_add_f32 v{32 + i % 16}, v48, v49" for i in range(k)]


def exps(k: int) -> list[str]:
    return [f"v_exp_f32 v{32 + i % 16}, v48" for i in range(k)]


def test_valu_waits_out_the_operand_read_hold():
    # 32-B sources: hold 1 + 32/16 = 3 slots = 12 clk, then 4 clk per add, inside 64 clk:
    # 13 adds fit (12 + 52 = 64), the 14th and 15th push the next MFMA by 4 each.
    assert period(F8, adds(13)) == 64
    assert period(F8, adds(14)) == 68
    assert period(F8, adds(15)) == 72
    # 16-B sources: hold 2 slots = 8 clk; 32-clk MFMA leaves 24 clk = 6 adds (the gluon
    # tutorials' measured window for 32x32x16).
    assert period(BF16, adds(6)) == 32
    assert period(BF16, adds(7)) == 36


def test_hold_bracket_moves_the_hold_by_a_slot():
    longer = dataclasses.replace(P.DEFAULT, mfma_hold_extra_slots=1)
    shorter = dataclasses.replace(P.DEFAULT, mfma_hold_extra_slots=-1)
    assert period(F8, adds(15), longer) == 16 + 60          # 4 slots + 15 adds
    assert period(F8, adds(15), shorter) == 8 + 60          # 2 slots + 15 adds
    assert period(F8, adds(14), shorter) == 64              # 8 + 56 fit in the 64-clk pipe


def test_transcendental_in_the_shadow_at_8_clk():
    # 12 + 6 x 8 = 60 fits, 12 + 7 x 8 = 68 does not; at the pessimistic 16 clk 12 + 4 x 16 = 76.
    assert period(F8, exps(6)) == 64
    assert period(F8, exps(7)) == 68
    assert period(F8, exps(4), dataclasses.replace(P.DEFAULT, trans_cycles=16)) == 76


@pytest.mark.parametrize("op", ["v_pk_fma_f32 v[32:33], v[34:35], v[36:37], v[38:39]",
                                "v_pk_mul_f32 v[32:33], v[34:35], v[36:37]",
                                "v_dot2_f32_bf16 v32, v34, v35, v36"])
def test_packed_fp32_and_dot_wait_out_the_mfma(op):
    # passes + 2 + 1 (A source >= 16 B) slots after the MFMA's issue, then 4 clk of VALU
    # before the next MFMA may take the vector port: 16-pass (16+3) x 4 + 4 = 80, 8-pass 11 x 4 + 4 = 48.
    assert period(F8, [op]) == 80
    assert period(BF16, [op.replace("v[32:33]", "v[32:33]")]) == 48


def test_packed_16_bit_ops_issue_like_plain_valu():
    assert period(BF16, ["v_pk_add_f16 v32, v34, v35"] * 6) == 32


def test_trans_result_reaches_a_plain_valu_a_wait_state_late():
    # exp (8 clk) -> add reading it: ready 8 + 4 clk after the exp's issue; add 4 clk; repeat.
    chain = lambda n: mk.valu_stream(n, "v_exp_f32 v1, v1\n  v_add_f32 v1, v1, v2")   # noqa: E731
    est = lambda n: perf.estimate(chain(n), grid=(1, 1, 1), block=(64, 1, 1)).cycles_per_round  # noqa: E731
    assert (est(32) - est(16)) / 16 == 12 + 4


def test_hold_scope_decides_whether_the_other_wave_is_held():
    # SIMD s: wave s issues 64-clk MFMAs back to back, wave s + 4 only adds. Hold on the SIMD:
    # the adds get 64 - 12 = 52 clk = 13 per MFMA; hold on the issuing wave only: 64 - 4 (the
    # MFMA's own vector slot) = 15 per MFMA. With 15 adds per MFMA the VALU wave ends with the
    # chain (wave scope) or runs 2 adds x 4 clk per MFMA past it (SIMD scope).
    def cyc(n, scope):
        prm = dataclasses.replace(P.DEFAULT, mfma_hold_scope=scope)
        return perf.estimate(mk.mfma_beside_valu(n, 15 * n), grid=(1, 1, 1), block=(512, 1, 1),
                             params=prm).cycles_per_round
    assert (cyc(16, "wave") - cyc(8, "wave")) / 8 == 64
    assert (cyc(16, "simd") - cyc(8, "simd")) / 8 == 64 + 8
    with pytest.raises(ValueError, match="mfma_hold_scope"):
        cyc(1, "lane")
