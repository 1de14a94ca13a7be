"""gfxasm.fmha_fwd on the strict gfx950 emulator against a float32 reference.

Tolerance (flash-attention's rule, gfxasm.ops.fmha.tolerances): the largest |O - O_ref32|
may be at most 2x that of PyTorch evaluating the same attention in the inputs' precision
(bf16/fp16 scores, softmax output and P.V rounded), plus 4 ulp at 1.0; LSE likewise against
PyTorch's LSE of those rounded scores, plus the dtype's unit roundoff times max(1, |LSE|)
(the kernel's pre-scaled, re-rounded Q shifts a row's scores together; the docstring of
`tolerances` says why). Outputs start as NaN and must be written everywhere (a NaN left
over fails).

Default run: a representative subset of the shape cross-product in which every listed
value appears — Sq, Sk in {1, 17, 64, 255, 256, 257, 1000} (Sq = Sk and Sq != Sk), heads
(Hq/Hk) in {1, 4, 8, 16} with MHA, GQA and MQA ratios, B in {1, 3}, causal and not, bf16
and fp16, q/k/v as views into a packed qkv tensor, with and without LSE — sized to keep
the emulator time of this file to a few minutes on a 2-core machine.

The full cross-product (7 x 7 sequence pairs x head layouts x B x causal x dtype x layout)
is `test_full_cross_product`, marked `full`: the project's pytest options deselect that
marker, so CI (.ci/run, a plain `pytest -q`) does not collect it. Run it with
`pytest -m full tests/test_fmha.py` (hours of emulator time).
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch

import gfxasm
from gfxasm.build import build_manifest
from gfxasm.manifest import default_manifest
from gfxasm.ops import fmha

SEQS = (1, 17, 64, 255, 256, 257, 1000)
HEADS = ((1, 1), (4, 1), (4, 4), (8, 4), (8, 8), (16, 4), (16, 16))   # (Hq, Hk)
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


@pytest.fixture(scope="module", autouse=True)
def built():
    build_manifest(default_manifest())


def make_inputs(batch, seq_q, seq_k, heads_q, heads_k, dtype, layout, seed):
    """q, k, v with fresh random values; layout 'bshd' (contiguous) or 'packed': views into
    one [B, S, Hq + 2Hk, 128] qkv tensor (needs seq_q == seq_k), or 'bhsd' (transposed)."""
    g = torch.Generator().manual_seed(seed)
    if layout == "packed":
        assert seq_q == seq_k
        qkv = torch.randn(batch, seq_q, heads_q + 2 * heads_k, fmha.HEAD_DIM, generator=g).to(dtype)
        return (qkv[:, :, :heads_q], qkv[:, :, heads_q:heads_q + heads_k], qkv[:, :, heads_q + heads_k:])
    q = torch.randn(batch, seq_q, heads_q, fmha.HEAD_DIM, generator=g).to(dtype)
    k = torch.randn(batch, seq_k, heads_k, fmha.HEAD_DIM, generator=g).to(dtype)
    v = torch.randn(batch, seq_k, heads_k, fmha.HEAD_DIM, generator=g).to(dtype)
    if layout == "bhsd":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    return q, k, v


def check(batch, seq_q, seq_k, heads_q, heads_k, dtype, causal, layout="bshd", return_lse=True,
          softmax_scale=None, seed=0):
    q, k, v = make_inputs(batch, seq_q, seq_k, heads_q, heads_k, dtype, layout, seed)
    out = torch.full(q.shape, float("nan"), dtype=dtype)
    result = gfxasm.fmha_fwd(q, k, v, causal=causal, softmax_scale=softmax_scale, out=out, return_lse=return_lse)
    o, lse = result if return_lse else (result, None)
    assert o is out
    o_ref, lse_ref = fmha.reference(q, k, v, causal=causal, softmax_scale=softmax_scale)
    o_tol, lse_tol = fmha.tolerances(q, k, v, o_ref, lse_ref, causal=causal, softmax_scale=softmax_scale)
    assert not torch.isnan(o).any(), f"{int(torch.isnan(o).sum())} O elements left unwritten (NaN)"
    o_err = fmha.max_error(o.float(), o_ref)
    assert o_err <= o_tol, f"max|O - O_ref| = {o_err:.3g} > {o_tol:.3g}"
    if return_lse:
        assert lse.shape == (batch, heads_q, seq_q) and lse.dtype == torch.float32
        assert not torch.isnan(lse).any(), "NaN in LSE"
        lse_err = fmha.max_error(lse, lse_ref)
        assert lse_err <= lse_tol, f"max|LSE - LSE_ref| = {lse_err:.3g} > {lse_tol:.3g}"


# (B, Sq, Sk, Hq, Hk, dtype, causal, layout, lse)
DEFAULT_CASES = [
    (1, 1, 1, 1, 1, "bf16", False, "bshd", True),
    (1, 1, 1, 4, 1, "f16", True, "packed", True),
    (3, 17, 17, 4, 4, "f16", True, "bshd", True),
    (1, 17, 1000, 8, 8, "bf16", False, "bshd", True),
    (1, 17, 1000, 4, 1, "f16", True, "bshd", False),         # causal, Sq < Sk: only the last keys are masked
    (3, 64, 64, 8, 4, "bf16", True, "packed", True),
    (1, 64, 255, 16, 16, "f16", False, "bhsd", True),
    (1, 255, 257, 4, 1, "bf16", True, "bshd", True),
    (1, 256, 256, 16, 4, "f16", False, "packed", True),
    (1, 256, 256, 8, 8, "bf16", True, "bshd", False),
    (1, 257, 64, 4, 4, "bf16", True, "bshd", True),           # causal, Sq > Sk: rows that see no key
    (3, 257, 1, 1, 1, "f16", False, "bshd", True),
    (1, 1000, 17, 8, 4, "f16", True, "bshd", True),
    (1, 1000, 1000, 1, 1, "bf16", True, "packed", True),
    (1, 1000, 1000, 4, 1, "f16", False, "bshd", True),
    (1, 300, 200, 1, 1, "bf16", True, "bshd", True),          # causal diagonal crosses tile 0 in waves 4-7
    (3, 1000, 1000, 16, 16, "bf16", True, "packed", True),    # the largest: ~25 s of emulator time
]


@pytest.mark.parametrize("batch,seq_q,seq_k,heads_q,heads_k,dtype,causal,layout,lse", DEFAULT_CASES,
                         ids=lambda x: str(x))
def test_fmha(batch, seq_q, seq_k, heads_q, heads_k, dtype, causal, layout, lse):
    check(batch, seq_q, seq_k, heads_q, heads_k, DTYPES[dtype], causal, layout, lse)


def test_softmax_scale_and_fresh_output():
    q, k, v = make_inputs(1, 40, 70, 4, 2, torch.bfloat16, "bshd", seed=3)
    o = gfxasm.fmha_fwd(q, k, v, softmax_scale=0.3, causal=True)
    o_ref, lse_ref = fmha.reference(q, k, v, softmax_scale=0.3, causal=True)
    o_tol, _ = fmha.tolerances(q, k, v, o_ref, lse_ref, causal=True, softmax_scale=0.3)
    assert o.shape == q.shape and o.dtype == q.dtype
    assert fmha.max_error(o.float(), o_ref) <= o_tol


@pytest.mark.parametrize("seq_k,causal", [(300, False), (250, False), (300, True), (250, True)])
def test_lazy_rescale_large_scores(seq_k, causal):
    # Scores that grow by far more than the lazy threshold (2^8) from one tile to the next:
    # the rescale path must run, and a sorted key order makes each new tile's max larger.
    # 300 and 250 keys end the tile loop on either parity (5 and 4 tiles); 256 query rows
    # put rows in both wave groups.
    g = torch.Generator().manual_seed(5)
    q = (torch.randn(1, 256, 1, 128, generator=g) * 4).to(torch.bfloat16)
    base = torch.randn(1, seq_k, 1, 128, generator=g)
    k = (base * torch.linspace(0.1, 6, seq_k)[None, :, None, None]).to(torch.bfloat16)
    v = torch.randn(1, seq_k, 1, 128, generator=g).to(torch.bfloat16)
    o, lse = gfxasm.fmha_fwd(q, k, v, causal=causal, return_lse=True)
    o_ref, lse_ref = fmha.reference(q, k, v, causal=causal)
    o_tol, lse_tol = fmha.tolerances(q, k, v, o_ref, lse_ref, causal=causal)
    assert fmha.max_error(o.float(), o_ref) <= o_tol
    assert fmha.max_error(lse, lse_ref) <= max(lse_tol, 1e-5 * lse_ref.abs().max().item())


# --- bad inputs: clear errors before any launch ---

def _qkv(dtype=torch.bfloat16, hq=4, hk=2, d=128):
    return (torch.zeros(1, 8, hq, d, dtype=dtype), torch.zeros(1, 8, hk, d, dtype=dtype),
            torch.zeros(1, 8, hk, d, dtype=dtype))


@pytest.mark.parametrize("mutate,error,match", [
    (lambda q, k, v: (q[..., :64].contiguous(), k, v), ValueError, "'q' head dim must be 128, got 64"),
    (lambda q, k, v: (q, k[..., :96], v), ValueError, "'k' head dim must be 128"),
    (lambda q, k, v: (q, k.half(), v), TypeError, "'k' dtype must equal q's"),
    (lambda q, k, v: (q.float(), k, v), TypeError, "'q' dtype must be torch.bfloat16 or torch.float16"),
    (lambda q, k, v: (q[:, :, :3], k, v), ValueError, r"Hq % Hk == 0\), got Hq=3, Hk=2"),
    (lambda q, k, v: (q[0], k, v), ValueError, "'q' must have rank 4"),
    (lambda q, k, v: (q, k, v[:, :5]), ValueError, "'v' shape must equal k's"),
    (lambda q, k, v: (q.tolist(), k, v), TypeError, "'q' must be a torch.Tensor"),
    (lambda q, k, v: (q, k.to("meta"), v), ValueError, "'k' must be on q's device"),
    (lambda q, k, v: (q.transpose(1, 3).contiguous().transpose(1, 3), k, v), ValueError, "contiguous in the head dim"),
    (lambda q, k, v: (torch.zeros(8 * 4 * 128 + 1, dtype=torch.bfloat16)[1:].view(1, 8, 4, 128), k, v), ValueError,
     "'q' data must be 16-byte aligned"),
])
def test_bad_inputs(mutate, error, match):
    q, k, v = mutate(*_qkv())
    with pytest.raises(error, match=match):
        gfxasm.fmha_fwd(q, k, v)


def test_bad_out_and_scale():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="'out' shape must equal q's"):
        gfxasm.fmha_fwd(q, k, v, out=torch.empty(1, 8, 4, 64, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="'out' dtype must equal q's"):
        gfxasm.fmha_fwd(q, k, v, out=torch.empty(q.shape, dtype=torch.float16))
    with pytest.raises(ValueError, match="'softmax_scale' must be finite"):
        gfxasm.fmha_fwd(q, k, v, softmax_scale=float("nan"))
    with pytest.raises(TypeError, match="'causal' must be a bool"):
        gfxasm.fmha_fwd(q, k, v, causal="yes")


def test_empty_problem():
    q = torch.zeros(0, 8, 4, 128, dtype=torch.bfloat16)
    k = v = torch.zeros(0, 8, 2, 128, dtype=torch.bfloat16)
    o, lse = gfxasm.fmha_fwd(q, k, v, return_lse=True)
    assert o.shape == q.shape and lse.shape == (0, 4, 8)
    q, k, v = _qkv()
    o, lse = gfxasm.fmha_fwd(q[:, :0], k, v, return_lse=True)            # seq_q = 0, like torch: empty
    assert o.shape == (1, 0, 4, 128) and lse.shape == (1, 4, 0)


def test_no_keys_gives_zero_and_minus_inf():
    """seq_k = 0: every query sees no key, the rule for such rows (O = 0, LSE = -inf)."""
    q, k, v = _qkv()
    out = torch.full(q.shape, float("nan"), dtype=q.dtype)
    o, lse = gfxasm.fmha_fwd(q, k[:, :0], v[:, :0], out=out, return_lse=True)
    assert o is out and torch.equal(o, torch.zeros_like(o))
    assert torch.equal(lse, torch.full((1, 4, 8), float("-inf")))


# --- memory the kernel would get wrong: refused before launch ---

def test_out_overlapping_an_input_is_refused(no_launch):
    q, k, v = _qkv()                                     # Hq 4 = Hk 2 x 2: out=k has k's shape only for MHA
    k4, v4 = (torch.randn(1, 8, 4, 128).bfloat16() for _ in range(2))
    for name, out in (("k", k4), ("v", v4)):
        with pytest.raises(ValueError, match=f"'out' overlaps the memory of '{name}'"):
            gfxasm.fmha_fwd(q, k4, v4, out=out)
    shifted = torch.empty(q.numel() + 128 * 4, dtype=q.dtype)
    q_in = shifted[:q.numel()].view(q.shape)
    q_in.copy_(q)
    with pytest.raises(ValueError, match="'out' overlaps the memory of 'q'"):   # in place, but shifted a row
        gfxasm.fmha_fwd(q_in, k, v, out=shifted[128 * 4:].view(q.shape))
    packed = torch.randn(1, 8, 8, 128).bfloat16()       # out interleaved with q in one tensor: refused
    with pytest.raises(ValueError, match="'out' overlaps the memory of 'q'"):
        gfxasm.fmha_fwd(packed[:, :, :4], k, v, out=packed[:, :, 4:])


def test_lse_overlapping_out_is_refused(no_launch):
    q, k, v = _qkv()
    memory = torch.empty(q.numel(), dtype=q.dtype)
    out = memory.view(q.shape)
    lse = memory.view(torch.float32)[:4 * 8].view(1, 4, 8)            # the first bytes of out
    with pytest.raises(ValueError, match="'lse' overlaps the memory of 'out'"):
        torch.ops.gfxasm.fmha_fwd_out(q, k, v, out, lse, False, None)


def test_out_with_shared_elements_is_refused(no_launch):
    q, k, v = _qkv()
    stride0 = torch.empty(1, 8, 1, 128, dtype=q.dtype).expand(1, 8, 4, 128)    # one row for every head
    with pytest.raises(ValueError, match="'out' has elements sharing memory"):
        gfxasm.fmha_fwd(q, k, v, out=stride0)


def test_checks_that_depend_on_the_pointer_survive_the_plan_cache(no_launch):
    """A second call with the same layout reuses the checked plan: alignment and overlap
    are still checked per call."""
    q, k, v = _qkv()
    k4 = torch.randn(1, 8, 4, 128).bfloat16()
    with pytest.raises(AssertionError, match="a kernel was launched"):
        gfxasm.fmha_fwd(q, k4, k4.clone(), out=torch.empty(q.shape, dtype=q.dtype))   # fine: reaches the launch
    with pytest.raises(ValueError, match="'out' overlaps the memory of 'k'"):
        gfxasm.fmha_fwd(q, k4, k4.clone(), out=k4)
    with pytest.raises(AssertionError, match="a kernel was launched"):
        gfxasm.fmha_fwd(q, k, v)
    base = torch.zeros(q.numel() + 1, dtype=q.dtype)
    with pytest.raises(ValueError, match="'q' data must be 16-byte aligned"):
        gfxasm.fmha_fwd(base[1:].view(q.shape), k, v)


def test_out_is_q_in_place():
    """out=q exactly: each wave reads its Q rows into registers before it writes those rows."""
    q, k, v = make_inputs(1, 300, 200, 4, 2, torch.bfloat16, "bshd", seed=5)
    o_ref, lse_ref = fmha.reference(q, k, v, causal=True)
    o_tol, _ = fmha.tolerances(q, k, v, o_ref, lse_ref, causal=True)
    result = gfxasm.fmha_fwd(q, k, v, causal=True, out=q)
    assert result is q and fmha.max_error(q.float(), o_ref) <= o_tol


# --- the full cross-product: not run by CI ---

@pytest.mark.full
@pytest.mark.parametrize("batch,seq_q,seq_k,heads,dtype,causal,layout", [
    (b, sq, sk, h, dt, c, lay)
    for b, (sq, sk), h, dt, c, lay in itertools.product(
        (1, 3), itertools.product(SEQS, SEQS), HEADS, DTYPES, (False, True), ("bshd", "packed"))
    if lay == "bshd" or sq == sk
], ids=lambda x: str(x))
def test_full_cross_product(batch, seq_q, seq_k, heads, dtype, causal, layout):
    check(batch, seq_q, seq_k, heads[0], heads[1], DTYPES[dtype], causal, layout, True)
