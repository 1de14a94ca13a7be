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

Inputs at the edges of f32 (+-inf in q, scores below -1e30; the batch-prefill FP8 variants
of the same source with extreme scales): against the float64 reference, outputs poisoned
with values no row can have (NaN is a legal result there: a row whose visible scores are
all -inf is 0 / 0).

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
NO_FEATURES = (-1, -1, None, 0.0)        # window_left, window_right, sinks, softcap in the torch ops' schemas


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
    (lambda q, k, v: (q[..., :96].contiguous(), k, v), ValueError, "'q' head dim must be 64 or 128, got 96"),
    (lambda q, k, v: (q[..., :64].contiguous(), k, v), ValueError, r"'k' head dim must equal q's \(64\), got 128"),
    (lambda q, k, v: (q, k[..., :96], v), ValueError, r"'k' head dim must equal q's \(128\)"),
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
        torch.ops.gfxasm.fmha_fwd_out(q, k, v, out, lse, False, None, *NO_FEATURES)


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


# --- legal inputs at the edges of f32: +-inf in q, scores far below -1e30 ---

POISON_O, POISON_LSE = 512.0, 4096.5   # no row here can have them: a store that did not land stays


def run_poisoned(q, k, v, causal, softmax_scale=None):
    """fmha_fwd_out into outputs poisoned with POISON_O / POISON_LSE (NaN is a legal result here)."""
    out = torch.full(q.shape, POISON_O, dtype=q.dtype)
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), POISON_LSE)
    torch.ops.gfxasm.fmha_fwd_out(q, k, v, out, lse, causal, softmax_scale, *NO_FEATURES)
    return out, lse


def no_key_rows(q, k, causal):
    """[B, Sq, Hq] True where the row sees no key (causal, Sq > Sk: rows i < Sq - Sk)."""
    i = torch.arange(q.shape[1])[None, :, None]
    return (i < q.shape[1] - k.shape[1]).expand(q.shape[0], -1, q.shape[2]) if causal else torch.zeros(q.shape[:3], dtype=torch.bool)


def check_special(q, k, v, causal, nan_rows):
    """The kernel against the float64 reference where q holds +-inf: O NaN exactly where the
    reference's is (`nan_rows` rows, all of each), exactly 0 in rows that see no key, the
    other rows within fmha.tolerances of inputs with the infinities replaced by 0 (an inf in
    q touches only its own row); LSE -inf where the reference's is, NaN where it is NaN or
    +inf (a +inf score: m = +inf, the kernel's sum is inf - inf), the rest within tolerance."""
    o, lse = run_poisoned(q, k, v, causal)
    o_ref, lse_ref = fmha.reference(q, k, v, causal=causal, dtype=torch.float64)
    ref_nan = torch.isnan(o_ref).all(-1)
    assert int(ref_nan.sum()) == nan_rows and not torch.isnan(o_ref[~ref_nan]).any()
    assert torch.equal(torch.isnan(o), torch.isnan(o_ref)), \
        f"O NaN in rows {torch.isnan(o).all(-1).nonzero().tolist()}, the reference's {ref_nan.nonzero().tolist()}"
    empty = no_key_rows(q, k, causal)
    assert (o[empty] == 0).all() and torch.isneginf(lse.transpose(1, 2)[empty]).all()
    clean = q.masked_fill(torch.isinf(q), 0.0)
    o_tol, lse_tol = fmha.tolerances(clean, k, v, *fmha.reference(clean, k, v, causal=causal), causal=causal)
    assert fmha.max_error(o[~ref_nan].float(), o_ref[~ref_nan]) <= o_tol
    assert torch.equal(torch.isnan(lse), torch.isnan(lse_ref) | torch.isposinf(lse_ref)), "LSE NaN"
    assert torch.equal(torch.isneginf(lse), torch.isneginf(lse_ref)), "LSE -inf"
    finite = torch.isfinite(lse_ref)
    assert fmha.max_error(lse[finite], lse_ref[finite]) <= lse_tol


@pytest.mark.parametrize("dtype,causal", [("f16", False), ("bf16", False), ("f16", True), ("bf16", True)])
def test_inf_in_q(dtype, causal):
    # q holding +-inf: its row's scores are +-inf (NaN where k is 0), and the float64 softmax
    # is NaN: a +inf score gives inf - inf, a row whose visible keys all score -inf 0 / 0. The
    # latter came out O = 0 (l = 0, as for a row that sees no key: issue 26, "an fp16 q holding
    # +inf gives 0.0 where NaN is expected"). Dims 3 and 5 of every key are negative and
    # positive, so the sign of the inf picks the case; the other rows of the same waves stay
    # finite. Causal (Sq 100 > Sk 70): rows 0..29 see no key, O = 0 and LSE = -inf, inf or not.
    seq_q, seq_k = (100, 70) if causal else (70, 100)
    q, k, v = make_inputs(1, seq_q, seq_k, 2, 1, DTYPES[dtype], "bshd", seed=11)
    k[..., 3] = -(k[..., 3].abs() + 0.25)
    k[..., 5] = k[..., 5].abs() + 0.25
    q[0, 40, 0, 3] = float("inf")                                         # every visible score -inf
    q[0, 41, 1, 5] = float("-inf")                                        # likewise
    q[0, 45, 0, 5] = float("inf")                                         # every visible score +inf
    q[0, 65, 1, 3] = float("-inf")                                        # likewise
    q[0, 50, 1, 3] = q[0, 50, 1, 5] = float("inf")                        # -inf + inf terms: NaN scores
    q[0, 2, 0, 3] = float("inf")                                          # all -inf; causal: sees no key (O = 0)
    check_special(q, k, v, causal, 5 if causal else 6)


