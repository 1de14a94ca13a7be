"""gfxasm.decode_attention on the strict gfx950 emulator against a float64 reference
(gfxasm.ops.decode_attention.reference: the visible keys gathered through the page table).

Tolerance (decode_attention.tolerance, per element): the kernel rounds each softmax weight
P to the input dtype before P.V and rounds O once, so |O - O_ref| <= 2u (P|V| + |O|) + 1e-5
(u the dtype's unit roundoff); LSE within 2e-5 x max(1, |LSE|), -inf exactly where a row
sees no key.

Memory: every cache slot at or past a sequence's length and every page no sequence uses is
NaN, so a read of one shows up as NaN in O (so is every key before cache_leftpad and before
the first query's window: the kernel must not read them, not even into the first tile,
where V = NaN weighed by P = 0 would be NaN); page-table entries past a sequence's end hold
ids outside the pool. `out` is a strided view into a NaN-poisoned buffer: every element must
be written and nothing around it. One case places the used pages at ids >= 65,536 of a
pool over 4 GiB (allocated lazily; only the used pages are touched).

FP8: float8_e4m3fn caches with random per-tensor descales, or random per-token (scale, shift)
fp16 pairs (reference from the dequantised K/V); e4m3 NaN (0x7F) in every unused slot and
page, and NaN pairs there.

Shapes: ragged cache_seqlens with 0, 1, page boundaries +-1 and split boundaries +-1;
shuffled pages of 16, 64 and 1024 keys; contiguous caches (also as views into one KV
tensor); GQA ratios 1, 8, 16 (16 x Sq 16 = 256 query rows: 16 row tiles); Sq 1, 4, 16
causal and non-causal; sliding windows (left and right bounds) and sinks, split and unsplit;
cache_leftpad (keys before it NaN: never read); softcap (its error bound measured on rows
of one key); K and V as views of one pool ([pages, 2, ...], [2, pages, ...], HND, an HND
pool; FP8 pairs as views; one pool over 4 GiB); D 64 and 128; bf16 and fp16; FP8 launches
under seeded adversarial schedules (bit-identical outputs). Default-suite budget: 150 s on
a 2-core machine.

`test_full_cross_product` (marker `full`, deselected by default; `pytest -m full
tests/test_decode_attention.py`) runs page sizes 16/64/1024/contiguous x GQA 1/8/16 x Sq
1/4/16 x cache kind (16-bit, FP8 per-tensor, FP8 per-token) x D 64/128, options rotated;
`test_kv_views_of_one_pool_full` every pool layout x page 16/64/contiguous x cache kind x D,
with softcap, cache_leftpad and a window.
"""
from __future__ import annotations

import math
import re

import pytest
import torch

import gfxasm

from gfxasm.ops import decode_attention as da
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


@pytest.fixture(scope="module", autouse=True)
def built():
    da.build_kernels()


def make_cache(seqlens, heads_kv, dim, dtype, gen, page_size=None, spare_pages=3, first_page=0, pool_pages=None):
    """(k_cache, v_cache, block_table) with random visible keys and NaN everywhere else
    (dtype float8_e4m3fn: random e4m3 values up to +-8 and the e4m3 NaN 0x7F).
    Paged: each sequence gets shuffled pages of the pool (ids from first_page on), the
    table's entries past a sequence's end are ids outside the pool."""
    batch = len(seqlens)
    if page_size is None:
        s_max = max(max(seqlens), 1) + 5
        k = torch.full((batch, s_max, heads_kv, dim), float("nan"), dtype=dtype)
        v = torch.full((batch, s_max, heads_kv, dim), float("nan"), dtype=dtype)
        for b, n in enumerate(seqlens):
            k[b, :n] = (torch.randn(n, heads_kv, dim, generator=gen) * 2).to(dtype)
            v[b, :n] = (torch.randn(n, heads_kv, dim, generator=gen) * 2).to(dtype)
        return k, v, None
    per_seq = [da.cdiv(n, page_size) for n in seqlens]
    max_pages = max(max(per_seq), 1) + 1
    used = sum(per_seq)
    total = pool_pages or (first_page + used + spare_pages)
    shape = (total, page_size, heads_kv, dim)
    if pool_pages:                                  # lazily allocated: fill only the used range
        k, v = torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype)
        k[first_page:].fill_(float("nan"))
        v[first_page:].fill_(float("nan"))
    else:
        k, v = torch.full(shape, float("nan"), dtype=dtype), torch.full(shape, float("nan"), dtype=dtype)
    ids = (first_page + torch.randperm(total - first_page, generator=gen)[:used]).tolist()
    table = torch.full((batch, max_pages), total + 7, dtype=torch.int32)
    table[:, -1] = -3
    for b, n in enumerate(seqlens):
        for i in range(per_seq[b]):
            page = ids.pop()
            table[b, i] = page
            keys = min(page_size, n - i * page_size)
            k[page, :keys] = (torch.randn(keys, heads_kv, dim, generator=gen) * 2).to(dtype)
            v[page, :keys] = (torch.randn(keys, heads_kv, dim, generator=gen) * 2).to(dtype)
    return k, v, table


