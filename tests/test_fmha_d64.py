"""gfxasm.fmha_fwd and gfxasm.batch_prefill at head dim 64 (`fmha_fwd_d64`, `batch_prefill_d64`:
asm/fmha_fwd_d128.s with HEAD_DIM = 64) on the strict emulator against the float64 reference
of tests/test_prefill_features.py (`attention`, the per-element bound `bound`), outputs
poisoned with NaN first (batch_prefill: unused cache slots NaN too, both table kinds).

Cases: causal and not, Sq < Sk, Sq = Sk and Sq > Sk (rows that see no key), sequence lengths
that are not multiples of the 64-key tile or the 256-row Q tile, MHA/GQA/MQA, bf16 and fp16,
LSE always; sliding windows (gpt-oss's 128 with sinks, rows whose window holds no key),
sinks and softcap alone and together; one adversarial-schedule case; head dims the op
refuses (FP8 at 64 included). The cross-products are `test_d64_features_full` and
`test_d64_prefill_full` (`pytest -m full`).
"""
from __future__ import annotations

import itertools

import pytest
import torch

import gfxasm
from gfxasm import build
from gfxasm.emu import adversarial
from tests.test_prefill_features import FULL_WINDOWS, WINDOW_MASK_CASES, run_fmha, run_prefill, window_mask_forms

D = 64


@pytest.fixture(scope="module", autouse=True)
def built():
    build.build_kernels(["fmha_fwd_d64", "batch_prefill_d64"])


@pytest.mark.parametrize("batch, seq_q, seq_k, heads, dtype, causal, sinks", [
    (2, 70, 200, (4, 2), torch.bfloat16, False, False),      # GQA, Sq < Sk, ragged tails
    (1, 130, 130, (2, 2), torch.float16, True, False),       # MHA, Sq = Sk
    (1, 300, 70, (4, 1), torch.bfloat16, True, True),        # MQA, Sq > Sk: rows that see no key (O = 0, LSE = sink)
    (1, 257, 257, (2, 1), torch.float16, False, True),       # one row past a Q tile, one key past a KV tile
    (1, 64, 320, (2, 1), torch.bfloat16, True, False),       # whole tiles, Sq < Sk
])
def test_d64(batch, seq_q, seq_k, heads, dtype, causal, sinks):
    out, lse, sink = run_fmha(batch, seq_q, seq_k, *heads, dtype, causal, seed=seq_q + seq_k, sinks=sinks,
                              head_dim=D)
    if causal and seq_q > seq_k:                             # (the case holds what it claims)
        blind = seq_q - seq_k
        assert (out[:, :blind] == 0).all()
        assert torch.equal(lse[:, :, :blind], sink[None, :, None].expand(batch, -1, blind))


@pytest.mark.parametrize("batch, seq_q, seq_k, heads, dtype, causal, window, softcap", [
    (1, 300, 300, (4, 1), torch.bfloat16, True, (128, 0), 0.0),    # gpt-oss's sliding layers: window 128 + sinks
    (2, 260, 300, (4, 2), torch.bfloat16, True, (70, 0), 4.0),     # window + sinks + softcap
    (1, 90, 200, (2, 1), torch.float16, False, (30, 20), 10.0),    # both sides bounded, not causal
    (1, 300, 100, (2, 2), torch.bfloat16, False, (10, 5), 5.0),    # rows i < 195 whose window holds no key
])
def test_d64_window_sinks_softcap(batch, seq_q, seq_k, heads, dtype, causal, window, softcap):
    out, lse, sink = run_fmha(batch, seq_q, seq_k, *heads, dtype, causal, seed=seq_k + window[0], window=window,
                              softcap=softcap, q_scale=2.0, head_dim=D)
    if seq_q > seq_k:                                        # (the case holds what it claims)
        blind = seq_q - seq_k - window[1]
        assert (out[:, :blind] == 0).all()
        assert torch.equal(lse[:, :, :blind], sink[None, :, None].expand(batch, -1, blind))


@pytest.mark.parametrize("batch, seq_q, seq_k, heads, dtype, causal, window, forms", WINDOW_MASK_CASES)
def test_d64_window_mask_forms(batch, seq_q, seq_k, heads, dtype, causal, window, forms):
    """Each form of the window mask (lo only, lim only, both; test_prefill_features)."""
    assert window_mask_forms(seq_q, seq_k, window) == forms      # (the case holds what it claims)
    run_fmha(batch, seq_q, seq_k, *heads, dtype, causal, seed=seq_k + window[0], window=window, head_dim=D)


