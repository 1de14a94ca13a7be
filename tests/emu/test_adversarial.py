"""The adversarial schedule (gfxasm.emu.adversarial): races found by their consequence.

Each deliberately broken kernel — a missing s_waitcnt, a missing barrier before reading
LDS another wave wrote, an LDS DMA prefetch into a buffer another wave is still reading,
a partial lgkmcnt over out-of-order scalar loads, a store through a pointer not waited
for (the run faults: reported too) — gives the lockstep schedule's answer
(outside strict mode) yet changes under some seed of the first eight; its corrected twin
never changes over sixteen seeds, and its answer is checked against numpy. Legal patterns
that rely on in-order return (two loads into one register, vmcnt(N) covering only the
older loads) must not change either. Our own kernels (fmha_fwd, mxfp8_gemm,
decode_attention; small shapes) must come out bit for bit the same under four seeds and
under the timed schedule, and the paged-attention race of docs/isa-notes.md must give a
wrong answer under one of two seeds but the right one under the timed schedule, which
also lets latency hide an LDS DMA prefetch race but not a missing s_waitcnt.
Budget: about 60 s for this file on one core.
"""
from __future__ import annotations

import importlib
import struct

import numpy as np
import pytest
import torch

import gfxasm
import gfxasm.emu as emu
import gfxasm.perf  # noqa: F401  (registers schedule="timed")
from gfxasm.build import build_manifest
from gfxasm.emu import adversarial
from gfxasm.manifest import default_manifest
from kernel_source import assemble
from test_strict import EXCHANGE, LOAD_X, X, source, store   # the strict tests' kernel frame: in, out, aux
from tests.conformance import cases as conformance

BROKEN_SEEDS = range(8)
FIXED_SEEDS = range(16)


def launcher(body: str, *, block: int = 64, lds: int = 0):
    """(kernel, launch arguments) of `body` over fresh in (X), out (-1) and aux buffers."""
    kernel = emu.load(assemble(source(body, lds))).kernel("k")
    t_in = torch.from_numpy(X.view(np.int32).copy())
    t_out = torch.full((1024,), -1, dtype=torch.int32)
    t_aux = torch.zeros(64, dtype=torch.int32)
    kernarg = struct.pack("<QQQ", t_in.data_ptr(), t_out.data_ptr(), t_aux.data_ptr())
    return kernel, dict(grid=(1, 1, 1), block=(block, 1, 1), kernarg=kernarg, buffers=[t_in, t_out, t_aux])


def out_words(body: str, n: int, **kw) -> np.ndarray:
    """The first n words of `out` after one lockstep launch in strict mode."""
    kernel, args = launcher(body, **kw)
    kernel.launch(**args)
    return args["buffers"][1].numpy().view(np.float32)[:n].copy()


def divergences(body: str, seeds, **kw) -> list:
    kernel, args = launcher(body, **kw)
    return adversarial.check_launch(kernel, seeds=seeds, **args)


def assert_found(body: str, **kw):
    found = divergences(body, BROKEN_SEEDS, **kw)
    assert found, f"no seed of {list(BROKEN_SEEDS)} changed the output"
    assert all(d.name == "buffers[1]" for d in found), [str(d) for d in found]


def assert_never(body: str, **kw):
    found = divergences(body, FIXED_SEEDS, **kw)
    assert not found, "\n".join(map(str, found))


# ------------------------------------------------------------------ a missing s_waitcnt
MISSING_WAIT = """
  global_load_dword v3, v2, s[4:5]
{wait}
  v_add_f32 v4, v3, v3
""" + store(4)


def test_missing_vmcnt_changes_the_answer():
    assert_found(MISSING_WAIT.format(wait=""))
    fixed = MISSING_WAIT.format(wait="  s_waitcnt vmcnt(0)")
    assert_never(fixed)
    np.testing.assert_array_equal(out_words(fixed, 64), X[:64] * 2)


# vmcnt(1) covers the older of two loads only: legal because VMEM returns in order.
PARTIAL_WAIT = """
  global_load_dword v3, v2, s[4:5]
  global_load_dword v5, v2, s[4:5] offset:256
  s_waitcnt vmcnt({n})
  v_add_f32 v4, v{r}, v3
  s_waitcnt vmcnt(0)
""" + store(4)


def test_vmcnt_covering_the_older_load_is_legal_and_the_younger_is_not():
    assert_never(PARTIAL_WAIT.format(n=1, r=3))
    np.testing.assert_array_equal(out_words(PARTIAL_WAIT.format(n=1, r=3), 64), X[:64] * 2)
    assert_found(PARTIAL_WAIT.format(n=1, r=5))