def hide_before_start(tensors, table, seqlens, seq_q, left, leftpad):
    """Copies of cache-shaped tensors with NaN in every key slot before the batch entry's
    cache_leftpad and before the first query's window (the kernel must not read them, nor
    load them into a tile: V = NaN weighed by P = 0 would make O NaN). The copies keep the
    tensors' strides (views of one pool stay views of one, copied pool); with nothing to
    hide, the tensors themselves."""
    cuts = [max(leftpad[b], n - seq_q - left if left >= 0 else 0) for b, n in enumerate(seqlens)]
    if not any(cuts):
        return tensors
    storages = {}
    for t in tensors:                 # one copy per storage: K and V views of one pool share it
        storages.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().clone())
    tensors = [torch.empty(0, dtype=t.dtype).set_(storages[t.untyped_storage().data_ptr()], t.storage_offset(),
                                                  t.shape, t.stride()) for t in tensors]
    for b, cut in enumerate(cuts):
        for j in range(cut):
            for t in tensors:
                if table is None:
                    t[b, j] = float("nan")
                else:
                    t[int(table[b, j // t.shape[1]]), j % t.shape[1]] = float("nan")
    return tensors


def nan_pairs_like(cache, gen):
    """Random (scale, shift) pairs for a cache, NaN wherever the cache slot is unused (NaN)."""
    pairs = da.random_pairs(cache.shape, gen)
    pairs[torch.isnan(cache[..., 0].float())] = float("nan")
    return pairs


def poisoned_out(q):
    """A NaN view shaped like q inside a larger NaN buffer (two extra heads): (view, base)."""
    batch, seq_q, heads_q, dim = q.shape
    base = torch.full((batch, seq_q, heads_q + 2, dim), float("nan"), dtype=q.dtype)
    return base[:, :, 1:heads_q + 1], base


def check(seqlens, heads_q, heads_kv, seq_q=1, dim=128, dtype=torch.bfloat16, page_size=None, causal=True,
          window=-1, sinks=False, num_splits=None, seed=0, cache=None, softmax_scale=None, fp8=None,
          scales=None, q=None, leftpad=None, softcap=0.0):
    """fp8: None (cache in q's dtype), "tensor" (e4m3, random per-tensor descales) or "token"
    (e4m3, random per-token (scale, shift) pairs, NaN where the cache is unused). window:
    window_size, or an int: its left bound. sinks: a bool (True: random) or the [heads_q]
    tensor itself; scales: the FP8 scale arguments themselves, instead of random ones; q: q
    itself, instead of a random one; leftpad: cache_leftpad as a list (its keys are NaN)."""
    window_size = (window, -1) if isinstance(window, int) else tuple(window)
    gen = torch.Generator().manual_seed(seed)
    batch = len(seqlens)
    if q is None:
        q = torch.randn(batch, seq_q, heads_q, dim, generator=gen).to(dtype)
    kv_dtype = torch.float8_e4m3fn if fp8 else dtype
    k, v, table = cache if cache is not None else make_cache(seqlens, heads_kv, dim, kv_dtype, gen, page_size)
    descales = {}
    if fp8 == "tensor":
        descales = dict(k_descale=torch.rand(1, generator=gen) + 0.2, v_descale=torch.rand(1, generator=gen) * 3)
    elif fp8 == "token":
        descales = dict(k_scale_shift=nan_pairs_like(k, gen), v_scale_shift=nan_pairs_like(v, gen))
    if scales is not None:
        descales = scales
    seqlens_t = torch.tensor(seqlens, dtype=torch.int32)
    if isinstance(sinks, torch.Tensor):
        sink_t = sinks
    else:
        sink_t = torch.randn(heads_q, generator=gen) * 2 if sinks else None
    out, base = poisoned_out(q)
    names = ["k", "v"] + [n for n, t in descales.items() if t.dim() == 4]
    given = [k, v] + [descales[n] for n in names[2:]]
    pads = leftpad or [0] * batch
    leftpad_t = torch.tensor(leftpad, dtype=torch.int32) if leftpad is not None else None
    hidden = dict(zip(names, hide_before_start(given, table, seqlens, seq_q, window_size[0], pads)))
    o, lse = gfxasm.decode_attention(q, hidden.pop("k"), hidden.pop("v"), seqlens_t, block_table=table, causal=causal,
                                     window_size=window_size, sinks=sink_t, num_splits=num_splits, out=out,
                                     return_lse=True, softmax_scale=softmax_scale, cache_leftpad=leftpad_t,
                                     softcap=softcap, **{**descales, **hidden})
    assert o is out
    assert torch.isnan(base[:, :, 0]).all() and torch.isnan(base[:, :, -1]).all(), "a store landed outside out"
    if table is not None:
        last = k.shape[0] - 1                         # the device's clamp (ids read as unsigned)
        table = torch.where((table < 0) | (table > last), torch.full_like(table, last), table)
    o_ref, lse_ref, o_abs = da.reference(q, k, v, seqlens_t, block_table=table, causal=causal,
                                         window_size=window_size, sinks=sink_t, softmax_scale=softmax_scale,
                                         cache_leftpad=leftpad_t, softcap=softcap, **descales)
    assert not torch.isnan(o).any(), f"{int(torch.isnan(o).sum())} O elements NaN (unwritten, or a NaN slot read)"
    err = (o.double() - o_ref).abs()
    bound = da.tolerance(o_ref, o_abs, dtype)
    worst = int(torch.argmax(err / bound))
    assert (err <= bound).all(), (f"{int((err > bound).sum())} of {o.numel()} O elements off; worst "
                                  f"{err.view(-1)[worst]:.3g} > {bound.view(-1)[worst]:.3g} at "
                                  f"{list(torch.unravel_index(torch.tensor(worst), o.shape))}")
    assert lse.shape == (batch, heads_q, seq_q) and not torch.isnan(lse).any()
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_ref)), "LSE -inf where the reference is not (or not)"
    finite = torch.isfinite(lse_ref)
    lse_err = (lse.double() - lse_ref)[finite].abs()
    lse_tol = da.LSE_TOL * lse_ref[finite].abs().clamp(min=1) + da.SOFTCAP_ERROR * softcap
    assert (lse_err <= lse_tol).all(), f"max LSE error {lse_err.max():.3g}"
    return o


# (seqlens, Hq, Hkv, Sq, D, dtype, page_size, causal, window, sinks, num_splits)
CASES = [
    # ragged lengths around 16-key page boundaries, 0 and 1, GQA 8, one split
    ([0, 1, 15, 16, 17, 33, 47, 48], 8, 1, 1, 128, "bf16", 16, True, -1, False, 1),
    # split boundaries: chunk 64 (4 splits of 256 capacity): 63, 64, 65, 127, 128, 129
    ([63, 64, 65, 127, 128, 129], 8, 1, 1, 128, "f16", 64, True, -1, False, 4),
    # page 64 boundaries +-1, the model chooses the splits
    ([63, 64, 65, 191, 200], 4, 4, 1, 64, "bf16", 64, True, -1, False, None),
    # a 1024-key page, GQA 16, Sq 4 causal, with a split inside the page
    ([1, 700, 1024, 1030], 16, 1, 4, 64, "f16", 1024, True, -1, False, 3),
    # GQA 1 (MHA), Sq 16 causal, page 16
    ([16, 40, 3], 2, 2, 16, 128, "bf16", 16, True, -1, False, 2),
    # GQA 16, Sq 16: 256 query rows = 16 row tiles; lengths shorter than Sq (rows with no key)
    ([20, 9, 0], 16, 1, 16, 64, "bf16", 16, True, -1, False, 2),
    # non-causal Sq 4
    ([50, 77], 8, 2, 4, 128, "f16", 16, False, -1, False, 2),
    # sliding window (pages wholly before the window are skipped), with and without splits
    ([300, 45, 5], 8, 1, 4, 128, "bf16", 16, True, 37, False, 1),
    ([300, 129], 8, 1, 1, 64, "f16", 64, True, 100, False, 3),
    # sinks, unsplit (the merge runs alone) and split, with a window
    ([0, 33, 90], 8, 2, 2, 128, "bf16", 16, True, -1, True, 1),
    ([200, 31], 16, 2, 1, 64, "bf16", 64, True, 50, True, 4),
    # 11 splits of 32 keys: the merge reads two batches of 8, the second partly past the end
    ([330, 40], 8, 2, 2, 64, "bf16", 16, True, -1, True, 11),
    # contiguous caches
    ([0, 1, 31, 32, 33, 100], 8, 1, 1, 128, "bf16", None, True, -1, False, 1),
    ([70, 130], 8, 2, 4, 64, "f16", None, True, -1, True, None),
    ([90, 5], 4, 4, 16, 128, "f16", None, False, 20, False, 3),
]


@pytest.mark.parametrize("seqlens,hq,hkv,sq,dim,dtype,page,causal,window,sinks,splits", CASES, ids=lambda x: str(x))
def test_decode(seqlens, hq, hkv, sq, dim, dtype, page, causal, window, sinks, splits):
    check(seqlens, hq, hkv, sq, dim, DTYPES[dtype], page, causal, window, sinks, splits)


# FP8 (e4m3) caches with random per-tensor descales; unused slots and pages hold e4m3 NaN
FP8_CASES = [
    ([0, 1, 15, 16, 17, 100], 8, 1, 1, 128, "bf16", 16, True, -1, False, 3),
    ([63, 64, 65, 300], 16, 1, 4, 64, "f16", 64, True, -1, False, None),
    ([40, 9], 4, 2, 16, 128, "f16", None, True, 20, True, 2),
    ([1030, 7], 8, 8, 2, 64, "bf16", 1024, False, -1, False, 1),
]


@pytest.mark.parametrize("seqlens,hq,hkv,sq,dim,dtype,page,causal,window,sinks,splits", FP8_CASES, ids=lambda x: str(x))
def test_decode_fp8(seqlens, hq, hkv, sq, dim, dtype, page, causal, window, sinks, splits):
    check(seqlens, hq, hkv, sq, dim, DTYPES[dtype], page, causal, window, sinks, splits, fp8="tensor")


# FP8 caches with per-token per-KV-head (scale, shift) pairs (NaN where unused)
FP8_TOKEN_CASES = [
    ([0, 1, 15, 16, 17, 100], 8, 1, 1, 128, "bf16", 16, True, -1, False, 3),
    ([63, 64, 65, 300], 16, 1, 4, 64, "f16", 64, True, 40, False, None),
    ([40, 9], 4, 2, 16, 128, "f16", None, True, -1, True, 2),
    ([1030, 7], 8, 8, 2, 64, "bf16", 1024, False, -1, False, 1),
]


@pytest.mark.parametrize("seqlens,hq,hkv,sq,dim,dtype,page,causal,window,sinks,splits", FP8_TOKEN_CASES,
                         ids=lambda x: str(x))
def test_decode_fp8_scale_shift(seqlens, hq, hkv, sq, dim, dtype, page, causal, window, sinks, splits):
    check(seqlens, hq, hkv, sq, dim, DTYPES[dtype], page, causal, window, sinks, splits, fp8="token")


def test_split_chunks_line_up_with_the_cases():
    # the split-boundary case above relies on chunk 64 for 4 splits of a 4-page x 64 table
    assert da.plan(6, 1, 8, 4 * 64, 4).chunk == 64


def test_contiguous_views_into_one_kv_tensor_and_scale():
    gen = torch.Generator().manual_seed(4)
    seqlens = [45, 12]
    kv = torch.full((2, 50, 2, 3, 128), float("nan"), dtype=torch.bfloat16)    # [B, S, K/V, Hkv, D]
    for b, n in enumerate(seqlens):
        kv[b, :n] = torch.randn(n, 2, 3, 128, generator=gen).to(torch.bfloat16)
    check(seqlens, 6, 3, 2, 128, torch.bfloat16, cache=(kv[:, :, 0], kv[:, :, 1], None), num_splits=2,
          softmax_scale=0.05)


def test_page_ids_clamped():
    # ids past the pool (and negative) are clamped to the last page on the device
    gen = torch.Generator().manual_seed(5)
    k, v, table = make_cache([40], 1, 64, torch.float16, gen, page_size=16, spare_pages=0)
    last = k.shape[0] - 1
    k[last, :] = torch.randn(16, 1, 64, generator=gen).to(torch.float16)
    v[last, :] = torch.randn(16, 1, 64, generator=gen).to(torch.float16)
    table[0, 1] = 1000
    table[0, 2] = -1
    check([40], 4, 1, 1, 64, torch.float16, cache=(k, v, table))


def test_pool_over_4gib_high_page_ids():
    # 70,000 pages of 256 keys x 1 head x 128 dims (64 KiB each): 4.6 GB, allocated lazily;
    # the sequences live in pages >= 66,000, whose byte offsets exceed 2^32
    gen = torch.Generator().manual_seed(6)
    cache = make_cache([300, 513], 1, 128, torch.bfloat16, gen, page_size=256, first_page=66_000, pool_pages=70_000)
    table = cache[2]
    assert table[(table >= 0) & (table < 70_000)].min() >= 66_000
    check([300, 513], 8, 1, 1, 128, torch.bfloat16, cache=cache, num_splits=2)


def test_allocates_out_and_no_lse():
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(2, 1, 4, 64, generator=gen).to(torch.float16)
    k, v, table = make_cache([10, 33], 2, 64, torch.float16, gen, page_size=16)
    seqlens = torch.tensor([10, 33], dtype=torch.int32)
    o = gfxasm.decode_attention(q, k, v, seqlens, block_table=table)
    o_ref, _, o_abs = da.reference(q, k, v, seqlens, block_table=table)
    assert o.shape == q.shape and o.dtype == q.dtype
    assert ((o.double() - o_ref).abs() <= da.tolerance(o_ref, o_abs, torch.float16)).all()


def test_splits_are_deterministic_and_agree():
    gen = torch.Generator().manual_seed(8)
    q = torch.randn(1, 1, 8, 128, generator=gen).to(torch.bfloat16)
    k, v, table = make_cache([250], 1, 128, torch.bfloat16, gen, page_size=16)
    seqlens = torch.tensor([250], dtype=torch.int32)
    runs = [gfxasm.decode_attention(q, k, v, seqlens, block_table=table, num_splits=s) for s in (1, 3, 3)]
    assert torch.equal(runs[1], runs[2])
    o_ref, _, o_abs = da.reference(q, k, v, seqlens, block_table=table)
    assert all(((r.double() - o_ref).abs() <= da.tolerance(o_ref, o_abs, torch.bfloat16)).all() for r in runs)


def test_split_model():
    # 8 waves per workgroup: 128 (batch, KV head) pairs already give 1024 waves -> one split
    p = da.plan(128, 1, 8, 8192)
    assert p.num_splits == 1 and p.chunk == 8192 and p.row_tiles == 1 and not p.partial
    assert da.plan(16, 8, 8, 1024).num_splits == 1
    few = da.plan(2, 1, 8, 8192)                                 # 16 waves: 16 splits of 512 keys
    assert few.num_splits == 16 and few.chunk == 512 and few.partial
    assert da.plan(2, 1, 8, 2048).num_splits == 4               # capped by 512 keys per split
    assert da.plan(1, 1, 256, 100).num_splits == 1              # short caches: one split
    forced = da.plan(1, 1, 8, 1000, 7)
    assert forced.num_splits == 7 and forced.chunk == 160 and forced.row_tiles == 1
    assert da.plan(1, 1, 8, 100, 64).num_splits == 4             # empty splits dropped (chunk 32)


def test_waves_per_group_matches_the_manifest():
    from gfxasm.manifest import default_manifest
    assert default_manifest().kernel(da.KERNEL).workgroup[0] == 64 * da.WAVES_PER_GROUP


# ------------------------------------------------------------------ bad inputs

def good(dtype=torch.bfloat16, paged=True):
    q = torch.zeros(2, 1, 8, 128, dtype=dtype)
    if paged:
        k = torch.zeros(6, 16, 2, 128, dtype=dtype)
        table = torch.zeros(2, 3, dtype=torch.int32)
    else:
        k, table = torch.zeros(2, 40, 2, 128, dtype=dtype), None
    return dict(q=q, k_cache=k, v_cache=k.clone(), cache_seqlens=torch.tensor([5, 30], dtype=torch.int32),
                block_table=table)


FP8_CACHE = torch.zeros(6, 16, 2, 128, dtype=torch.float8_e4m3fn)     # good()'s paged cache in FP8


def run(**changes):
    """decode_attention on good() with `changes`."""
    args = good()
    args.update(changes)
    return gfxasm.decode_attention(args.pop("q"), args.pop("k_cache"), args.pop("v_cache"), args.pop("cache_seqlens"),
                                   **args)


def raises(exc, match, **changes):
    with pytest.raises(exc, match=match):
        run(**changes)


def launched(**changes) -> None:
    """The call passes every check: it reaches the (stubbed) launch."""
    with pytest.raises(AssertionError, match="a kernel was launched"):
        run(**changes)


def test_bad_fp8_arguments(no_launch):
    fp8 = torch.zeros(6, 16, 2, 128, dtype=torch.float8_e4m3fn)
    one = torch.ones(1)
    raises(ValueError, "'k_descale' is required for a float8_e4m3fn cache", k_cache=fp8, v_cache=fp8)
    raises(ValueError, "'v_descale' is required", k_cache=fp8, v_cache=fp8, k_descale=one)
    raises(ValueError, "'k_descale' is only for an FP8", k_descale=one)
    raises(TypeError, "'v_descale' must be one float32 element", k_cache=fp8, v_cache=fp8, k_descale=one,
           v_descale=torch.ones(2))
    raises(TypeError, "'k_descale' must be one float32 element", k_cache=fp8, v_cache=fp8, k_descale=one.double(),
           v_descale=one)
    raises(TypeError, "'v_cache' dtype must be q's", k_cache=fp8, k_descale=one, v_descale=one)
    pairs = torch.zeros(6, 16, 2, 2, dtype=torch.float16)
    raises(ValueError, "not both", k_cache=fp8, v_cache=fp8, k_descale=one, v_descale=one, k_scale_shift=pairs,
           v_scale_shift=pairs)
    raises(ValueError, "'v_scale_shift' is required", k_cache=fp8, v_cache=fp8, k_scale_shift=pairs)
    raises(ValueError, "'k_scale_shift' is only for an FP8", k_scale_shift=pairs, v_scale_shift=pairs)
    raises(TypeError, "'k_scale_shift' dtype must be torch.float16", k_cache=fp8, v_cache=fp8,
           k_scale_shift=pairs.float(), v_scale_shift=pairs)
    raises(ValueError, r"'v_scale_shift' must be shaped like the cache's token dims plus 2: \(6, 16, 2, 2\)",
           k_cache=fp8, v_cache=fp8, k_scale_shift=pairs, v_scale_shift=pairs[:, :8])
    raises(ValueError, "'k_scale_shift' pairs must be contiguous", k_cache=fp8, v_cache=fp8,
           k_scale_shift=torch.zeros(6, 16, 2, 4, dtype=torch.float16)[..., ::2], v_scale_shift=pairs)
    e5m2 = fp8.view(torch.uint8).view(torch.float8_e5m2)
    raises(TypeError, "'k_cache' dtype must be q's .* got torch.float8_e5m2", k_cache=e5m2, v_cache=e5m2,
           k_descale=one, v_descale=one)


def test_bad_shapes_and_dtypes(no_launch):
    q = good()["q"]
    raises(TypeError, "'q' dtype must be torch.bfloat16 or torch.float16", q=q.float())
    raises(ValueError, "'q' head dim must be 64 or 128, got 96", q=torch.zeros(2, 1, 8, 96, dtype=torch.bfloat16))
    raises(ValueError, r"'q' seq_q must be in 1..16, got 17", q=torch.zeros(2, 17, 8, 128, dtype=torch.bfloat16))
    raises(ValueError, "'q' must have rank 4", q=q[0])
    raises(TypeError, "'k_cache' dtype must be q's", k_cache=torch.zeros(6, 16, 2, 128, dtype=torch.float16))
    raises(ValueError, "'v_cache' shape must equal k_cache's", v_cache=torch.zeros(6, 16, 1, 128, dtype=torch.bfloat16))
    raises(ValueError, r"Hq % Hkv == 0\), got Hq=8, Hkv=3", k_cache=torch.zeros(6, 16, 3, 128, dtype=torch.bfloat16),
           v_cache=torch.zeros(6, 16, 3, 128, dtype=torch.bfloat16))
    raises(ValueError, "'k_cache' head dim must equal q's", k_cache=torch.zeros(6, 16, 2, 64, dtype=torch.bfloat16),
           v_cache=torch.zeros(6, 16, 2, 64, dtype=torch.bfloat16))
    for page in (24, 8):
        cache = torch.zeros(6, page, 2, 128, dtype=torch.bfloat16)
        raises(ValueError, f"page_size must be a power of two >= 16, got {page}", k_cache=cache, v_cache=cache)
    raises(TypeError, "'block_table' dtype must be torch.int32", block_table=torch.zeros(2, 3, dtype=torch.int64))
    raises(ValueError, r"'block_table' must be \[2, max_pages >= 1\]", block_table=torch.zeros(3, 3, dtype=torch.int32))
    raises(ValueError, "'block_table' must be contiguous", block_table=torch.zeros(3, 2, dtype=torch.int32).T)
    raises(TypeError, "'cache_seqlens' dtype must be torch.int32", cache_seqlens=torch.tensor([5, 30]))
    raises(ValueError, r"'cache_seqlens' must be \[2\]", cache_seqlens=torch.tensor([5], dtype=torch.int32))
    raises(ValueError, "'cache_seqlens' must be >= 0, got -1", cache_seqlens=torch.tensor([-1, 3], dtype=torch.int32))
    raises(ValueError, r"max\(cache_seqlens\) = 49 exceeds the cache: block_table holds 3 pages x 16",
           cache_seqlens=torch.tensor([5, 49], dtype=torch.int32))
    raises(TypeError, "'k_cache' must be a torch.Tensor", k_cache=[[0.0]])
    raises(ValueError, "'k_cache' must be on q's device", k_cache=good()["k_cache"].to("meta"))


def test_bad_contiguous_cache(no_launch):
    c = good(paged=False)
    three = torch.zeros(3, 40, 2, 128, dtype=torch.bfloat16)
    raises(ValueError, "'k_cache' batch must equal q's \\(2\\) for a contiguous cache, got 3", k_cache=three,
           v_cache=three, block_table=None)
    raises(ValueError, r"max\(cache_seqlens\) = 41 exceeds the cache: the cache holds 40 keys", k_cache=c["k_cache"],
           v_cache=c["v_cache"], block_table=None, cache_seqlens=torch.tensor([41, 3], dtype=torch.int32))
    shifted = torch.zeros(2 * 40 * 2 * 128 + 1, dtype=torch.bfloat16)[1:].view(2, 40, 2, 128)   # 2 bytes off
    raises(ValueError, "'k_cache' data must be 16-byte aligned", k_cache=shifted, v_cache=shifted, block_table=None)
    # misaligned and with 260-byte head strides: the strides are checked first (the pointers
    # only when the call is about to launch)
    wide = torch.zeros(2, 40, 2, 130, dtype=torch.bfloat16)[..., 1:129]
    raises(ValueError, "'k_cache' strides must be non-negative multiples of 16 bytes", k_cache=wide, v_cache=wide,
           block_table=None)
    t = torch.zeros(2, 128, 40, 2, dtype=torch.bfloat16).permute(0, 2, 3, 1)
    raises(ValueError, "'k_cache' must be contiguous in the head dim", k_cache=t, v_cache=t, block_table=None)


def test_bad_options(no_launch):
    raises(TypeError, "'causal' must be a bool", causal=1)
    # window_size and softcap: fmha's checks (fmha.window_pair, check_window, check_softcap)
    for window in ((3.0, -1), (3,), 5, (True, 0), (1, 2, 3)):
        raises(TypeError, re.escape(f"'window_size' must be a pair of ints (left, right), got {window!r}"),
               window_size=window)
    for window in ((-2, -1), (-1, -2)):
        raises(ValueError, re.escape(f"'window_size' entries must be -1 (unbounded) or >= 0, got {window}"),
               window_size=window)
    raises(ValueError, re.escape("causal=True means window_size right = 0; got window_size (4, 1)"), window_size=(4, 1))
    launched(window_size=(4, 0))
    launched(window_size=(2**40, -1))                  # past any sequence: unbounded
    for softcap in ("3", True):
        raises(TypeError, "'softcap' must be a float", softcap=softcap)
    for softcap in (-1.0, float("nan"), float("inf")):
        raises(ValueError, "'softcap' must be finite and >= 0", softcap=softcap)
    raises(ValueError, "'softcap' 1e-300 with softmax_scale", softcap=1e-300)
    raises(ValueError, "'softcap' 1e\\+300 with softmax_scale", softcap=1e300)
    raises(TypeError, "'sinks' dtype must be torch.float32", sinks=torch.zeros(8, dtype=torch.bfloat16))
    raises(ValueError, r"'sinks' must be \[8\]", sinks=torch.zeros(4))
    raises(ValueError, r"'num_splits' must be an int in \[1, 64\] or None, got 0", num_splits=0)
    raises(ValueError, r"'num_splits' must be an int in \[1, 64\] or None, got 65", num_splits=65)
    raises(ValueError, "'softmax_scale' must be a finite float > 0", softmax_scale=float("inf"))
    raises(ValueError, "'out' shape must equal q's", out=torch.empty(2, 1, 8, 64, dtype=torch.bfloat16))
    raises(TypeError, "'out' dtype must equal q's", out=torch.empty(2, 1, 8, 128, dtype=torch.float16))
    raises(TypeError, "'return_lse' must be a bool", return_lse=None)
    q = torch.zeros(2, 1, 8, 128, dtype=torch.bfloat16)
    raises(ValueError, "'out' overlaps the memory of 'q'", q=q, out=q)
    raises(ValueError, "'out' has elements sharing memory", out=torch.zeros(1, 1, 1, 128, dtype=torch.bfloat16)
           .expand(2, 1, 8, 128))
    # q and the caches on meta, the index tensors on the CPU: a device mix like any other
    raises(ValueError, r"'cache_seqlens' must be on q's device \(meta\), got cpu",
           q=good()["q"].to("meta"), k_cache=good()["k_cache"].to("meta"), v_cache=good()["v_cache"].to("meta"))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_sinks_refused(no_launch, value):
    # issue 26: a NaN sink gave finite values near +-1e29 instead of NaN
    sinks = torch.zeros(8)
    sinks[3] = value
    raises(ValueError, rf"'sinks' must be finite, got {value} for query head 3", sinks=sinks)


@pytest.mark.parametrize("name", ["k_descale", "v_descale"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, -1.0])
def test_bad_descales_refused(no_launch, name, value):
    scales = dict(k_descale=torch.ones(1), v_descale=torch.ones(1))
    scales[name] = torch.tensor([value])
    raises(ValueError, f"'{name}' must be finite and > 0, got {re.escape(str(value))}", k_cache=FP8_CACHE,
           v_cache=FP8_CACHE, **scales)


@pytest.mark.parametrize("k_descale,v_descale", [(1e-45, 2.0**100), (2.0**100, 1e-40)])
def test_extreme_descales_match_the_reference(k_descale, v_descale):
    # no range narrower than finite and > 0 is refused: decode_attn folds k_descale into the
    # score scale and v_descale into O's final 1 / l, and f32 subnormals (k_descale 1e-45:
    # equal weights) and 2^100 give the reference's answer (test_fp8_large_v_descale: 2^124)
    gen = torch.Generator().manual_seed(27)
    k, v, table = make_cache([0, 1, 37], 1, 64, torch.float8_e4m3fn, gen, page_size=16)
    check([0, 1, 37], 8, 1, 1, 64, torch.bfloat16, cache=(k, v, table), num_splits=1, fp8="tensor",
          scales=dict(k_descale=torch.tensor([k_descale]), v_descale=torch.tensor([v_descale])))


def pairs_call(name, page, row, value, part=0, **changes) -> dict:
    """An FP8 per-token call on a paged pool of 6 pages of 16: batch 0 holds 20 keys in
    pages 2 and -1 (clamped to page 5 on the device), batch 1 30 keys in pages 1 and 3;
    `name`'s pair at (page, row, KV head 1) gets `value` in its scale (part 0) or shift (1)."""
    pairs = {n: torch.ones(6, 16, 2, 2, dtype=torch.float16) for n in ("k_scale_shift", "v_scale_shift")}
    pairs[name][page, row, 1, part] = value
    table = torch.tensor([[2, -1, 0], [1, 3, 4]], dtype=torch.int32)
    return dict(k_cache=FP8_CACHE, v_cache=FP8_CACHE, block_table=table, cache_seqlens=torch.tensor([20, 30],
                dtype=torch.int32), **pairs, **changes)


@pytest.mark.parametrize("name", ["k_scale_shift", "v_scale_shift"])
def test_non_finite_pairs_refused(no_launch, name):
    # issue 26: a K pair holding +-inf gave a finite row where the reference gives NaN (the
    # kernel computes scale (q.k) + shift sum(q)); only the pairs of keys a query sees count
    seen = r"must be finite for every key a query sees, got .* for batch entry {}, key {}, KV head 1"
    for value, part in ((float("inf"), 0), (float("-inf"), 1), (float("nan"), 0)):
        raises(ValueError, f"'{name}' " + seen.format(1, 16 + 13), **pairs_call(name, 3, 13, value, part))
    raises(ValueError, seen.format(0, 16 + 3), **pairs_call(name, 5, 3, float("inf")))        # page -1: the last
    launched(**pairs_call(name, 5, 4, float("inf")))             # key 20 of batch 0: past its cache_seqlens
    launched(**pairs_call(name, 0, 0, float("nan")))             # page 0: no sequence's
    # a window of 5 behind the one query: batch 1 sees keys 24..29, no query key 23
    launched(**pairs_call(name, 3, 7, float("inf")), window_size=(5, -1))
    raises(ValueError, seen.format(1, 24), **pairs_call(name, 3, 8, float("inf")), window_size=(5, -1))


def test_bad_cache_leftpad(no_launch):
    raises(TypeError, "'cache_leftpad' dtype must be torch.int32, got torch.int64",
           cache_leftpad=torch.zeros(2, dtype=torch.int64))
    raises(ValueError, re.escape("'cache_leftpad' must be [2], got (3,)"), cache_leftpad=torch.zeros(3, dtype=torch.int32))
    raises(ValueError, "'cache_leftpad' must be contiguous", cache_leftpad=torch.zeros(4, dtype=torch.int32)[::2])
    raises(ValueError, re.escape("'cache_leftpad' must be within [0, cache_seqlens], got 31 for batch entry 1 "
                                 "(cache_seqlens 30)"), cache_leftpad=torch.tensor([5, 31], dtype=torch.int32))
    raises(ValueError, r"'cache_leftpad' must be within \[0, cache_seqlens\], got -1 for batch entry 0",
           cache_leftpad=torch.tensor([-1, 0], dtype=torch.int32))
    raises(ValueError, r"'cache_leftpad' must be on q's device \(cpu\), got meta",
           cache_leftpad=torch.zeros(2, dtype=torch.int32, device="meta"))
    launched(cache_leftpad=torch.tensor([5, 30], dtype=torch.int32))        # every key padding: legal


@pytest.mark.parametrize("page", [16, None])
def test_unchecked_leftpad_clamped_on_the_device(page):
    # on a GPU the host cannot read cache_leftpad: the kernel takes a negative one as 0 and
    # one past cache_seqlens as no key (extremes included), reading nothing outside the table
    # or pool (the strict emulator faults on any such read). Launched past the host check.
    gen = torch.Generator().manual_seed(40)
    seqlens = [37, 20, 33, 5]
    q = torch.randn(4, 2, 4, 64, generator=gen).to(torch.bfloat16)
    k, v, table = make_cache(seqlens, 1, 64, torch.bfloat16, gen, page)
    bad = torch.tensor([-5, 2**31 - 1, -2**31, 6], dtype=torch.int32)
    seqlens_t = torch.tensor(seqlens, dtype=torch.int32)
    out, lse, runs = da.launches(q, k, v, seqlens_t, block_table=table, cache_leftpad=torch.zeros(4, dtype=torch.int32),
                                 num_splits=2, return_lse=True)
    out.fill_(float("nan"))
    for kernel, variant, args in runs:
        gfxasm.launch(kernel, variant=variant, **dict(args, cache_leftpad=bad) if kernel == da.KERNEL else args)
    if table is not None:
        table = torch.where((table < 0) | (table >= k.shape[0]), k.shape[0] - 1, table)
    o_ref, lse_ref, o_abs = da.reference(q, k, v, seqlens_t, block_table=table,
                                         cache_leftpad=torch.minimum(bad.clamp(min=0), seqlens_t))
    assert ((out.double() - o_ref).abs() <= da.tolerance(o_ref, o_abs, torch.bfloat16)).all()
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_ref)) and torch.isinf(lse[1]).all() and torch.isinf(lse[3]).all()
    finite = torch.isfinite(lse_ref)
    assert ((lse.double() - lse_ref)[finite].abs() <= da.LSE_TOL * lse_ref[finite].abs().clamp(min=1)).all()


