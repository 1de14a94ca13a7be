"""Attention features of the prefill kernels (issue 22) in gfxasm.fmha_fwd and
gfxasm.batch_prefill: sinks, sliding windows, soft-capping, KV caches as views of combined
pools and the HND layout; on the strict emulator against a float64 reference written here
(`attention`, from the definitions; it shares no code with the ops or their module
references).

Semantics (flash-attention's and gpt-oss's): `sinks` [Hq] float32 logits join each row's
softmax denominator only (exp(sink - m)); the numerator is unchanged and the LSE includes
them; a row that sees no key gets O = 0 and LSE = its sink. window_size (left, right):
query i at pos = i + Sk - Sq sees keys pos - left .. pos + right (-1 unbounded; causal:
right 0); a row whose window holds no key gets O = 0, LSE = -inf. softcap: scores
softcap tanh(s / softcap) before the mask.

Tolerance (bf16/fp16, `bound`): the kernel scores Q pre-scaled by softmax_scale log2(e) and
rounded to the input dtype, so every score of a row moves by at most
delta = u scale max_j sum_d |q_d k_jd| (u the dtype's unit roundoff); the weights of the
keys move by a factor within e^(+-2 delta) relative to each other and to the sink (exact),
so O moves by at most (e^(2 delta) - 1) max|V|; P rounded to the dtype before P.V adds
u max|V|, O's own rounding u |O|, f32 arithmetic 1e-5. LSE: delta + 2^-20 (1 + |LSE|).
FP8 (e4m3, bf16 out): scores are exact; P rounded to e4m3 moves O by at most
`batch_prefill.fp8_p_bound` (derived there), plus O's rounding 2^-8 |O| and 2^-16 v max|V|.
Outputs are poisoned with NaN first (an unwritten element fails). The default run is a few
small shapes per feature and combination; the cross-product (dtype x causal x windows x
sinks x softcap, page sizes, FP8 scale kinds) is marked `full` (`pytest -m full`).
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch

import gfxasm
from gfxasm import build
from gfxasm.emu import adversarial
from gfxasm.ops import batch_prefill as bp

D = 128
FP8 = torch.float8_e4m3fn


@pytest.fixture(scope="module", autouse=True)
def built():
    build.build_kernels(["fmha_fwd_d128", bp.KERNEL])


# ------------------------------------------------------------------ the float64 reference

def attention(q, k, v, *, scale, causal=False, window=(-1, -1), sinks=None, softcap=0.0):
    """One sequence in float64: q [Sq, Hq, D], k and v [Sk, Hkv, D] (already dequantised).
    Returns O [Sq, Hq, D], LSE [Hq, Sq] (natural log). Query i sits at key position
    pos = i + Sk - Sq; causal: it sees keys j <= pos; window (left, right): keys
    pos - left <= j <= pos + right (-1: that side unbounded). softcap > 0: each score s
    becomes softcap tanh(s / softcap) before the mask. Per row: m = max(visible scores, sink);
    O = sum_j e^(s_j - m) v_j / den, den = sum_j e^(s_j - m) + e^(sink - m); LSE = m + ln(den).
    A row with neither a visible key nor a sink: O = 0, LSE = -inf."""
    sq, hq, _ = q.shape
    sk, hk, _ = k.shape
    pos = torch.arange(sq)[:, None] + sk - sq
    j = torch.arange(sk)[None, :]
    visible = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        visible &= j <= pos
    if window[0] >= 0:
        visible &= j >= pos - window[0]
    if window[1] >= 0:
        visible &= j <= pos + window[1]
    o = torch.zeros(sq, hq, v.shape[2], dtype=torch.float64)
    lse = torch.full((hq, sq), float("-inf"), dtype=torch.float64)
    for h in range(hq):
        kh, vh = k[:, h // (hq // hk)].double(), v[:, h // (hq // hk)].double()
        s = (q[:, h].double() @ kh.T) * scale                                                   # [Sq, Sk]
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        s = torch.where(visible, s, float("-inf"))
        sink = torch.full((sq, 1), float("-inf") if sinks is None else float(sinks[h]), dtype=torch.float64)
        m = torch.cat([s, sink], dim=1).amax(1, keepdim=True)
        rows = torch.isfinite(m[:, 0])                                  # a visible key or a sink
        w = torch.exp(s[rows] - m[rows])
        den = w.sum(1, keepdim=True) + torch.exp(sink[rows] - m[rows])
        o[rows, h] = (w @ vh) / den
        lse[h, rows] = (m[rows] + torch.log(den))[:, 0]
    return o, lse


def bound(q, k, v, o_ref, scale, dtype, softcap=0.0):
    """Per-element bound on |O - O_ref| and the LSE bound (module docstring), bf16/fp16;
    softcap adds the tanh evaluation's 2^-18 softcap per score."""
    u = torch.finfo(dtype).eps / 2
    hq, hk = q.shape[1], k.shape[1]
    kk = k.double().abs().repeat_interleave(hq // hk, 1)                  # [Sk, Hq, D]
    magnitude = torch.einsum("qhd,khd->hqk", q.double().abs(), kk)                       # [Hq, Sq, Sk]
    delta = u * scale * (magnitude.amax(-1) if k.shape[0] else magnitude.sum(-1)) + 2.0**-18 * softcap   # [Hq, Sq]
    v_max = v.double().abs().max().item() if v.numel() else 0.0
    o_tol = (torch.expm1(2 * delta).T[..., None] + u) * v_max + u * o_ref.abs() + 1e-5
    return o_tol, delta.max().item()


def assert_close(o, lse, o_ref, lse_ref, o_tol, lse_slack):
    assert not torch.isnan(o).any(), f"{int(torch.isnan(o).sum())} O elements NaN (left unwritten?)"
    assert not torch.isnan(lse).any(), "NaN in LSE"
    excess = (o.double() - o_ref).abs() - o_tol
    assert excess.max() <= 0, f"|O - O_ref| exceeds its bound by {excess.max().item():.3g}"
    same_inf = torch.isinf(lse_ref) & (lse.double() == lse_ref)
    err = torch.where(same_inf, 0.0, (lse.double() - lse_ref).abs())
    lse_tol = lse_slack + 2.0**-20 * (1 + lse_ref.abs().nan_to_num(0.0, posinf=0.0, neginf=0.0))
    assert (err <= lse_tol).all(), f"max|LSE - LSE_ref| excess {(err - lse_tol).max().item():.3g}"


# ------------------------------------------------------------------ fmha_fwd

def run_fmha(batch, seq_q, seq_k, heads_q, heads_k, dtype, causal, seed, sinks=True, window=(-1, -1), poison=None,
             softcap=0.0, q_scale=1.0, head_dim=D):
    """fmha_fwd_out on random inputs against `attention`; `poison(k, v)` may set keys no
    row sees to NaN (a kernel that reads them gives NaN rows)."""
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(batch, seq_q, heads_q, head_dim, generator=g) * q_scale).to(dtype)
    k = torch.randn(batch, seq_k, heads_k, head_dim, generator=g).to(dtype)
    v = torch.randn(batch, seq_k, heads_k, head_dim, generator=g).to(dtype)
    sink = torch.randn(heads_q, generator=g) * 3 if sinks else None
    scale = 1 / math.sqrt(head_dim)
    out = torch.full(q.shape, float("nan"), dtype=dtype)
    lse = torch.full((batch, heads_q, seq_q), float("nan"))
    k_run, v_run = (k, v) if poison is None else poison(k.clone(), v.clone())
    torch.ops.gfxasm.fmha_fwd_out(q, k_run, v_run, out, lse, causal, None, *window, sink, softcap)
    for b in range(batch):
        o_ref, lse_ref = attention(q[b], k[b], v[b], scale=scale, causal=causal, window=window, sinks=sink,
                                   softcap=softcap)
        o_tol, delta = bound(q[b], k[b], v[b], o_ref, scale, dtype, softcap)
        assert_close(out[b], lse[b], o_ref, lse_ref, o_tol, delta)
    return out, lse, sink


