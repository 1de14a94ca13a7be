"""gfxasm.fmha_fwd at head dim 64 (`fmha_fwd_d64`: asm/fmha_fwd_d128.s with HEAD_DIM = 64) on
the strict emulator against the float64 reference of tests/test_prefill_features.py
(`attention`, the per-element bound `bound`), outputs poisoned with NaN first.

Cases: causal and not, Sq < Sk, Sq = Sk and Sq > Sk (rows that see no key), sequence lengths
that are not multiples of the 64-key tile or the 256-row Q tile, MHA/GQA/MQA, bf16 and fp16,
LSE always; sliding windows (gpt-oss's 128 with sinks, rows whose window holds no key),
sinks and softcap alone and together; one adversarial-schedule case; head dims the op
refuses. The cross-product is `test_d64_features_full` (`pytest -m full`).
"""
from __future__ import annotations

import itertools

import pytest
import torch

import gfxasm
from gfxasm import build
from gfxasm.emu import adversarial
from tests.test_prefill_features import FULL_WINDOWS, run_fmha

D = 64


@pytest.fixture(scope="module", autouse=True)
def built():
    build.build_kernels(["fmha_fwd_d64"])


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