def test_data_checks_survive_the_plan_cache(no_launch):
    # a repeat of a planned layout checks its data again
    launched(sinks=torch.zeros(8))
    raises(ValueError, "'sinks' must be finite", sinks=torch.full((8,), float("nan")))
    ones = torch.ones(1)
    launched(k_cache=FP8_CACHE, v_cache=FP8_CACHE, k_descale=ones, v_descale=ones)
    raises(ValueError, "'v_descale' must be finite and > 0", k_cache=FP8_CACHE, v_cache=FP8_CACHE, k_descale=ones,
           v_descale=-ones)
    launched(**pairs_call("k_scale_shift", 0, 0, 1.0))
    raises(ValueError, "'k_scale_shift' must be finite", **pairs_call("k_scale_shift", 1, 0, float("nan")))


@pytest.mark.parametrize("name", ["cache_seqlens", "block_table", "sinks", "out"])
def test_device_mix_refused(no_launch, name):
    # issue 26: every tensor of a call on q's device, index tensors and outputs included
    changes = dict(sinks=torch.zeros(8), out=torch.empty(2, 1, 8, 128, dtype=torch.bfloat16))
    changes[name] = dict(good(), **changes)[name].to("meta")
    raises(ValueError, rf"'{name}' must be on q's device \(cpu\), got meta", **changes)