def test_two_loads_into_one_register_land_in_issue_order():
    body = """
  global_load_dword v3, v2, s[4:5]
  global_load_dword v3, v2, s[4:5] offset:256
  s_waitcnt vmcnt(0)
""" + store(3)
    assert_never(body)
    np.testing.assert_array_equal(out_words(body, 64), X[64:128])


# Scalar loads return out of order: lgkmcnt(1) after two of them covers neither.
SCALAR = """
  s_load_dword s20, s[4:5], 0x0
  s_load_dword s21, s[4:5], 0x4
  s_waitcnt lgkmcnt({n})
  v_mov_b32 v4, s20
""" + store(4)


def test_partial_lgkmcnt_over_scalar_loads_changes_the_answer():
    assert_found(SCALAR.format(n=1))
    assert_never(SCALAR.format(n=0))
    np.testing.assert_array_equal(out_words(SCALAR.format(n=0), 64), np.full(64, X[0]))


# ------------------------------------------------------- LDS written by another wave
def test_missing_barrier_before_reading_another_waves_lds_changes_the_answer():
    assert_found(EXCHANGE.format(sync="  s_waitcnt lgkmcnt(0)"), block=128, lds=512)
    fixed = EXCHANGE.format(sync="  s_waitcnt lgkmcnt(0)\n  s_barrier")
    assert_never(fixed, block=128, lds=512)
    np.testing.assert_array_equal(out_words(fixed, 128, block=128, lds=512),
                                  np.concatenate([X[64:128], X[:64]]))


# A DS load may return after an s_barrier that does not wait for it: s_barrier waits for
# the waves, not for their counters (gfx9: LLVM puts no wait before it on gfx950, which
# supports back-off barriers). The LDS accesses themselves happen in the CU's one global
# order (AMDGPUUsage, memory model GFX940), so the write before the first barrier is seen.
BARRIER_RETURN = LOAD_X + """
  v_xor_b32 v6, 0x100, v2            // the partner wave's slot: id ^ 64
  ds_write_b32 v2, v3
  s_waitcnt lgkmcnt(0)
  s_barrier
  ds_read_b32 v4, v6
  s_barrier
{wait}
  v_add_f32 v5, v4, v4
""" + store(5)


def test_a_ds_load_may_land_after_an_s_barrier_that_does_not_wait_for_it():
    assert_found(BARRIER_RETURN.format(wait=""), block=128, lds=512)
    fixed = BARRIER_RETURN.format(wait="  s_waitcnt lgkmcnt(0)")
    assert_never(fixed, block=128, lds=512)
    np.testing.assert_array_equal(out_words(fixed, 128, block=128, lds=512),
                                  np.concatenate([X[64:128], X[:64]]) * 2)


# ------------------------------------- LDS DMA prefetch into a buffer still being read
# Each wave DMAs 64 floats into its own 256 B of LDS and, after a barrier, reads the
# partner's; then it prefetches the next 64 floats into its own slot — which the partner
# may still be reading unless a barrier separates them — and reads the partner's again.
PREFETCH = """
  v_readfirstlane_b32 s20, v2         // 0 in wave 0, 256 in wave 1
  s_nop 4
  s_mov_b32 m0, s20
  s_movk_i32 s21, 0x200
  buffer_load_dword v2, s[12:15], 0 offen lds
  s_waitcnt vmcnt(0)
  s_barrier
  v_xor_b32 v6, 0x100, v2
  ds_read_b32 v4, v6                   // round 1: the partner's slot
{sync}
  buffer_load_dword v2, s[12:15], s21 offen lds   // round 2 (in + 512 B) into my slot
  s_waitcnt vmcnt(0) lgkmcnt(0)
  s_barrier
  ds_read_b32 v5, v6
  s_waitcnt lgkmcnt(0)
  global_store_dword v2, v4, s[6:7]
  global_store_dword v2, v5, s[6:7] offset:512
  s_waitcnt vmcnt(0)
"""


def test_lds_dma_prefetch_into_a_buffer_still_being_read_changes_the_answer():
    assert_found(PREFETCH.format(sync=""), block=128, lds=512)
    fixed = PREFETCH.format(sync="  s_waitcnt lgkmcnt(0)\n  s_barrier")
    assert_never(fixed, block=128, lds=512)
    swap = np.concatenate([X[64:128], X[:64]])
    np.testing.assert_array_equal(out_words(fixed, 256, block=128, lds=512),
                                  np.concatenate([swap, np.concatenate([X[192:256], X[128:192]])]))