@pytest.mark.parametrize("seq_q,seq_k,causal", [(40, 150, False), (150, 100, True)])
def test_scores_below_minus_1e30(seq_q, seq_k, causal):
    # Every score near -1.6e31 (log2 units): q > 0 and k < 0, both ~1e15. The running max was
    # floored at -1e30, so every P underflowed to 0 and the rows came out as if they saw no
    # key (O = 0, LSE = -inf); the float64 softmax of such scores is well defined (here: the
    # best key's V, |O| up to ~3). scale * log2(e) = 2^-3 keeps the kernel's pre-scaled Q
    # exact, so its scores differ from the reference's only by the f32 sums. 150 keys: the
    # lazy rescale runs between tiles (the max grows by ~1e30); causal, Sq > Sk: rows 0..49
    # see no key.
    g = torch.Generator().manual_seed(12)
    q = ((torch.rand(1, seq_q, 2, 128, generator=g) + 0.5) * 1e15).to(torch.bfloat16)
    k = (-(torch.rand(1, seq_k, 1, 128, generator=g) + 0.5) * 1e15).to(torch.bfloat16)
    v = (torch.randn(1, seq_k, 1, 128, generator=g)).to(torch.bfloat16)
    scale = 0.125 / fmha.LOG2E
    out = torch.full(q.shape, POISON_O, dtype=q.dtype)
    lse = torch.full((1, 2, seq_q), POISON_LSE)
    torch.ops.gfxasm.fmha_fwd_out(q, k, v, out, lse, causal, scale, *NO_FEATURES)
    o_ref, lse_ref = fmha.reference(q, k, v, causal=causal, softmax_scale=scale, dtype=torch.float64)
    assert (lse_ref[torch.isfinite(lse_ref)] < -1e30).all() and o_ref.abs().max() > 2
    assert fmha.max_error(out.double(), o_ref) <= 2 * torch.finfo(torch.bfloat16).eps * o_ref.abs().max()
    assert fmha.max_error(lse.double(), lse_ref) <= 1e-5 * lse_ref[torch.isfinite(lse_ref)].abs().max()
    empty = no_key_rows(q, k, causal)
    assert (out[empty] == 0).all() and int(empty.sum()) == (2 * 50 if causal else 0)


@pytest.mark.parametrize("dtype,causal", [("bf16", False), ("f16", True)])
def test_inf_in_k(dtype, causal):
    # -inf in dim 3 of keys 0..63 (the first KV tile) and 128..191 (the third), q's dim 3 > 0:
    # those keys score -inf and must weigh 0. A row whose first tile scored all -inf had m at
    # the floor (-1e30, then -FLT_MAX), so the next tile's GEMM0, which starts from -m, rounded
    # every score of it to the same value: its keys weighed 1 each. Two rows are NaN: q's dim 3
    # < 0 (+inf scores) and = 0 (0 x inf). Causal (Sq = Sk): rows 0..63 see only the first
    # tile, every visible score -inf: O = NaN (0 / 0), LSE = -inf.
    seq_q, seq_k = (230, 230) if causal else (70, 230)
    q, k, v = make_inputs(1, seq_q, seq_k, 2, 1, DTYPES[dtype], "bshd", seed=14)
    q[..., 3] = q[..., 3].abs() + 0.25
    q[0, 0, 0, 3] = -q[0, 0, 0, 3]
    q[0, 1, 1, 3] = 0.0
    k[0, :64, :, 3] = k[0, 128:192, :, 3] = float("-inf")
    o, lse = run_poisoned(q, k, v, causal)
    o_ref, lse_ref = fmha.reference(q, k, v, causal=causal, dtype=torch.float64)
    first = 64 if causal else 2                                 # rows from here on are finite
    ref_nan = torch.isnan(o_ref).all(-1)
    assert int(ref_nan.sum()) == (2 * 64 if causal else 2) and not ref_nan[:, first:].any()
    assert torch.equal(torch.isnan(o), torch.isnan(o_ref)), \
        f"O NaN in rows {torch.isnan(o).all(-1).nonzero().tolist()}, the reference's {ref_nan.nonzero().tolist()}"
    assert torch.equal(torch.isnan(lse), torch.isnan(lse_ref) | torch.isposinf(lse_ref))
    assert torch.equal(torch.isneginf(lse), torch.isneginf(lse_ref))
    rest = q[:, first:]                                         # (bottom-right causal alignment: the same keys)
    o_tol, lse_tol = fmha.tolerances(rest, k, v, *fmha.reference(rest, k, v, causal=causal), causal=causal)
    assert fmha.max_error(o[:, first:].float(), o_ref[:, first:]) <= o_tol
    assert fmha.max_error(lse[..., first:], lse_ref[..., first:]) <= lse_tol