@pytest.mark.parametrize("name", ["k_descale", "v_scale_shift"])
def test_fp8_scale_on_another_device_refused(no_launch, name):
    scales = (dict(k_descale=torch.ones(1), v_descale=torch.ones(1)) if name == "k_descale" else
              dict(k_scale_shift=torch.ones(6, 16, 2, 2, dtype=torch.float16),
                   v_scale_shift=torch.ones(6, 16, 2, 2, dtype=torch.float16)))
    scales[name] = scales[name].to("meta")
    raises(ValueError, rf"'{name}' must be on q's device \(cpu\), got meta", k_cache=FP8_CACHE, v_cache=FP8_CACHE,
           **scales)


def test_reference_known_answer():
    # one key: O = V, LSE = score; two equal keys: O = mean, LSE = score + ln 2
    q = torch.ones(1, 1, 1, 64, dtype=torch.bfloat16)
    k = torch.full((1, 2, 1, 64), 0.5, dtype=torch.bfloat16)
    v = torch.stack([torch.full((64,), 2.0), torch.full((64,), 4.0)]).view(1, 2, 1, 64).to(torch.bfloat16)
    score = 64 * 0.5 / 8.0
    o, lse, _ = da.reference(q, k, v, torch.tensor([1], dtype=torch.int32))
    assert torch.allclose(o, torch.full_like(o, 2.0)) and lse.item() == pytest.approx(score)
    o, lse, _ = da.reference(q, k, v, torch.tensor([2], dtype=torch.int32))
    assert torch.allclose(o, torch.full_like(o, 3.0)) and lse.item() == pytest.approx(score + math.log(2))
    o, lse, _ = da.reference(q, k, v, torch.tensor([0], dtype=torch.int32))
    assert torch.all(o == 0) and lse.item() == float("-inf")