# A scalar load of a pointer not waited for: the store's address comes from the stale SGPRs.
STALE_POINTER = """
  s_load_dwordx2 s[20:21], s[0:1], 0x8      // out, again
{wait}
  global_store_dword v2, v2, s[20:21]
  s_waitcnt vmcnt(0)
"""


def test_a_run_that_fails_under_a_seed_is_reported():
    found = divergences(STALE_POINTER.format(wait=""), BROKEN_SEEDS)
    assert found and all(d.name == "run" and "MemoryFault" in d.error for d in found), [str(d) for d in found]
    assert "the run failed: MemoryFault" in str(found[0])
    assert_never(STALE_POINTER.format(wait="  s_waitcnt lgkmcnt(0)"))


# --------------------------------------------------------------- the schedule itself
def test_a_seed_reproduces_its_schedule():
    kernel, args = launcher(EXCHANGE.format(sync="  s_waitcnt lgkmcnt(0)"), block=128, lds=512)

    def out(seed):
        args["buffers"][1].fill_(-1)
        kernel.launch(**args, strict=False, schedule="adversarial", seed=seed)
        return args["buffers"][1].numpy().tobytes()
    first = [out(seed) for seed in BROKEN_SEEDS]
    assert [out(seed) for seed in BROKEN_SEEDS] == first
    assert len(set(first)) > 1, "every seed gave the same answer to a racy kernel"


def test_bad_schedule_arguments():
    kernel, args = launcher(MISSING_WAIT.format(wait="  s_waitcnt vmcnt(0)"))
    with pytest.raises(ValueError, match=r"runs outside strict mode \(pass strict=False\)"):
        kernel.launch(**args, schedule="adversarial", seed=0)
    with pytest.raises(ValueError, match="runs outside strict mode"):
        with adversarial.override(0, strict=True):
            pass
    with pytest.raises(ValueError, match="schedule must be one of"):
        kernel.launch(**args, schedule="random")
    with pytest.raises(TypeError, match="seed must be an int"):
        kernel.launch(**args, strict=False, schedule="adversarial")
    with pytest.raises(ValueError, match="seed must be >= 0"):
        kernel.launch(**args, strict=False, schedule="adversarial", seed=-1)
    with pytest.raises(ValueError, match="seed is only for schedule='adversarial'"):
        kernel.launch(**args, seed=1)
    with pytest.raises(ValueError, match="seed is only for schedule='adversarial'"):
        kernel.launch(**args, strict=False, schedule="timed", seed=1)
    with pytest.raises(ValueError, match=r"schedule='timed' runs outside strict mode"):
        kernel.launch(**args, schedule="timed")
    with pytest.raises(ValueError, match="seeds is empty"):
        adversarial.check(lambda: torch.zeros(1), seeds=[])


def test_check_names_seed_and_output():
    calls = []

    def run():                         # the "kernel" reads which schedule is forced on it
        calls.append(adversarial.forced())
        seed = calls[-1][1]
        return {"a": torch.zeros(3), "b": torch.tensor([0.0, float(seed == 2), float("nan")])}
    found = adversarial.check(run, seeds=[1, 2])
    assert calls == [("lockstep", None, False), ("adversarial", 1, False), ("adversarial", 2, False)]
    assert [(d.seed, d.name, d.first, d.count, d.total) for d in found] == [(2, "b", 1, 1, 3)]
    assert "seed 2: b differs" in str(found[0])


# ------------------------------------------- a race in hardware-proven code (isa-notes.md)
def test_paged_attention_vmcnt_race_gives_a_wrong_answer_under_a_legal_schedule():
    """aiter's pa_bf16_noquant_gqa8_1tg_4w.co reads v16 at pc 0x2fc4 while its load (pc
    0x28b8) may legally be in flight. With a sequence past 512 tokens some seed lands it
    late, and O is then wrong against the reference, not merely different."""
    case = conformance.paged_attention([57, 600])
    kernel = emu.load(case.path).kernel(case.symbol)
    found = adversarial.check_launch(kernel, grid=case.grid, block=case.block, kernarg=case.kernarg,
                                     buffers=case.buffers, seeds=range(2))
    assert found and {d.name for d in found} == {"buffers[5]"}, [str(d) for d in found]   # buffers[5]: O
    case = conformance.paged_attention([57, 600])
    kernel.launch(grid=case.grid, block=case.block, kernarg=case.kernarg, buffers=case.buffers, strict=False,
                  schedule="adversarial", seed=found[0].seed)
    with pytest.raises(AssertionError, match="O max error"):
        case.check()