@pytest.mark.parametrize("batch, seq_q, seq_k, heads, dtype, causal", [
    (2, 70, 200, (4, 2), torch.bfloat16, False),        # GQA, Sq < Sk
    (1, 130, 130, (2, 2), torch.float16, True),         # Sq = Sk
    (1, 300, 70, (2, 1), torch.bfloat16, True),         # Sq > Sk: rows that see no key get O = 0, LSE = sink
])
def test_fmha_sinks(batch, seq_q, seq_k, heads, dtype, causal):
    out, lse, sink = run_fmha(batch, seq_q, seq_k, *heads, dtype, causal, seed=seq_q + seq_k)
    if causal and seq_q > seq_k:                      # (the case holds what it claims)
        blind = seq_q - seq_k
        assert (out[:, :blind] == 0).all() and torch.equal(lse[:, :, :blind], sink[None, :, None].expand(batch, -1,
                                                                                                          blind))


def test_fmha_sinks_dominate_and_vanish():
    """Sinks far above every score (O -> 0, LSE -> the sink) and far below (no effect)."""
    for sink_value in (1e4, -1e4):
        g = torch.Generator().manual_seed(9)
        q = torch.randn(1, 70, 2, D, generator=g).bfloat16()
        k = torch.randn(1, 130, 1, D, generator=g).bfloat16()
        v = torch.randn(1, 130, 1, D, generator=g).bfloat16()
        sink = torch.full((2,), sink_value)
        o, lse = gfxasm.fmha_fwd(q, k, v, sinks=sink, return_lse=True)
        o_ref, lse_ref = attention(q[0], k[0], v[0], scale=1 / math.sqrt(D), sinks=sink)
        o_tol, delta = bound(q[0], k[0], v[0], o_ref, 1 / math.sqrt(D), torch.bfloat16)
        assert_close(o[0], lse[0], o_ref, lse_ref, o_tol, delta)