# ------------------------------------------------------------------ the full cross-product: not run by CI

def _full_cases():
    """Every page size (and contiguous) x GQA 1/8/16 x Sq 1/4/16 x cache kind x D, with
    ragged lengths around page and split boundaries, dtype and options rotated."""
    kinds, dtypes = (None, "tensor", "token"), ("bf16", "f16")
    n = 0
    for page in (16, 64, 1024, None):
        for hq, hkv in ((2, 2), (8, 1), (32, 2)):
            for sq in (1, 4, 16):
                for kind in kinds:
                    for dim in (64, 128):
                        n += 1
                        lengths = [0, 1, 15, 17, 63, 65, 200] if page != 1024 else [1, 1023, 1025]
                        yield (lengths, hq, hkv, sq, dim, dtypes[n % 2], page, n % 5 != 0, (-1, 30)[n % 3 == 0],
                               n % 4 == 0, (None, 1, 3)[n % 3], kind)


@pytest.mark.full
@pytest.mark.parametrize("seqlens,hq,hkv,sq,dim,dtype,page,causal,window,sinks,splits,fp8", list(_full_cases()),
                         ids=lambda x: str(x))
def test_full_cross_product(seqlens, hq, hkv, sq, dim, dtype, page, causal, window, sinks, splits, fp8):
    check(seqlens, hq, hkv, sq, dim, DTYPES[dtype], page, causal, window, sinks, splits, fp8=fp8)