# ------------------------------------------------------------------ the timed schedule
def timed_out(body: str, n: int, **kw) -> np.ndarray:
    kernel, args = launcher(body, **kw)
    kernel.launch(**args, strict=False, schedule="timed")
    return args["buffers"][1].numpy().view(np.float32)[:n].copy()


def test_timed_schedule_latency_hides_the_prefetch_race_but_not_a_missing_wait():
    # The LDS DMA lands hundreds of cycles after issue: the partner has read by then.
    swap = np.concatenate([X[64:128], X[:64]])
    np.testing.assert_array_equal(timed_out(PREFETCH.format(sync=""), 256, block=128, lds=512),
                                  np.concatenate([swap, np.concatenate([X[192:256], X[128:192]])]))
    # A global load has not landed one instruction later: v3 still holds its launch value.
    assert np.isnan(timed_out(MISSING_WAIT.format(wait=""), 64)).all()
    np.testing.assert_array_equal(timed_out(MISSING_WAIT.format(wait="  s_waitcnt vmcnt(0)"), 64), X[:64] * 2)


def test_timed_schedule_hides_the_paged_attention_race():
    """The contrast to the adversarial test above: with the timing model's latencies the
    load at 0x28b8 lands before 0x2fc4 reads v16, and O is right, as on silicon."""
    case = conformance.paged_attention([57, 600])
    emu.load(case.path).kernel(case.symbol).launch(grid=case.grid, block=case.block, kernarg=case.kernarg,
                                                   buffers=case.buffers, strict=False, schedule="timed")
    case.check()


# ------------------------------------------------------------------ our own kernels
@pytest.fixture(scope="module")
def built():
    build_manifest(default_manifest())


def _unchanged(run, seeds):
    found = adversarial.check(run, seeds)
    assert not found, "schedule-dependent output in our kernel (report it):\n" + "\n".join(map(str, found))
    outputs = []
    for schedule in ("timed", "lockstep"):
        with adversarial.override(None, schedule=schedule):
            out = run()
        outputs.append([t.view(torch.uint8) for t in (out if isinstance(out, tuple) else (out,))])
    assert all(torch.equal(a, b) for a, b in zip(*outputs)), "the timed schedule changed our kernel's output"


@pytest.mark.parametrize("causal,shape", [(False, (2, 17, 200, 2, 1)), (True, (1, 70, 70, 2, 2))])
def test_fmha_fwd_is_schedule_independent(built, causal, shape):
    batch, sq, sk, hq, hk = shape
    g = torch.Generator().manual_seed(sq * 1000 + sk)
    q = torch.randn(batch, sq, hq, 128, generator=g).bfloat16()
    k = torch.randn(batch, sk, hk, 128, generator=g).bfloat16()
    v = torch.randn(batch, sk, hk, 128, generator=g).bfloat16()
    _unchanged(lambda: gfxasm.fmha_fwd(q, k, v, causal=causal, return_lse=True), range(4))


@pytest.mark.parametrize("kernel,M,N,K,splits", [("gemv", 3, 9, 4096, 4), ("mfma", 17, 40, 256, 2)])
def test_mxfp8_gemm_is_schedule_independent(built, kernel, M, N, K, splits):
    mx = importlib.import_module("gfxasm.ops.mxfp8_gemm")
    g = torch.Generator().manual_seed(M * 100 + N)
    a, a_scale, b, b_scale = mx.random_operands(M, N, K, g, **mx.OPERAND_RANGES[torch.bfloat16])
    _unchanged(lambda: gfxasm.mxfp8_gemm(a, a_scale, b, b_scale, kernel=kernel, splits=splits), range(4))


def test_decode_attention_is_schedule_independent(built):
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 3, 4, 128, generator=g).bfloat16()
    k = torch.randn(2, 300, 2, 128, generator=g).bfloat16()
    v = torch.randn(2, 300, 2, 128, generator=g).bfloat16()
    seqlens = torch.tensor([300, 97], dtype=torch.int32)
    _unchanged(lambda: gfxasm.decode_attention(q, k, v, seqlens, num_splits=3, return_lse=True), range(4))