@pytest.mark.parametrize("batch, seq_q, seq_k, heads, dtype, causal, window", [
    (1, 300, 300, (2, 1), torch.bfloat16, True, (100, -1)),      # Sq = Sk, causal: two Q tiles, t_lo > 0 in the second
    (2, 70, 400, (4, 2), torch.float16, False, (30, 40)),        # Sq < Sk, both sides bounded, GQA
    (1, 300, 100, (2, 2), torch.bfloat16, False, (10, 5)),       # Sq > Sk: rows i < 195 see no key (O = 0, LSE -inf)
    (1, 130, 130, (2, 1), torch.bfloat16, False, (0, 0)),        # each row sees one key
    (1, 100, 260, (2, 1), torch.float16, False, (-1, 3)),        # right bound only
])
def test_fmha_window(batch, seq_q, seq_k, heads, dtype, causal, window):
    out, lse, _ = run_fmha(batch, seq_q, seq_k, *heads, dtype, causal, seed=seq_k, sinks=False, window=window)
    if seq_q > seq_k:                                           # (the case holds what it claims)
        blind = seq_q - seq_k - window[1]
        assert (out[:, :blind] == 0).all() and (lse[:, :, :blind] == float("-inf")).all()


def window_mask_forms(seq_q, seq_k, window):
    """The forms of the masked tiles (asm/include/fmha_window.inc: "lo" only, "lim" only, or
    "both" bounds) the dense window kernels meet at this shape, from the kernel's tile
    arithmetic: 256-row Q tiles from t_lo = lo(q0) // 64, 32-row waves computing tiles
    ws .. w-1, a tile masked below masklo (lo) and from maskfrom (lim)."""
    left, right = (x if x >= 0 else 2**30 for x in window)

    def lo(i):
        return max(0, i + seq_k - seq_q - left)

    def lim(i):
        return min(seq_k, i + seq_k - seq_q + right + 1)
    forms = set()
    for q0 in range(0, seq_q, 256):
        t_lo = lo(q0) // 64 * 64
        for first in range(q0, min(q0 + 256, seq_q), 32):
            last = min(first + 31, seq_q - 1)
            masklo, maskfrom = -(-(lo(last) - t_lo) // 64), (lim(first) - t_lo) // 64
            for j in range((lo(first) - t_lo) // 64, -(-(lim(last) - t_lo) // 64)):
                below, past = j < masklo, j >= maskfrom
                if below or past:
                    forms.add("both" if below and past else "lo" if below else "lim")
    return forms


# Each form of the window mask, with sinks: gpt-oss's window (wider than a wave's rows: one-
# sided tiles only), rows whose window holds no key in lim-only tiles, and all three forms
WINDOW_MASK_CASES = [
    (1, 290, 300, (4, 1), torch.bfloat16, True, (128, 0), {"lo", "lim"}),
    (1, 300, 100, (2, 1), torch.float16, False, (150, 3), {"lim"}),
    (1, 300, 130, (2, 2), torch.bfloat16, True, (60, 0), {"lo", "lim", "both"}),
]


@pytest.mark.parametrize("batch, seq_q, seq_k, heads, dtype, causal, window, forms", WINDOW_MASK_CASES)
def test_fmha_window_mask_forms(batch, seq_q, seq_k, heads, dtype, causal, window, forms):
    assert window_mask_forms(seq_q, seq_k, window) == forms      # (the case holds what it claims)
    out, lse, sink = run_fmha(batch, seq_q, seq_k, *heads, dtype, causal, seed=seq_q + window[0], window=window)
    blind = max(0, seq_q - seq_k - window[1])                   # rows whose window holds no key: O = 0, LSE = sink
    assert (out[:, :blind] == 0).all() and (lse[:, :, :blind] == sink.view(1, -1, 1)).all()


def test_fmha_window_skips_tiles_outside():
    """Keys before the first row's window and after the last row's are NaN: the kernel must
    not read them (one Q tile, so the workgroup's first tile is past them: skipped, not masked)."""
    seq_q, seq_k, left = 100, 700, 64

    def poison(k, v):
        first = seq_k - seq_q - left                           # lo of row 0
        k[:, :first - first % 64] = float("nan")               # whole tiles before it
        v[:, :first - first % 64] = float("nan")
        return k, v
    run_fmha(1, seq_q, seq_k, 2, 1, torch.bfloat16, True, seed=7, sinks=False, window=(left, 0), poison=poison)


def test_fmha_window_with_sinks():
    run_fmha(1, 260, 300, 4, 2, torch.bfloat16, True, seed=11, window=(70, 0))


@pytest.mark.parametrize("batch, seq_q, seq_k, heads, dtype, causal, softcap", [
    (1, 100, 200, (4, 2), torch.bfloat16, False, 5.0),           # Sq < Sk, GQA; scores past the cap
    (1, 200, 200, (2, 1), torch.float16, True, 30.0),            # Sq = Sk
    (1, 300, 70, (2, 2), torch.bfloat16, True, 1.0),             # Sq > Sk: rows without a key
])
def test_fmha_softcap(batch, seq_q, seq_k, heads, dtype, causal, softcap):
    run_fmha(batch, seq_q, seq_k, *heads, dtype, causal, seed=seq_q, sinks=False, softcap=softcap, q_scale=3.0)


def test_fmha_window_sinks_softcap():
    run_fmha(2, 260, 300, 4, 2, torch.bfloat16, True, seed=13, window=(70, 0), softcap=4.0, q_scale=2.0)
    run_fmha(1, 90, 200, 2, 1, torch.float16, False, seed=14, window=(30, 20), softcap=10.0, q_scale=2.0)


def test_fmha_sinks_without_keys():
    q = torch.randn(1, 5, 4, D).bfloat16()
    kv = torch.randn(1, 0, 2, D).bfloat16()
    sink = torch.tensor([0.5, -1.0, 2.0, 30.0])
    o, lse = gfxasm.fmha_fwd(q, kv, kv, sinks=sink, return_lse=True)
    assert (o == 0).all() and torch.equal(lse, sink[None, :, None].expand(1, 4, 5))


# ------------------------------------------------------------------ batch_prefill

def make_paged(seq_q, seq_k, page_size, heads_q, heads_k, dtype, seed, spare=3, head_dim=D):
    """q, caches (unused slots NaN) and both table kinds of one shuffled pool."""
    g = torch.Generator().manual_seed(seed)
    counts = [-(-s // page_size) for s in seq_k]
    num_pages = sum(counts) + spare
    order = torch.randperm(num_pages, generator=g).to(torch.int32)
    shape = (num_pages, page_size, heads_k, head_dim)
    k_cache = torch.full(shape, float("nan")).to(dtype)
    v_cache = torch.full(shape, float("nan")).to(dtype)
    lists, at = [], 0
    for n, s in zip(counts, seq_k):
        pages = order[at:at + n]
        at += n
        j = torch.arange(s)
        k_cache[pages[j // page_size].long(), j % page_size] = torch.randn(s, heads_k, head_dim, generator=g).to(dtype)
        v_cache[pages[j // page_size].long(), j % page_size] = torch.randn(s, heads_k, head_dim, generator=g).to(dtype)
        lists.append(pages)
    table = torch.zeros(len(seq_k), max(counts + [1]), dtype=torch.int32)
    for b, pages in enumerate(lists):
        table[b, :len(pages)] = pages
    sglang = dict(kv_indptr=torch.tensor([0, *itertools.accumulate(counts)], dtype=torch.int32),
                  kv_page_indices=torch.cat(lists), kv_last_page_len=torch.tensor(
                      [s - (n - 1) * page_size if n else 0 for n, s in zip(counts, seq_k)], dtype=torch.int32))
    vllm = dict(block_table=table, seqlens_k=torch.tensor(seq_k, dtype=torch.int32))
    qo = torch.tensor([0, *itertools.accumulate(seq_q)], dtype=torch.int32)
    q = torch.randn(int(qo[-1]), heads_q, head_dim, generator=g).to(dtype)
    return q, k_cache, v_cache, qo, sglang, vllm, lists


def sequence_kv(cache, pages, seqlen):
    j = torch.arange(seqlen)
    return cache[pages[j // cache.shape[1]].long(), j % cache.shape[1]]


def run_prefill(seq_q, seq_k, page_size, heads, dtype, causal, seed, block_scales=False, sinks=True, window=(-1, -1),
                softcap=0.0, head_dim=D):
    heads_q, heads_k = heads
    q, k_cache, v_cache, qo, sglang, vllm, lists = make_paged(seq_q, seq_k, page_size, heads_q, heads_k, dtype, seed,
                                                              head_dim=head_dim)
    g = torch.Generator().manual_seed(seed + 1)
    sinks = torch.randn(heads_q, generator=g) * 3 if sinks else None
    fp8 = dtype == FP8
    scales, descales = {}, (1.0, 1.0, 1.0)
    kv_block = None
    if fp8 and block_scales:
        kv_block = torch.exp2(torch.rand(k_cache.shape[0], heads_k, 2, generator=g) * 4 - 2)
        scales = dict(q_descale=torch.tensor([0.7]), kv_block_descale=kv_block)
        descales = (0.7, 1.0, 1.0)
    elif fp8:
        descales = (0.37, 1.9, 0.61)
        scales = {n: torch.tensor([d]) for n, d in zip(("q_descale", "k_descale", "v_descale"), descales)}
    out = torch.full(q.shape, float("nan"), dtype=bp.out_dtype(dtype))
    o, lse = gfxasm.batch_prefill(q, k_cache, v_cache, qo, **sglang, causal=causal, window_size=window, sinks=sinks,
                                  softcap=softcap, out=out, return_lse=True, **scales)
    scale = 1 / math.sqrt(head_dim)
    for b, pages in enumerate(lists):
        q0, q1 = int(qo[b]), int(qo[b + 1])
        if q0 == q1:
            continue
        kb = sequence_kv(k_cache, pages, seq_k[b]).double() * descales[1]
        vb = sequence_kv(v_cache, pages, seq_k[b]).double() * descales[2]
        v_ratio = None
        if kv_block is not None:
            per_key = kv_block[pages[torch.arange(seq_k[b]) // page_size].long()].double()       # [Sk, Hkv, 2]
            kb, vb = kb * per_key[..., :1], vb * per_key[..., 1:]
            if page_size < bp.BLOCK_SCALE_MIN_PAGE:     # v scales vary inside a tile: P v / U is rounded
                v_ratio = bp.tile_v_ratio(per_key[..., 1]).repeat_interleave(heads_q // heads_k, 1)
        qb = q[q0:q1].double() * descales[0]
        o_ref, lse_ref = attention(qb, kb, vb, scale=scale, causal=causal, window=window, sinks=sinks, softcap=softcap)
        if fp8:
            o_tol, lse_slack = fp8_bound(qb, kb, vb, o_ref, scale, causal, sinks, window, v_ratio)
        else:
            o_tol, lse_slack = bound(q[q0:q1], kb, vb, o_ref, scale, dtype, softcap)
        assert_close(o[q0:q1], lse[:, q0:q1], o_ref, lse_ref, o_tol, lse_slack)
    o2 = gfxasm.batch_prefill(q, k_cache, v_cache, qo, **vllm, causal=causal, window_size=window, sinks=sinks,
                              softcap=softcap, **scales)
    assert torch.equal(o2.view(torch.int16), o.view(torch.int16)), "vLLM and SGLang tables differ"


def fp8_bound(q, k, v, o_ref, scale, causal, sinks, window, v_ratio=None):
    """FP8 (module docstring): fp8_p_bound on the probabilities with the sink in the
    denominator (block scales below page 64: with each key's U / v, `v_ratio` [Sk, Hq]), O's
    rounding to bf16, f32 noise; LSE 2^-14 (1 + |LSE|) of f32 scores."""
    sq, sk = q.shape[0], k.shape[0]
    hq = q.shape[1]
    kk = k.repeat_interleave(hq // k.shape[1], 1)
    vv = v.repeat_interleave(hq // v.shape[1], 1)
    s = torch.einsum("qhd,khd->hqk", q, kk) * scale
    pos = torch.arange(sq)[:, None] + sk - sq
    j = torch.arange(sk)[None, :]
    right = 0 if causal else window[1]
    hidden = torch.zeros(sq, sk, dtype=torch.bool)
    if right >= 0:
        hidden |= j > pos + right
    if window[0] >= 0:
        hidden |= j < pos - window[0]
    s = s.masked_fill(hidden, float("-inf"))
    sink = torch.full((hq, sq, 1), float("-inf"), dtype=torch.float64) if sinks is None else \
        sinks.double()[:, None, None].expand(hq, sq, 1)
    every = torch.cat([s, sink], dim=-1)
    p = torch.softmax(every, dim=-1)[..., :sk].nan_to_num(0.0)          # (rows without key or sink: 0)
    v_max = v.abs().max().item() if v.numel() else 0.0
    o_tol = bp.fp8_p_bound(p, s, vv, v_ratio) + 2.0**-8 * o_ref.abs() + 2.0**-16 * v_max
    lse = torch.logsumexp(every, dim=-1)
    return o_tol, 2.0**-14 * (1 + lse.nan_to_num(0.0, posinf=0.0, neginf=0.0).abs().max().item())


@pytest.mark.parametrize("page_size, causal, heads, dtype", [
    (16, True, (4, 1), torch.bfloat16),
    (1, False, (2, 2), torch.float16),
])
def test_prefill_sinks(page_size, causal, heads, dtype):
    run_prefill([1, 70, 0, 200], [1, 150, 30, 130], page_size, heads, dtype, causal, seed=page_size)


@pytest.mark.parametrize("page_size, causal, block_scales", [(16, True, False), (64, False, True), (16, True, True)])
def test_prefill_fp8_sinks(page_size, causal, block_scales):
    run_prefill([70, 130, 5], [100, 130, 0], page_size, (4, 2), FP8, causal, seed=3, block_scales=block_scales)


@pytest.mark.parametrize("page_size, causal, heads, dtype, window", [
    (16, True, (4, 1), torch.bfloat16, (40, -1)),
    (1, False, (2, 2), torch.float16, (20, 10)),
])
def test_prefill_window(page_size, causal, heads, dtype, window):
    run_prefill([1, 70, 0, 200, 90], [1, 150, 30, 130, 40], page_size, heads, dtype, causal, seed=page_size + 1,
                sinks=False, window=window)


@pytest.mark.parametrize("page_size, causal, block_scales", [(16, True, False), (64, False, True), (4, True, True)])
def test_prefill_fp8_window_and_sinks(page_size, causal, block_scales):
    run_prefill([70, 130, 5], [100, 200, 0], page_size, (4, 2), FP8, causal, seed=5, block_scales=block_scales,
                window=(50, 0 if causal else 20))


def test_prefill_window_with_sinks():
    run_prefill([100, 30], [230, 90], 16, (2, 1), torch.bfloat16, True, seed=8, window=(70, -1))


@pytest.mark.parametrize("page_size, causal, heads, dtype, window, sinks", [
    (16, True, (4, 1), torch.bfloat16, (-1, -1), False),
    (1, False, (2, 2), torch.float16, (20, 10), True),         # window + sinks + softcap
])
def test_prefill_softcap(page_size, causal, heads, dtype, window, sinks):
    run_prefill([1, 70, 0, 200], [1, 150, 30, 130], page_size, heads, dtype, causal, seed=page_size + 2,
                sinks=sinks, window=window, softcap=3.0)


def test_adversarial_schedules_window_sinks():
    """Waves interleaved and loads landing late (legal orders) give every output bit of the
    lockstep run: a window whose waves start at different tiles (the g0only bodies) and sinks."""
    g = torch.Generator().manual_seed(21)
    q = torch.randn(1, 70, 1, D, generator=g).bfloat16()
    k = torch.randn(1, 150, 1, D, generator=g).bfloat16()
    v = torch.randn(1, 150, 1, D, generator=g).bfloat16()
    sinks = torch.randn(1, generator=g)
    q2, k_cache, v_cache, qo, sglang, _, _ = make_paged([70], [130], 16, 1, 1, torch.bfloat16, 3)

    def run():
        return (*gfxasm.fmha_fwd(q, k, v, causal=True, window_size=(20, 0), sinks=sinks, return_lse=True),
                *gfxasm.batch_prefill(q2, k_cache, v_cache, qo, **sglang, causal=True, window_size=(20, 0),
                                      sinks=sinks, return_lse=True))
    assert adversarial.check(run, seeds=range(1)) == []


# ------------------------------------------------------------------ the cross-product (`pytest -m full`)

FULL_WINDOWS = [(-1, -1), (0, 0), (40, -1), (100, 30), (-1, 5)]


@pytest.mark.full
@pytest.mark.parametrize("dtype, causal, window, sinks, softcap", [
    (dtype, causal, window, sinks, softcap)
    for dtype, causal, window, sinks, softcap in itertools.product(
        (torch.bfloat16, torch.float16), (False, True), FULL_WINDOWS, (False, True), (0.0, 6.0))
    if not (causal and window[1] > 0)])
def test_fmha_features_full(dtype, causal, window, sinks, softcap):
    for batch, seq_q, seq_k, heads in ((1, 300, 300, (4, 1)), (2, 70, 400, (2, 2)), (1, 257, 64, (4, 2))):
        run_fmha(batch, seq_q, seq_k, *heads, dtype, causal, seed=seq_q, sinks=sinks, window=window,
                 softcap=softcap, q_scale=2.0)


@pytest.mark.full
@pytest.mark.parametrize("dtype, page_size, causal, window, softcap", [
    (dtype, page_size, causal, window, softcap)
    for dtype, page_size, causal, window, softcap in itertools.product(
        (torch.bfloat16, torch.float16, FP8), (1, 16, 64), (False, True), FULL_WINDOWS, (0.0, 6.0))
    if not (causal and window[1] > 0) and not (dtype == FP8 and softcap)])
def test_prefill_features_full(dtype, page_size, causal, window, softcap):
    for block_scales in ((False, True) if dtype == FP8 else (False,)):
        run_prefill([1, 70, 0, 257, 90], [1, 150, 30, 300, 40], page_size, (4, 2), dtype, causal, seed=page_size,
                    block_scales=block_scales, window=window, softcap=softcap)


# ------------------------------------------------------------------ KV cache layouts (views, no copies)

def as_layout(k_cache, v_cache, layout):
    """K and V of one pool in `layout`, as [pages, page, Hkv, D] views holding the same values:
    'sglang' [pages, 2, page, Hkv, D], 'vllm' [2, pages, page, Hkv, D], 'hnd' separate
    [pages, Hkv, page, D] permuted, 'hnd_pool' [pages, 2, Hkv, page, D], 'v_wide_rows' K as it
    is and V in rows of Hkv + 1 heads (another row stride than K's, the same page ratio)."""
    pages, page, hk, _ = k_cache.shape
    if layout == "v_wide_rows":
        wide = torch.full((pages, page, hk + 1, k_cache.shape[3]), float("nan")).to(v_cache.dtype)
        wide[:, :, :hk] = v_cache
        return k_cache, wide[:, :, :hk]
    if layout == "sglang":
        pool = torch.stack([k_cache, v_cache], dim=1)
        return pool[:, 0], pool[:, 1]
    if layout == "vllm":
        pool = torch.stack([k_cache, v_cache])
        return pool[0], pool[1]
    if layout == "hnd":
        return (c.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3) for c in (k_cache, v_cache))
    pool = torch.stack([k_cache.permute(0, 2, 1, 3), v_cache.permute(0, 2, 1, 3)], dim=1)       # hnd_pool
    return pool[:, 0].permute(0, 2, 1, 3), pool[:, 1].permute(0, 2, 1, 3)


@pytest.mark.parametrize("layout, page_size, dtype, heads", [
    ("sglang", 16, torch.bfloat16, (4, 2)),
    ("vllm", 1, torch.float16, (2, 1)),
    ("hnd", 16, torch.bfloat16, (4, 4)),
    ("hnd_pool", 64, FP8, (4, 2)),
    ("sglang", 4, FP8, (2, 1)),
    ("v_wide_rows", 1, FP8, (2, 1)),       # FP8 forms V's addresses from K's row offsets only when the strides agree
    ("v_wide_rows", 16, FP8, (4, 2)),
])
def test_prefill_cache_views(layout, page_size, dtype, heads):
    """The same values through each layout's views give every output bit of the plain pool's
    (which the other tests hold to the reference); no view is copied."""
    q, k_cache, v_cache, qo, sglang, vllm, _ = make_paged([5, 70], [40, 130], page_size, *heads, dtype, 17)
    scales = dict(q_descale=torch.tensor([0.5]), k_descale=torch.tensor([1.5])) if dtype == FP8 else {}
    k_view, v_view = as_layout(k_cache, v_cache, layout)
    assert torch.equal(k_view.view(torch.uint8), k_cache.view(torch.uint8)) and not k_view.is_contiguous() \
        or layout == "vllm" or layout == "v_wide_rows" and v_view.stride(1) != k_view.stride(1)
    assert torch.equal(v_view.view(torch.uint8), v_cache.view(torch.uint8))
    for table in (sglang, vllm):
        plain = gfxasm.batch_prefill(q, k_cache, v_cache, qo, **table, causal=True, return_lse=True, **scales)
        viewed = gfxasm.batch_prefill(q, k_view, v_view, qo, **table, causal=True, return_lse=True, **scales)
        assert not torch.isnan(plain[0]).any()
        for a, b in zip(plain, viewed):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), layout


def test_prefill_cache_layout_refused():
    q, k_cache, v_cache, qo, sglang, _, _ = make_paged([4], [40], 16, 6, 3, torch.bfloat16, 0)
    k_hnd, v_hnd = as_layout(k_cache, v_cache, "hnd")                 # Hkv = 3: pages 3 x page_size rows apart
    with pytest.raises(ValueError, match="'k_cache' pages must lie a power-of-two multiple of page_size rows apart"):
        gfxasm.batch_prefill(q, k_hnd, v_hnd, qo, **sglang)
    k2, v2 = as_layout(k_cache, v_cache, "sglang")
    with pytest.raises(ValueError, match="'v_cache' pages must lie as many rows apart as k_cache's"):
        gfxasm.batch_prefill(q, k_cache, v2, qo, **sglang)


# ------------------------------------------------------------------ bad input

def _fmha_inputs():
    q = torch.randn(1, 4, 4, D).bfloat16()
    kv = torch.randn(1, 8, 2, D).bfloat16()
    return q, kv


def both_refuse(error, words, **options):
    """fmha_fwd and batch_prefill each refuse `options` before launch with `error` matching `words`."""
    q, kv = _fmha_inputs()
    with pytest.raises(error, match=words):
        gfxasm.fmha_fwd(q, kv, kv, **options)
    q2, k_cache, v_cache, qo, sglang, _, _ = make_paged([4], [8], 16, 4, 2, torch.bfloat16, 0)
    with pytest.raises(error, match=words):
        gfxasm.batch_prefill(q2, k_cache, v_cache, qo, **sglang, **options)


@pytest.mark.parametrize("sinks, error, words", [
    (torch.zeros(3), ValueError, r"'sinks' must be \[heads_q\] = \[4\]"),
    (torch.zeros(4, dtype=torch.float64), TypeError, "'sinks' dtype must be torch.float32"),
    (torch.zeros(4, 1), ValueError, "'sinks' must have rank 1"),
    (torch.zeros(8)[::2], ValueError, "'sinks' must be contiguous"),
    (torch.tensor([0.0, float("inf"), 0.0, 0.0]), ValueError, "'sinks' must be finite, got inf for query head 1"),
    (torch.tensor([0.0, 0.0, float("nan"), 0.0]), ValueError, "'sinks' must be finite, got nan for query head 2"),
    ([0.0] * 4, TypeError, "'sinks' must be a torch.Tensor"),
])
def test_bad_sinks(sinks, error, words):
    both_refuse(error, words, sinks=sinks)


@pytest.mark.parametrize("options, error, words", [
    (dict(window_size=(3,)), TypeError, "'window_size' must be a pair of ints"),
    (dict(window_size=(1.5, 2)), TypeError, "'window_size' must be a pair of ints"),
    (dict(window_size=(True, 2)), TypeError, "'window_size' must be a pair of ints"),
    (dict(window_size=(-2, 0)), ValueError, "'window_size' entries must be -1"),
    (dict(window_size=(4, 3), causal=True), ValueError, "causal=True means window_size right = 0"),
])
def test_bad_window(options, error, words):
    both_refuse(error, words, **options)


@pytest.mark.parametrize("softcap, error, words", [
    ("1", TypeError, "'softcap' must be a float"),
    (True, TypeError, "'softcap' must be a float"),
    (-1.0, ValueError, "'softcap' must be finite and >= 0"),
    (float("inf"), ValueError, "'softcap' must be finite and >= 0"),
    (float("nan"), ValueError, "'softcap' must be finite and >= 0"),
])
def test_bad_softcap(softcap, error, words):
    both_refuse(error, words, softcap=softcap)


def test_fp8_softcap_refused():
    q, k_cache, v_cache, qo, sglang, _, _ = make_paged([4], [8], 16, 2, 2, FP8, 0)
    with pytest.raises(ValueError, match="'softcap' applies to bfloat16/float16 inputs only"):
        gfxasm.batch_prefill(q, k_cache, v_cache, qo, **sglang, softcap=2.0)


def test_sinks_on_another_device_refused():
    q, kv = _fmha_inputs()
    with pytest.raises(ValueError, match="'sinks' must be on q's device"):
        gfxasm.fmha_fwd(q, kv, kv, sinks=torch.zeros(4, device="meta"))