@pytest.mark.parametrize("fp8", ["tensor", "token"])
def test_fp8_schedule_independent(fp8):
    # seeded random legal schedules and load-landing orders (gfxasm.emu.adversarial) must give
    # bit-identical outputs: the pipelined loads, the pair permutes and the LDS combine
    from gfxasm.emu import adversarial
    gen = torch.Generator().manual_seed(11)
    q = torch.randn(2, 2, 8, 64, generator=gen).to(torch.float16)
    k, v, table = make_cache([150, 40], 2, 64, torch.float8_e4m3fn, gen, page_size=16)
    scales = (dict(k_descale=torch.tensor([0.5]), v_descale=torch.tensor([2.0])) if fp8 == "tensor" else
              dict(k_scale_shift=nan_pairs_like(k, gen), v_scale_shift=nan_pairs_like(v, gen)))
    seqlens = torch.tensor([150, 40], dtype=torch.int32)
    found = adversarial.check(lambda: gfxasm.decode_attention(q, k, v, seqlens, block_table=table, num_splits=2,
                                                              return_lse=True, **scales), range(3))
    assert not found, "\n".join(map(str, found))


def test_features_schedule_independent():
    # the first tile's out-of-range offsets (cache_leftpad, window start), the softcap scores
    # and a right-bounded window under seeded adversarial schedules: bit-identical outputs
    from gfxasm.emu import adversarial
    gen = torch.Generator().manual_seed(12)
    q = torch.randn(2, 2, 2, 64, generator=gen).to(torch.bfloat16)
    k, v, table = make_cache([80, 30], 1, 64, torch.bfloat16, gen, page_size=16)
    seqlens, leftpad = torch.tensor([80, 30], dtype=torch.int32), torch.tensor([21, 3], dtype=torch.int32)
    found = adversarial.check(lambda: gfxasm.decode_attention(q, k, v, seqlens, block_table=table, num_splits=2,
                                                              cache_leftpad=leftpad, window_size=(50, 1),
                                                              causal=False, softcap=25.0, return_lse=True), range(2))
    assert not found, "\n".join(map(str, found))


# ------------------------------------------------------------------ legal inputs at the edges of f32 and of the shapes

@pytest.mark.parametrize("dim,dtype,fp8,sinks,seq_q", [(64, "bf16", None, False, 1), (128, "f16", None, True, 2),
                                                       (128, "bf16", "tensor", False, 1), (64, "f16", "token", True, 1)])
def test_contiguous_cache_of_one_key(dim, dtype, fp8, sinks, seq_q):
    # S_max = 1: the seq axis of the cache (and of its FP8 pairs) has one element, and its stride
    # reached the kernel as 0; decode_attn bounds each block's descriptor at (valid keys) x (seq
    # stride), so the one key read as zeros. A cache of one key is never split (a split holds
    # >= 32 keys); sinks take it through the merge. Batch entry 1 is empty and NaN.
    gen = torch.Generator().manual_seed(20)
    kv_dtype = torch.float8_e4m3fn if fp8 else DTYPES[dtype]
    k, v = ((torch.randn(3, 1, 2, dim, generator=gen) * 2).to(kv_dtype) for _ in range(2))
    k[1], v[1] = float("nan"), float("nan")
    check([1, 0, 1], 4, 2, seq_q, dim, DTYPES[dtype], cache=(k, v, None), sinks=sinks, fp8=fp8)


@pytest.mark.parametrize("dim,page,splits", [(64, None, 1), (128, 16, 3), (128, None, 2), (64, 64, None)])
def test_sinks_far_from_the_scores(dim, page, splits):
    # A row that sees no key (batch 0; tokens 0 and 1 of batch 1) has LSE = its sink and O = 0,
    # whatever the sink: -1e30 used to fall below the merge's floor of the running max (-1e30
    # in log2 units) and weigh 0 (LSE -inf); +-3e38 overflow f32 in log2 units (x log2 e),
    # which gave -inf and NaN. Rows with keys: a sink of 3e38 takes all the weight (O = 0).
    sinks = torch.tensor([-1e30, -3e38, 3e38, 0.5, -1e30, 1e30, -3e38, 2.0])
    check([0, 2, 40], 8, 2, 4, dim, torch.bfloat16, page, sinks=sinks, num_splits=splits, seed=21)


@pytest.mark.parametrize("dim,page,splits", [(64, None, 1), (128, 16, 2)])
def test_scores_below_minus_1e30(dim, page, splits):
    # Every score near -1e31 (log2 units): q > 0 and k < 0, both ~1e15. The running max was
    # floored at -1e30, so every P underflowed to 0 and the rows came out as if they saw no
    # key (O = 0, LSE = -inf); the softmax of such scores is well defined (here: the best key's V).
    gen = torch.Generator().manual_seed(22)
    q = ((torch.rand(2, 2, 4, dim, generator=gen) + 0.5) * 1e15).to(torch.bfloat16)
    k, v, table = make_cache([45, 130], 2, dim, torch.bfloat16, gen, page_size=page)
    k = -(k.abs() + 0.5) * 1e15                                                   # NaN slots stay NaN
    check([45, 130], 4, 2, 2, dim, torch.bfloat16, cache=(k, v, table), num_splits=splits, q=q)


def fp8_between(cache, lo, hi, gen):
    """The e4m3 cache with its visible (non-NaN) values replaced by random ones in [lo, hi)."""
    x = cache.float()
    return torch.where(torch.isnan(x), x, torch.rand(x.shape, generator=gen) * (hi - lo) + lo).to(cache.dtype)


@pytest.mark.parametrize("dim,page,splits,v_range,k_descale,v_descale", [
    (64, None, 1, None, 0.7, 2.0**60),               # the reproducer: waves with no key made 0 x inf
    (128, 16, 3, None, 1.5, 2.0**60),
    (64, None, 1, (4, 8), 2.0**-12, 2.0**124),        # 8 waves of O ~1.3e38 summed past 3.4e38
    (128, 16, 5, (4, 8), 2.0**-12, 2.0**124),         # 5 splits likewise, in the merge
])
def test_fp8_large_v_descale(dim, page, splits, v_range, k_descale, v_descale):
    # O fits f32 (and bf16) whenever every dequantised V value does; no intermediate may
    # overflow. v_descale used to be folded into 1 / max(l, 1e-30) (inf for a wave with no
    # key: 0 x inf = NaN), and the waves' and splits' O were summed with weights up to 1 each
    # before the division by the sum of weights. k_descale 2^-12: equal weights.
    gen = torch.Generator().manual_seed(23)
    k, v, table = make_cache([0, 1, 37, 256], 1, dim, torch.float8_e4m3fn, gen, page_size=page)
    if v_range:
        v = fp8_between(v, *v_range, gen)
    scales = dict(k_descale=torch.tensor([k_descale]), v_descale=torch.tensor([v_descale]))
    check([0, 1, 37, 256], 8, 1, 1, dim, torch.bfloat16, cache=(k, v, table), num_splits=splits, fp8="tensor",
          scales=scales)


@pytest.mark.parametrize("dim,page,splits", [(128, None, 1), (64, 16, 4)])
def test_fp8_pairs_at_the_fp16_limit(dim, page, splits):
    # Per-token pairs of +-65504 (fp16's largest): V = fp8 x scale + shift up to ~2.9e7, kept in
    # range by construction (P x scale <= 65504 fits q's dtype; O from the f32 sums / l)
    gen = torch.Generator().manual_seed(24)
    k, v, table = make_cache([0, 40, 100], 2, dim, torch.float8_e4m3fn, gen, page_size=page)
    k_pairs, v_pairs = nan_pairs_like(k, gen), nan_pairs_like(v, gen)
    shift = (torch.randint(0, 2, v_pairs.shape[:-1], generator=gen) * 2 - 1) * 65504.0
    extreme = torch.stack([torch.full_like(shift, 65504.0), shift], -1).to(torch.float16)
    v_pairs = torch.where(torch.isnan(v_pairs), v_pairs, extreme)
    check([0, 40, 100], 4, 2, 1, dim, torch.bfloat16, cache=(k, v, table), num_splits=splits, fp8="token",
          scales=dict(k_scale_shift=k_pairs, v_scale_shift=v_pairs))


