"""aiter's hardware-built FP8 attention forwards (fmha_v3_fwd/fwd_hd128_fp8[_causal][_group].co)
on the emulator: the instruction forms our FP8 prefill uses (v_mfma_f32_32x32x64_f8f6f4 on
e4m3 operands, ds_read_b64_tr_b8, v_cvt_pk_fp8_f32, v_permlane32_swap) in shipped code,
against a float64 reference (tests/conformance/cases_fp8_fwd.py).

The objects are pinned extras (gfxasm.corpus.EXTRA_OBJECTS, ROCm/aiter e8f438a): CI reaches
the package index, not GitHub, so where one is absent its tests are skipped with the command
that fetches it (`gfxasm corpus fetch-extra fmha_v3_fwd/<name>.co`).

Finding F10 (docs/conformance.md): every object reads V^T operands (v[20:27], four
ds_read_b64_tr_b8 issued in the prologue) in its first P.V MFMA with no lgkmcnt wait that
covers them (its `s_waitcnt lgkmcnt(8)` leaves all eight reads of the prologue in flight;
s_barrier does not wait for them). Strict mode reports it; under the timed and lockstep
schedules O and LSE match; under adversarial seeds 0-5 O is wrong (max error 2.4-4.1 against
a tolerance of 0.13; which unordered access each seed exercises was not traced).
"""
from __future__ import annotations

import pytest

import gfxasm.emu as emu
import gfxasm.perf  # noqa: F401  (registers the timed schedule)
from gfxasm import corpus
from gfxasm.emu import HazardError

from tests.conformance import cases_fp8_fwd as fp8

# object -> pc of the first P.V MFMA that reads the prologue's V^T loads (F10)
F10_PC = {"fwd_hd128_fp8": 0x4a48, "fwd_hd128_fp8_causal": 0x76dc,
          "fwd_hd128_fp8_group": 0x4c0c, "fwd_hd128_fp8_causal_group": 0x77ac}


def run(case, strict: bool, schedule: str = "lockstep", seed: int | None = None) -> None:
    stem = case.co.split("/")[-1].removesuffix(".co")
    try:
        path = corpus.extra_object(f"fmha_v3_fwd/{stem}.co")
    except corpus.CorpusMissing as exc:
        pytest.skip(str(exc))
    emu.load(path).kernel(case.symbol).launch(grid=case.grid, block=case.block, kernarg=case.kernarg,
                                              buffers=case.buffers, strict=strict, schedule=schedule, seed=seed)


def expect_f10_then_match(make, schedule: str) -> None:
    """Strict mode reports F10 at the object's pc; outside it O and LSE match under `schedule`."""
    case = make()
    stem = case.co.split("/")[-1].removesuffix(".co")
    with pytest.raises(HazardError, match=rf"v20 read while a load into it is still in flight.*"
                                          rf"pc {F10_PC[stem]:#x} `v_mfma_f32_32x32x64_f8f6f4"):
        run(case, strict=True)
    case = make()
    run(case, strict=False, schedule=schedule)
    case.check()


def test_fp8_fwd_f10_then_output_matches():
    """B1 Hq2/Hk1 (GQA 2), Sq 256 Sk 128: one Q tile, one KV tile (default suite)."""
    expect_f10_then_match(lambda: fp8.fp8_fwd(1, 2, 1, 256, 128, seed=1), "timed")


CASES = {
    # B2, GQA 2, Q and KV tails (300 of 512), three KV tiles
    "B2_gqa2_300x300": lambda: fp8.fp8_fwd(2, 4, 2, 300, 300, seed=2),
    # causal (bottom-right), one Q tile pair, two KV tiles
    "causal_gqa2_200x256": lambda: fp8.fp8_fwd(1, 2, 1, 200, 256, seed=3, causal=True),
    # causal, B2, GQA 4, tails
    "causal_B2_gqa4_70x130": lambda: fp8.fp8_fwd(2, 8, 2, 70, 130, seed=4, causal=True),
    # group: two sequences, Q and KV lengths differing
    "group_100_200": lambda: fp8.fp8_fwd_group([100, 200], [150, 200], 2, 1, seed=5),
    # causal group, GQA 4
    "causal_group_gqa4_37_100": lambda: fp8.fp8_fwd_group([37, 100], [64, 100], 8, 2, seed=6, causal=True),
    # group: a one-token sequence among longer ones, MHA
    "group_1_77_300": lambda: fp8.fp8_fwd_group([1, 77, 300], [70, 77, 260], 2, 2, seed=7),
}


@pytest.mark.full
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("schedule", ["timed", "lockstep"])
def test_fp8_fwd_cases(name, schedule):
    expect_f10_then_match(CASES[name], schedule)


@pytest.mark.full
def test_fp8_fwd_f10_adversarial_seed_gives_a_wrong_o():
    """F10 under a legal schedule: adversarial seed 0 gives a wrong O (max error ~4 against a
    tolerance of ~0.13), so the kernel's order is not guaranteed by the ISA; that the late
    access is the prologue's V^T read was not traced."""
    case = fp8.fp8_fwd(1, 2, 1, 256, 128, seed=1)
    run(case, strict=False, schedule="adversarial", seed=0)
    with pytest.raises(AssertionError, match="O max error"):
        case.check()