# --- the same bookkeeping in this source's batch-prefill FP8 variants (batch_prefill_d128_fp8*) ---

def fp8_sequence(seq_q, seq_k, page, seed, q_sign, k_sign):
    """One sequence of e4m3 q [Sq, 2, 128] and k/v caches [pages, page, 1, 128] (pages in
    order), |x| + 0.5 with the given sign where one is given; its vLLM table."""
    g = torch.Generator().manual_seed(seed)

    def values(*shape, sign=0):
        x = torch.randn(*shape, generator=g)
        return (sign * (x.abs() + 0.5) if sign else x).to(torch.float8_e4m3fn)
    pages = -(-seq_k // page)
    q = values(seq_q, 2, 128, sign=q_sign)
    k, v = values(pages, page, 1, 128, sign=k_sign), values(pages, page, 1, 128)
    table = dict(block_table=torch.arange(pages, dtype=torch.int32)[None],
                 seqlens_k=torch.tensor([seq_k], dtype=torch.int32))
    return q, k, v, table


@pytest.mark.parametrize("seq_q,seq_k,page,causal,descales,kv_block,signs", [
    # v_descale 2^60 was folded into 1 / max(l, 1e-30): 1e30 x 2^60 = inf, 0 x inf = NaN in
    # the rows that see no key (causal, Sq > Sk)
    (100, 60, 16, True, (0.5, 0.7, 2.0**60), None, (0, 0)),
    # per-tile block scales, c = scale log2(e) q_descale k_scale = 4: with m = -FLT_MAX for a
    # row with no key, -c m must not become +inf (-inf + inf = NaN); v scale 2^61 likewise
    (100, 60, 64, True, (8.0, 1.0, 1.0), (4.0, 2.0**61), (0, 0)),
    # per-key block scales put the scores in log2 units: ~ -1e31 here (q > 0, k < 0, c k ~
    # 6.5e29), below the old -1e30 floor of m: every P was 0 (O = 0, LSE = -inf)
    (40, 100, 16, False, (2.0**62, 1.0, 1.0), (2.0**40, 1.0), (1, -1)),
    (100, 60, 16, True, (2.0**62, 1.0, 1.0), (2.0**40, 1.0), (1, -1)),
])
def test_fp8_variants_at_the_edges(seq_q, seq_k, page, causal, descales, kv_block, signs):
    from gfxasm.ops import batch_prefill as bp
    q, k, v, table = fp8_sequence(seq_q, seq_k, page, 14, *signs)
    qo_indptr = torch.tensor([0, seq_q], dtype=torch.int32)
    if signs[0]:      # (no row's two best keys tie: bp.reference's exp(s - lse) loses log 2 at |s| ~ 1e31)
        s = torch.einsum("qhd,kd->hqk", q.double(), k.double().reshape(-1, 128)[:seq_k])
        if causal:
            s = s.masked_fill(torch.arange(seq_k)[None] > torch.arange(seq_q)[:, None] - (seq_q - seq_k), float("-inf"))
        best = s.topk(2, -1).values
        assert not (best[..., 0] == best[..., 1])[torch.isfinite(best[..., 0])].any()
    scales = dict(q_descale=torch.tensor([descales[0]]))
    if kv_block is None:
        scales.update(k_descale=torch.tensor([descales[1]]), v_descale=torch.tensor([descales[2]]))
    else:
        scales.update(kv_block_descale=torch.tensor(kv_block).expand(k.shape[0], 1, 2).contiguous())
    out = torch.full((seq_q, 2, 128), POISON_O, dtype=torch.bfloat16)
    o, lse = gfxasm.batch_prefill(q, k, v, qo_indptr, **table, causal=causal, out=out, return_lse=True, **scales)
    o_ref, lse_ref, bound = bp.reference(q, k, v, qo_indptr, *bp.normalise(1, page, k.shape[0], **table),
                                         causal=causal, descales=descales, kv_block_descale=scales.get("kv_block_descale"),
                                         p_bound=True)
    empty = torch.arange(seq_q) < (seq_q - seq_k if causal else 0)
    assert (o[empty] == 0).all() and torch.isneginf(lse[:, empty]).all()
    v_max = v.float().abs().max().item() * descales[2] * (kv_block[1] if kv_block else 1.0)
    tol = bound + 2.0**-8 * o_ref.abs() + 2.0**-16 * v_max                    # test_batch_prefill's FP8 rule
    assert not torch.isnan(o).any() and ((o.double() - o_ref).abs() <= tol).all()
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(lse_ref))
    assert fmha.max_error(lse[finite].double(), lse_ref[finite]) <= 2.0**-14 * (1 + lse_ref[finite].abs().max())