@pytest.mark.parametrize("page_size, causal, heads, dtype, window, softcap, sinks", [
    (16, True, (4, 1), torch.bfloat16, (-1, -1), 0.0, True),     # MQA, pages of 16, empty and 1-row sequences
    (1, False, (2, 2), torch.float16, (-1, -1), 0.0, False),     # page 1 (a plain pool), MHA
    (64, True, (4, 2), torch.bfloat16, (128, -1), 0.0, True),    # gpt-oss's sliding layers: window 128 + sinks
    (16, False, (2, 1), torch.float16, (30, 20), 5.0, True),     # window + sinks + softcap
])
def test_d64_prefill(page_size, causal, heads, dtype, window, softcap, sinks):
    run_prefill([1, 70, 0, 200], [1, 150, 30, 330], page_size, heads, dtype, causal, seed=page_size + 5, sinks=sinks,
                window=window, softcap=softcap, head_dim=D)


def test_d64_adversarial_schedules():
    """Waves interleaved and loads landing late (legal orders) give every output bit of the
    lockstep run: causal with a window whose waves start at different tiles, and sinks."""
    g = torch.Generator().manual_seed(31)
    q = torch.randn(1, 70, 2, D, generator=g).bfloat16()
    k = torch.randn(1, 150, 1, D, generator=g).bfloat16()
    v = torch.randn(1, 150, 1, D, generator=g).bfloat16()
    sinks = torch.randn(2, generator=g)

    def run():
        return gfxasm.fmha_fwd(q, k, v, causal=True, window_size=(20, 0), sinks=sinks, return_lse=True)
    assert adversarial.check(run, seeds=range(1)) == []


@pytest.mark.parametrize("head_dim", [32, 96, 256])
def test_unsupported_head_dims_refused(head_dim):
    q = torch.randn(1, 8, 2, head_dim).bfloat16()
    with pytest.raises(ValueError, match="'q' head dim must be 64 or 128"):
        gfxasm.fmha_fwd(q, q, q)


def test_prefill_refusals():
    q = torch.randn(10, 2, 96).bfloat16()
    cache = torch.randn(4, 16, 1, 96).bfloat16()
    tables = dict(kv_indptr=torch.tensor([0, 1], dtype=torch.int32), kv_page_indices=torch.tensor([0], dtype=torch.int32),
                  kv_last_page_len=torch.tensor([10], dtype=torch.int32))
    qo = torch.tensor([0, 10], dtype=torch.int32)
    with pytest.raises(ValueError, match="'q' head dim must be 64 or 128, got 96"):
        gfxasm.batch_prefill(q, cache, cache, qo, **tables)
    fp8_q, fp8_cache = q[..., :64].to(torch.float8_e4m3fn), cache[..., :64].to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="'q' head dim must be 128 for float8_e4m3fn inputs"):
        gfxasm.batch_prefill(fp8_q, fp8_cache, fp8_cache, qo, **tables)


def test_head_dims_must_agree():
    q = torch.randn(1, 8, 2, 64).bfloat16()
    kv = torch.randn(1, 8, 2, 128).bfloat16()
    with pytest.raises(ValueError, match="'k' head dim must equal q's"):
        gfxasm.fmha_fwd(q, kv, kv)


@pytest.mark.full
@pytest.mark.parametrize("dtype, causal, window, sinks, softcap", [
    (dtype, causal, window, sinks, softcap)
    for dtype, causal, window, sinks, softcap in itertools.product(
        (torch.bfloat16, torch.float16), (False, True), FULL_WINDOWS + [(128, 0)], (False, True), (0.0, 6.0))
    if not (causal and window[1] > 0)])
def test_d64_features_full(dtype, causal, window, sinks, softcap):
    for batch, seq_q, seq_k, heads in ((1, 300, 300, (4, 1)), (2, 70, 400, (2, 2)), (1, 257, 64, (4, 2))):
        run_fmha(batch, seq_q, seq_k, *heads, dtype, causal, seed=seq_q, sinks=sinks, window=window,
                 softcap=softcap, q_scale=2.0, head_dim=D)


@pytest.mark.full
@pytest.mark.parametrize("dtype, page_size, causal, window, softcap", [
    (dtype, page_size, causal, window, softcap)
    for dtype, page_size, causal, window, softcap in itertools.product(
        (torch.bfloat16, torch.float16), (1, 16, 64), (False, True), FULL_WINDOWS + [(128, 0)], (0.0, 6.0))
    if not (causal and window[1] > 0)])
def test_d64_prefill_full(dtype, page_size, causal, window, softcap):
    run_prefill([1, 70, 0, 300], [1, 150, 30, 300], page_size, (4, 1), dtype, causal, seed=page_size, window=window,
                softcap=softcap, head_dim=D)