def check_special(q, k, v, seqlens, table, nan_rows, **options):
    """decode_attention against the float64 reference where inputs hold +-inf: O NaN exactly
    where the reference's is (`nan_rows` rows, all of each), the rest within tolerance; LSE
    -inf where the reference's is, NaN where it is NaN or +inf (a +inf score: m = inf, the
    kernel's sum is NaN), finite within LSE_TOL elsewhere."""
    seqlens_t = torch.tensor(seqlens, dtype=torch.int32)
    out, base = poisoned_out(q)
    o, lse = gfxasm.decode_attention(q, k, v, seqlens_t, block_table=table, out=out, return_lse=True, **options)
    assert torch.isnan(base[:, :, 0]).all() and torch.isnan(base[:, :, -1]).all(), "a store landed outside out"
    options.pop("num_splits")
    o_ref, lse_ref, o_abs = da.reference(q, k, v, seqlens_t, block_table=table, **options)
    ref_nan = torch.isnan(o_ref).all(-1)
    assert int(ref_nan.sum()) == nan_rows and not torch.isnan(o_ref[~ref_nan]).any()
    assert torch.equal(torch.isnan(o), torch.isnan(o_ref)), "O NaN where the reference is not (or not)"
    ok = ~torch.isnan(o_ref)
    assert ((o.double() - o_ref).abs()[ok] <= da.tolerance(o_ref, o_abs, q.dtype)[ok]).all()
    assert torch.equal(torch.isnan(lse), torch.isnan(lse_ref) | torch.isposinf(lse_ref))
    assert torch.equal(torch.isneginf(lse), torch.isneginf(lse_ref))
    finite = torch.isfinite(lse_ref)
    assert ((lse.double() - lse_ref)[finite].abs() <= da.LSE_TOL * lse_ref[finite].abs().clamp(min=1)).all()


@pytest.mark.parametrize("dim,page,splits,causal", [(64, None, 1, False), (128, 16, 3, False), (128, None, 2, False),
                                                    (64, 64, None, True)])
def test_inf_in_q(dim, page, splits, causal):
    # q holding +-inf: the scores of its row are +-inf (NaN where k is 0) and the float64
    # softmax is NaN: a +inf score gives inf - inf, and a row whose visible keys all score
    # -inf gives 0 / 0. The latter came out as O = 0 (l = 0, like a row that sees no key).
    # Dims 3 and 5 of every key are made negative and positive, so the sign of the inf in q
    # picks the case; batch 2 sees no key (O = 0, LSE = -inf, inf or not).
    gen = torch.Generator().manual_seed(25)
    seqlens = [5, 40, 0]
    q = torch.randn(3, 2, 4, dim, generator=gen).to(torch.float16)
    k, v, table = make_cache(seqlens, 2, dim, torch.float16, gen, page_size=page)
    k[..., 3] = -(k[..., 3].abs() + 0.25)
    k[..., 5] = k[..., 5].abs() + 0.25
    q[0, 0, 0, 3] = q[2, 0, 0, 3] = float("inf")                          # every visible score -inf
    q[1, 1, 2, 5] = float("-inf")                                         # likewise
    q[0, 1, 1, 3] = float("-inf")                                         # every visible score +inf
    q[1, 0, 3, 5] = float("inf")                                          # likewise
    q[1, 1, 0, 3] = q[1, 1, 0, 5] = float("inf")                          # -inf + inf terms: NaN scores
    check_special(q, k, v, seqlens, table, 5, causal=causal, num_splits=splits)


