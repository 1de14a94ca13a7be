"""aiter's hardware-built MX-FP8 attention forward (fmha_v4_fwd/fwd_hd128_mxfp8.co) on the
emulator: a shipped object that uses a sparse MFMA. It forms its row sums with
`v_smfmac_f32_16x16x128_fp8_fp8` against a pattern of ones (docs/smfmac-evidence.md), so
it pins that instruction's A/B pairing: under the same-lane pairing of the gfx940 forms
O comes out at cosine ~0.96.

The object is a pinned extra (gfxasm.corpus.EXTRA_OBJECTS, ROCm/aiter e8f438a): CI reaches
the package index, not GitHub, so where it is absent these tests are skipped with the
command that fetches it (`gfxasm corpus fetch-extra fmha_v4_fwd/fwd_hd128_mxfp8.co`).

Finding F9 (docs/conformance.md): with more than one KV tile, strict mode reports an LDS
race: waves 4-7 (their own code path from label_wave47) issue the next tile's LDS DMA
(pc 0x5974, 0xabc4 in the masked tail loop) over bytes waves 0-3 read with no s_barrier
between. The output matches under the timed and lockstep schedules; adversarial seeds
0, 1, 4, 8 and 9 of 12 (B1 H1 Sq256 Sk256) give a wrong O (seed 0 pinned).
"""
from __future__ import annotations

import dataclasses

import pytest

import gfxasm.emu as emu
import gfxasm.perf  # noqa: F401  (registers the timed schedule)
from gfxasm import corpus
from gfxasm.emu import HazardError

from . import cases_mxfp8

# The P > 448 rollback blocks (label_rollback_overflow_* up to label_wave47, and again up
# to label_core_loop_with_mask_0): entered when a tile's scores pass the running maximum
# by more than FP8 can hold after exp2.
ROLLBACK_PCS = ((0x3D5C, 0x4E84), (0x6C6C, 0x7DA8))


def _object():
    try:
        return cases_mxfp8.path()
    except corpus.CorpusMissing as exc:
        pytest.skip(str(exc))


def run(case, strict: bool, schedule: str = "lockstep", seed: int | None = None) -> set[int]:
    """Launch; returns the rollback-block pcs executed."""
    kernel = emu.load(_object()).kernel(cases_mxfp8.SYMBOL)
    seen: set[int] = set()

    def trace(inst, w):
        if any(lo <= inst.pc < hi for lo, hi in ROLLBACK_PCS):
            seen.add(inst.pc)

    kernel.launch(grid=case.grid, block=case.block, kernarg=case.kernarg, buffers=case.buffers,
                  strict=strict, schedule=schedule, seed=seed, trace=trace)
    return seen


def test_mxfp8_attention_one_kv_tile_is_strict_clean():
    """One KV tile (128 keys), Q tail (200 of 256 rows), GQA 2: strict, no report."""
    case = cases_mxfp8.mxfp8_attention(1, 2, 1, 200, 128, seed=1)
    run(case, strict=True)
    case.check()


MULTI_TILE = {
    # B2, GQA 2, Q tail (100 of 256 rows)
    "B2_gqa2_100x256": lambda: cases_mxfp8.mxfp8_attention(2, 4, 2, 100, 256, seed=2),
    # the last 64 keys score 12 (log2 units) above the rest: the P > 448 rollback path
    "rollback_256x512": lambda: cases_mxfp8.mxfp8_attention(1, 1, 1, 256, 512, seed=3, late_peak=12.0),
    # KV tail (200 of 256 keys: the masked loop), two Q tiles
    "tails_300x200": lambda: cases_mxfp8.mxfp8_attention(1, 2, 1, 300, 200, seed=4),
}


@pytest.mark.parametrize("name", ["rollback_256x512",
                                  *[pytest.param(n, marks=pytest.mark.full) for n in MULTI_TILE
                                    if n != "rollback_256x512"]])
def test_mxfp8_attention_finding_f9_then_output(name):
    """F9 is reported in strict mode; outside it O matches under the timed schedule (and
    under lockstep, -m full). The rollback configuration must take the rollback path."""
    with pytest.raises(HazardError, match=r"buffer_load_dwordx4 overwrites LDS address .*LDS race.*"
                                          r"pc 0x(5974|abc4)"):
        run(MULTI_TILE[name](), strict=True)
    case = MULTI_TILE[name]()
    rollback = run(case, strict=False, schedule="timed")
    case.check()
    assert bool(rollback) == (name == "rollback_256x512"), f"rollback pcs executed: {len(rollback)}"


def test_mxfp8_attention_f9_adversarial_seed_gives_a_wrong_o():
    """F9 under a legal schedule: adversarial seed 0 (gfxasm.emu.adversarial) corrupts O
    (max error ~0.22 against a tolerance of ~0.024), so the kernel's order is not
    guaranteed by the ISA; which of the unordered accesses each wrong seed exercises was
    not traced."""
    case = cases_mxfp8.mxfp8_attention(1, 1, 1, 256, 256, seed=5)
    run(case, strict=False, schedule="adversarial", seed=0)
    with pytest.raises(AssertionError, match="O max error"):
        case.check()


@pytest.mark.full
@pytest.mark.parametrize("name", list(MULTI_TILE))
def test_mxfp8_attention_lockstep(name):
    case = MULTI_TILE[name]()
    run(case, strict=False, schedule="lockstep")
    case.check()


def test_mxfp8_attention_needs_the_sparse_rowsum_pairing(monkeypatch):
    """The same launch with the gfx940 same-lane pairing forced onto the 16x16x128 form
    gives a wrong O: this object is the evidence that decides the pairing."""
    from gfxasm.emu.families import smfmac
    name = "v_smfmac_f32_16x16x128_fp8_fp8"
    monkeypatch.setitem(smfmac.SMFMAC, name, dataclasses.replace(smfmac.SMFMAC[name], pairing=smfmac.LANE))
    case = cases_mxfp8.mxfp8_attention(1, 2, 1, 200, 128, seed=1)
    run(case, strict=True)
    with pytest.raises(AssertionError, match="cosine"):
        case.check()