@pytest.mark.parametrize("page,splits,sinks", [(None, 3, False), (16, 3, False), (None, 1, False), (16, 2, True)])
def test_inf_in_k(page, splits, sinks):
    # -inf in dim 3 of keys 0-31 of batch 0 (all of split 0 with 3 splits of 32) and of every
    # key of batch 1; q's dim 3 > 0, so those keys score -inf. Batch 0's rows still see finite
    # keys: the split (or wave) whose keys all score -inf must weigh 0, not make O NaN, while
    # batch 1's rows are 0 / 0 (NaN) unless a sink weighs (then O = 0, LSE = the sink). One row
    # of batch 0 has q's dim 3 < 0: +inf scores, NaN.
    gen = torch.Generator().manual_seed(26)
    seqlens = [80, 20]
    q = torch.randn(2, 2, 4, 128, generator=gen).to(torch.float16)
    q[..., 3] = q[..., 3].abs() + 0.25
    q[0, 1, 3, 3] = -q[0, 1, 3, 3]
    k, v, table = make_cache(seqlens, 2, 128, torch.float16, gen, page_size=page)
    for b, keys in ((0, range(32)), (1, range(20))):
        for j in keys:
            if table is None:
                k[b, j, :, 3] = float("-inf")
            else:
                k[int(table[b, j // page]), j % page, :, 3] = float("-inf")
    sink_t = torch.randn(4, generator=gen) if sinks else None
    check_special(q, k, v, seqlens, table, 1 if sinks else 9, causal=False, num_splits=splits, sinks=sink_t)


# ------------------------------------------------------------------ window_size, cache_leftpad, softcap

# (seqlens, Hq, Hkv, Sq, D, dtype, page_size, causal, window_size, sinks, num_splits, leftpad, softcap, fp8);
# those marked full run with -m full only
FEATURE_CASES = [
    # non-causal with a right bound (query s sees up to pos + 2) and a left one, page 16, splits
    ([100, 37, 5], 8, 2, 4, 128, "bf16", 16, False, (20, 2), False, 3, None, 0.0, None),
    # right bound only, contiguous, GQA 16 x Sq 4 (4 row tiles), D 64
    pytest.param([60, 90], 16, 1, 4, 64, "f16", None, False, (-1, 0), True, 2, None, 0.0, None, marks=pytest.mark.full),
    # left-padded batch (pads not multiples of 16; one entry all padding: no key; one whose pad
    # leaves fewer keys than Sq: its first queries see none), paged 16, split boundaries
    ([90, 40, 17, 33], 8, 1, 4, 128, "bf16", 16, True, (-1, -1), False, 3, [21, 40, 15, 0], 0.0, None),
    # leftpad with a window (the range starts at the later of the two), contiguous, splits, sinks
    ([130, 70], 4, 4, 2, 64, "f16", None, True, (25, 0), True, 2, [90, 3], 0.0, None),
    # leftpad past a whole page (page 64: that page is never read) and a right-bounded window
    ([200, 150], 8, 2, 1, 128, "f16", 64, False, (40, 5), False, None, [70, 130], 0.0, None),
    # softcap alone (both dtypes, both D), with a window, with sinks and splits
    ([77, 20, 0], 8, 1, 2, 128, "bf16", 16, True, (-1, -1), False, 1, None, 15.0, None),
    pytest.param([150, 64], 16, 2, 1, 64, "f16", None, True, (30, -1), True, 3, None, 30.0, None,
                 marks=pytest.mark.full),
    # everything together: window, sinks, softcap, leftpad, on FP8 per-tensor and per-token caches
    ([120, 45], 8, 2, 4, 64, "bf16", 16, True, (33, 0), True, 2, [7, 19], 20.0, "tensor"),
    ([120, 45], 8, 2, 2, 128, "f16", 16, False, (33, 3), True, 3, [7, 19], 10.0, "token"),
    pytest.param([64, 100], 4, 1, 1, 128, "bf16", None, True, (-1, -1), False, 1, [50, 0], 0.0, "token",
                 marks=pytest.mark.full),
]


@pytest.mark.parametrize("seqlens,hq,hkv,sq,dim,dtype,page,causal,window,sinks,splits,leftpad,softcap,fp8",
                         FEATURE_CASES, ids=lambda x: str(x))
def test_window_leftpad_softcap(seqlens, hq, hkv, sq, dim, dtype, page, causal, window, sinks, splits, leftpad,
                                softcap, fp8):
    check(seqlens, hq, hkv, sq, dim, DTYPES[dtype], page, causal, window, sinks, splits, leftpad=leftpad,
          softcap=softcap, fp8=fp8)


def test_rows_whose_window_holds_no_key():
    # non-causal right bound 0 with a leftpad past the first queries' positions: those rows see
    # no key (O = 0, LSE = -inf), the others do; a left window of 0 sees only its own key
    check([40, 18], 8, 2, 8, 64, torch.bfloat16, 16, False, (3, 0), False, 2, leftpad=[36, 17])
    check([40, 18], 8, 2, 4, 128, torch.float16, None, True, (0, 0), False, 1, leftpad=[5, 0])


@pytest.mark.parametrize("dim,dtype,fp8", [(128, "bf16", None), (64, "f16", "tensor")])
def test_softcap_error_bound(dim, dtype, fp8):
    # window (0, 0): each row sees exactly its own key, so LSE is that key's capped score and
    # |LSE - softcap tanh(scale q.k / softcap)| measures the kernel's tanh (v_exp_f32,
    # v_rcp_f32): within SOFTCAP_ERROR * softcap, over scores across tanh's range (|y| up to ~6)
    gen = torch.Generator().manual_seed(5)
    seqlens, softcap, dtype = [64, 33], 4.0, DTYPES[dtype]
    q = (torch.randn(2, 16, 8, dim, generator=gen) * 2).to(dtype)
    kv_dtype = torch.float8_e4m3fn if fp8 else dtype
    k, v, table = make_cache(seqlens, 2, dim, kv_dtype, gen)
    scales = dict(k_descale=torch.tensor([0.75]), v_descale=torch.tensor([1.0])) if fp8 else {}
    _, lse = gfxasm.decode_attention(q, k, v, torch.tensor(seqlens, dtype=torch.int32), window_size=(0, 0),
                                     softcap=softcap, num_splits=1, return_lse=True, **scales)
    _, lse_ref, _ = da.reference(q, k, v, torch.tensor(seqlens, dtype=torch.int32), window_size=(0, 0),
                                 softcap=softcap, **scales)
    raw = lse_ref.abs().max()
    assert raw > 0.95 * softcap, "the scores should reach tanh's flat range"
    err = (lse.double() - lse_ref).abs().max()
    assert err <= da.SOFTCAP_ERROR * softcap, f"softcap score error {err:.3g} > {da.SOFTCAP_ERROR * softcap:.3g}"


def test_reference_window_and_leftpad_by_hand():
    # the reference's visibility against a direct count: leftpad 3, seqlen 10, Sq 2 non-causal
    # window (2, 1): query 0 at position 10 - 3 - 2 = 5 (key 8) sees keys 6..9, query 1 keys 7..9
    q = torch.zeros(1, 2, 1, 64, dtype=torch.bfloat16)
    k = torch.zeros(1, 12, 1, 64, dtype=torch.bfloat16)
    v = torch.arange(12, dtype=torch.float32).view(1, 12, 1, 1).expand(1, 12, 1, 64).to(torch.bfloat16)
    o, lse, _ = da.reference(q, k, v, torch.tensor([10], dtype=torch.int32), causal=False, window_size=(2, 1),
                             cache_leftpad=torch.tensor([3], dtype=torch.int32))
    assert o[0, 0, 0, 0].item() == pytest.approx((6 + 7 + 8 + 9) / 4) and lse[0, 0, 0].item() == pytest.approx(math.log(4))
    assert o[0, 1, 0, 0].item() == pytest.approx((7 + 8 + 9) / 3) and lse[0, 0, 1].item() == pytest.approx(math.log(3))


# ------------------------------------------------------------------ K and V as views of one pool; HND

def _u8(t):
    return t.view(torch.uint8)


def pool_views(k, v, layout):
    """k and v ([N, page, Hkv, X]: caches or their (scale, shift) pairs) copied into one pool
    tensor of `layout`, returned as views of it shaped like k and v:
      nkv   [N, 2, page, Hkv, X]   (flashinfer, SGLang)
      kvn   [2, N, page, Hkv, X]   (vLLM)
      hnd   k and v each [N, Hkv, page, X], permuted (flashinfer's HND)
      nkhv  [N, 2, Hkv, page, X]   (one HND pool), permuted"""
    dtype = k.dtype
    if layout == "nkv":
        pool = torch.stack([_u8(k), _u8(v)], 1).view(dtype)
        return pool[:, 0], pool[:, 1]
    if layout == "kvn":
        pool = torch.stack([_u8(k), _u8(v)], 0).view(dtype)
        return pool[0], pool[1]
    if layout == "hnd":
        return tuple(_u8(t).transpose(1, 2).contiguous().view(dtype).transpose(1, 2) for t in (k, v))
    assert layout == "nkhv"
    pool = torch.stack([_u8(k).transpose(1, 2), _u8(v).transpose(1, 2)], 1).contiguous().view(dtype)
    return pool[:, 0].transpose(1, 2), pool[:, 1].transpose(1, 2)


def check_pool(layout, page, fp8, dim, dtype, seq_q, seqlens, seed, **options):
    gen = torch.Generator().manual_seed(seed)
    k, v, table = make_cache(seqlens, 2, dim, torch.float8_e4m3fn if fp8 else dtype, gen, page)
    k_view, v_view = pool_views(k, v, layout)
    assert k_view.data_ptr() != k.data_ptr() and torch.equal(_u8(k_view), _u8(k)) and torch.equal(_u8(v_view), _u8(v))
    scales = None
    if fp8 == "token":
        ks, vs = pool_views(nan_pairs_like(k, gen), nan_pairs_like(v, gen), layout)
        scales = dict(k_scale_shift=ks, v_scale_shift=vs)
    elif fp8 == "tensor":
        scales = dict(k_descale=torch.tensor([0.625]), v_descale=torch.tensor([1.5]))
    check(seqlens, 8, 2, seq_q, dim, dtype, page, cache=(k_view, v_view, table), fp8=fp8, scales=scales, **options)


POOL_CASES = [("nkv", 16, None, 128, torch.bfloat16), ("kvn", 64, "token", 64, torch.float16),
              ("hnd", 16, "tensor", 128, torch.float16), ("nkhv", None, None, 64, torch.bfloat16)]


@pytest.mark.parametrize("layout,page,fp8,dim,dtype", POOL_CASES, ids=str)
def test_kv_views_of_one_pool(layout, page, fp8, dim, dtype):
    # the kernel steps K and V (and their pairs) by their own byte strides: views of one pool,
    # in either order or HND, need no copy; the pool's other half and unused slots are NaN
    check_pool(layout, page, fp8, dim, dtype, 2, [70, 33, 0], seed=31, num_splits=2, window=(40, 0), leftpad=[5, 0, 0],
               sinks=True)


@pytest.mark.full
@pytest.mark.parametrize("layout", ["nkv", "kvn", "hnd", "nkhv"])
@pytest.mark.parametrize("page", [16, 64, None])
@pytest.mark.parametrize("fp8", [None, "tensor", "token"])
@pytest.mark.parametrize("dim", [64, 128])
def test_kv_views_of_one_pool_full(layout, page, fp8, dim):
    check_pool(layout, page, fp8, dim, torch.float16 if dim == 64 else torch.bfloat16, 4, [130, 17, 64], seed=32,
               softcap=12.0, leftpad=[3, 0, 20], window=(50, -1))


def test_combined_pool_over_4gib_high_page_ids():
    # K and V as views of one [pages, 2, page, Hkv, D] pool of 34,000 pages of 256 keys (128 KiB
    # each: 4.5 GB, allocated lazily): the sequences' pages are >= 33,000, byte offsets past 2^32
    gen = torch.Generator().manual_seed(33)
    pool = torch.empty(34_000, 2, 256, 1, 128, dtype=torch.bfloat16)
    pool[33_000:].fill_(float("nan"))
    seqlens = [300, 513]
    ids = (33_000 + torch.randperm(1000, generator=gen)[:5]).tolist()
    table = torch.tensor([[ids[0], ids[1], -1], [ids[2], ids[3], ids[4]]], dtype=torch.int32)
    for b, n in enumerate(seqlens):
        for i in range(da.cdiv(n, 256)):
            keys = min(256, n - 256 * i)
            pool[table[b, i], :, :keys] = torch.randn(2, keys, 1, 128, generator=gen).to(torch.bfloat16)
    assert pool[:, 0].stride(0) * 2 * 33_000 > 2**32
    check(seqlens, 8, 1, 1, 128, torch.bfloat16, 256, cache=(pool[:, 0], pool[:, 1], table), num_splits=2)
