"""gfxasm.batch_prefill on the strict gfx950 emulator against a float64 reference.

Inputs: ragged batches (queries 1, 17, 255, 256, 257 and empty sequences; keys longer
than queries by a prefix, or none), pages shuffled through a pool larger than needed, every
pool slot no sequence uses poisoned with NaN (a kernel that reads one fails: the NaN
reaches O), outputs poisoned with NaN first. The same cache is run through the SGLang
table and the vLLM table, which must give identical bytes.

Tolerance for bf16/fp16 (gfxasm.ops.fmha.tolerances, per sequence on the gathered dense
K/V): twice the error of PyTorch evaluating the same attention in the inputs' precision,
plus 4 ulp at 1.0; LSE likewise (fmha's docstring says why).

Tolerance for FP8 e4m3 Q/K/V (bf16 out), against the float64 attention of the dequantised
inputs, per output element: bp.fp8_p_bound (P rounded to e4m3 before the P.V GEMM: 2^-4
relative for normal P, 2^-10 absolute below, the row sum from unrounded P; its docstring
derives it; with kv_block_descale below page 64 the absolute part grows by v_ref / v per key,
P' = P v / v_ref being what is rounded) + 2^-8 |O| (O's own rounding to bf16) + 2^-16
v_descale max|V| (f32 accumulation and the v_exp/v_rcp approximations, far below the rest). Scores are products
of e4m3 values, exact in f32, summed over 128 terms in f32, so LSE is held to
2^-14 (1 + |LSE|).

Default run: every page size (1, 16, 64, 1024) with both table kinds, causal and not,
MHA and GQA 8/1, bf16 and fp16 spread over the cases; FP8 with per-tensor descales and with
kv_block_descale at page sizes 1, 2, 4, 16, 32 (per key), 64 and 1024 (per tile), v scales of
a sequence's neighbouring pages 2^9 or more apart (block_descales). `pytest -m full` runs
the larger cross-product (page sizes x causal x dtype x heads x batches, block scales at
every page size).
"""
from __future__ import annotations

import collections
import contextlib
import itertools

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import gfxasm
from gfxasm import build, launcher
from gfxasm.emu import adversarial
from gfxasm.ops import batch_prefill as bp
from gfxasm.ops import fmha

D = bp.HEAD_DIM
NO_FEATURES = (-1, -1, None, 0.0)        # window_left, window_right, sinks, softcap in the torch ops' schemas


@pytest.fixture(scope="module", autouse=True)
def built():
    build.build_kernels([bp.KERNEL])      # this op's kernels only, like the other ops' tests


def make_problem(seq_q, seq_k, page_size, heads_q, heads_k, dtype, seed, spare_pages=3):
    """q, caches and both page tables of one shuffled pool; unused slots hold NaN."""
    g = torch.Generator().manual_seed(seed)
    counts = [-(-s // page_size) for s in seq_k]
    num_pages = sum(counts) + spare_pages
    order = torch.randperm(num_pages, generator=g).to(torch.int32)
    k_cache = torch.full((num_pages, page_size, heads_k, D), float("nan"), dtype=dtype)
    v_cache = torch.full_like(k_cache, float("nan"))
    page_lists, at = [], 0
    for n, s in zip(counts, seq_k):
        pages = order[at:at + n]
        at += n
        for j in range(s):
            k_cache[pages[j // page_size], j % page_size] = torch.randn(heads_k, D, generator=g).to(dtype)
            v_cache[pages[j // page_size], j % page_size] = torch.randn(heads_k, D, generator=g).to(dtype)
        page_lists.append(pages)
    max_blocks = max(counts + [1]) + 1                  # a padded table: entries past a list are garbage
    block_table = torch.randint(-(2**30), 2**30, (len(seq_k), max_blocks), generator=g, dtype=torch.int32)
    for b, pages in enumerate(page_lists):
        block_table[b, :len(pages)] = pages
    sglang = dict(kv_indptr=torch.tensor([0] + list(itertools.accumulate(counts)), dtype=torch.int32),
                  kv_page_indices=torch.cat(page_lists) if page_lists else torch.zeros(0, dtype=torch.int32),
                  kv_last_page_len=torch.tensor([s - (n - 1) * page_size if n else 0 for n, s in zip(counts, seq_k)],
                                                dtype=torch.int32))
    vllm = dict(block_table=block_table, seqlens_k=torch.tensor(seq_k, dtype=torch.int32))
    qo_indptr = torch.tensor([0] + list(itertools.accumulate(seq_q)), dtype=torch.int32)
    q = torch.randn(int(qo_indptr[-1]), heads_q, D, generator=g).to(dtype)
    return q, k_cache, v_cache, qo_indptr, sglang, vllm


def page_list(sglang, b):
    return sglang["kv_page_indices"][int(sglang["kv_indptr"][b]):int(sglang["kv_indptr"][b + 1])]


def block_descales(num_pages, heads_k, sglang, seed):
    """kv_block_descale [num_pages, Hkv, 2], random per page and KV head: k in 2^-3 .. 2^3, v in
    2^6 .. 2^7 for every second page of a sequence (its even pages, or for odd b its odd ones:
    at page size 4 and 8 the pages of a tile alternate between the lane halves, so either half
    holds the largest) and 2^-4 .. 2^-3 for the others, so the pages of a tile (below page size
    64) differ by 2^9 or more: P' = P v / U with U below the tile's largest v scale overflows
    e4m3 (448 < 2^9) at the row's largest P (1), and the small pages' P' are subnormal (the
    bound's v_ratio); at page size >= 64 O changes units at every page."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(num_pages, heads_k, 2, generator=g)
    high = torch.zeros(num_pages, 1, dtype=torch.bool)
    for b in range(sglang["kv_indptr"].shape[0] - 1):
        high[page_list(sglang, b)[b % 2::2].long()] = True
    v = torch.where(high, torch.exp2(6 + u[..., 1]), torch.exp2(-4 + u[..., 1]))
    return torch.stack([torch.exp2(6 * u[..., 0] - 3), v], dim=-1)


def dense(q, k_cache, v_cache, qo_indptr, table, b):
    """Sequence b as fmha's [1, S, H, 128] tensors (for its tolerances)."""
    page_list, kv_start, seqlen_k = table
    q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
    k = bp.gather_kv(k_cache, page_list, int(kv_start[b]), int(seqlen_k[b]))
    v = bp.gather_kv(v_cache, page_list, int(kv_start[b]), int(seqlen_k[b]))
    return q[q0:q1][None], k[None], v[None]


def ramp_keys(k_cache, sglang, seq_k, ramp):
    """Key j of each sequence times 1 + ramp j: its scores grow along the keys."""
    page_size = k_cache.shape[1]
    for b, s in enumerate(seq_k):
        j = torch.arange(s)
        pages, slots = page_list(sglang, b)[j // page_size].long(), j % page_size
        k_cache[pages, slots] = (k_cache[pages, slots].float() * (1 + ramp * j)[:, None, None]).to(k_cache.dtype)


def tile_growth(q, k_cache, qo_indptr, table, scale_log2):
    """Largest rise (log2 units) of a row's running score max from one 64-key tile to the
    next, over every sequence (non-causal)."""
    page_list_, kv_start, seqlen_k = table
    rise = 0.0
    for b in range(len(seqlen_k)):
        q0, q1, sk = int(qo_indptr[b]), int(qo_indptr[b + 1]), int(seqlen_k[b])
        if q0 == q1 or sk <= bp.KV_TILE:
            continue
        k = bp.gather_kv(k_cache, page_list_, int(kv_start[b]), sk).double()
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        s = torch.einsum("qhd,khd->hqk", q[q0:q1].double(), k) * scale_log2
        running = torch.stack([t.amax(-1) for t in s.split(bp.KV_TILE, dim=-1)]).cummax(0).values
        rise = max(rise, (running[1:] - running[:-1]).max().item())
    return rise


def check(seq_q, seq_k, page_size, heads_q, heads_k, dtype, causal, seed=0, both_tables=True, block_scales=False,
          ramp=0.0):
    q, k_cache, v_cache, qo_indptr, sglang, vllm = make_problem(seq_q, seq_k, page_size, heads_q, heads_k, dtype,
                                                                seed)
    fp8 = dtype == bp.FP8
    descales = (0.37, 1.9, 0.61) if fp8 else (1.0, 1.0, 1.0)
    if ramp:                                                        # (the inputs do what they claim)
        ramp_keys(k_cache, sglang, seq_k, ramp)
        table = bp.normalise(len(seq_q), page_size, k_cache.shape[0], **sglang)
        c = descales[0] * descales[1] * bp.LOG2E / D**0.5
        assert not causal and tile_growth(q, k_cache, qo_indptr, table, c) > 8, "no lazy rescale"

    scales = dict(zip(("q_descale", "k_descale", "v_descale"), (torch.tensor([d]) for d in descales))) if fp8 else {}
    kv_block = None
    if block_scales:
        kv_block = block_descales(k_cache.shape[0], heads_k, sglang, seed + 1)
        if page_size < bp.BLOCK_SCALE_MIN_PAGE and max(seq_k) > page_size:     # (the inputs do what they claim)
            keys = [page_list(sglang, b)[torch.arange(seq_k[b]) // page_size].long() for b in range(len(seq_k))]
            assert max(bp.tile_v_ratio(kv_block[pages, :, 1]).max().item() for pages in keys if len(pages)) >= 2**9
        descales = (descales[0], 1.0, 1.0)
        scales = dict(q_descale=scales["q_descale"], kv_block_descale=kv_block)
    out = torch.full(q.shape, float("nan"), dtype=bp.out_dtype(dtype))
    o, lse = gfxasm.batch_prefill(q, k_cache, v_cache, qo_indptr, **sglang, causal=causal, out=out,
                                  return_lse=True, **scales)
    assert o is out and lse.shape == (heads_q, q.shape[0])
    table = bp.normalise(len(seq_q), page_size, k_cache.shape[0], **sglang)
    o_ref, lse_ref, bound = bp.reference(q, k_cache, v_cache, qo_indptr, *table, causal=causal, descales=descales,
                                         kv_block_descale=kv_block, p_bound=True)
    assert not torch.isnan(o).any(), f"{int(torch.isnan(o).sum())} O elements NaN (unwritten or a poisoned slot read)"
    assert not torch.isnan(lse).any(), "NaN in LSE"
    if fp8:
        v_scale = descales[2] * (kv_block[..., 1].max().item() if block_scales else 1.0)
        check_fp8(o, lse, o_ref, lse_ref, bound, v_scale * v_cache.float().nan_to_num(0.0).abs().max().item())
    else:
        check_sequences(q, k_cache, v_cache, qo_indptr, table, o, lse, o_ref, lse_ref, seq_q, seq_k, causal)
    if both_tables:
        o2 = gfxasm.batch_prefill(q, k_cache, v_cache, qo_indptr, **vllm, causal=causal, **scales)
        assert torch.equal(o2.view(torch.int16), o.view(torch.int16)), "vLLM and SGLang tables differ"


def check_fp8(o, lse, o_ref, lse_ref, bound, v_max):
    tol = bound + 2.0**-8 * o_ref.abs() + 2.0**-16 * v_max
    excess = (o.double() - o_ref).abs() - tol
    assert excess.max() <= 0, f"|O - O_ref| exceeds the FP8 bound by {excess.max().item():.3g}"
    lse_err = fmha.max_error(lse.double(), lse_ref)
    finite = lse_ref[torch.isfinite(lse_ref)]
    lse_tol = 2.0**-14 * (1 + (finite.abs().max().item() if finite.numel() else 0.0))
    assert lse_err <= lse_tol, f"max|LSE - LSE_ref| = {lse_err:.3g} > {lse_tol:.3g}"


def check_sequences(q, k_cache, v_cache, qo_indptr, table, o, lse, o_ref, lse_ref, seq_q, seq_k, causal):
    for b in range(len(seq_q)):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        if q0 == q1:
            continue
        if seq_k[b] == 0:
            assert (o[q0:q1] == 0).all() and (lse[:, q0:q1] == float("-inf")).all()
            continue
        qd, kd, vd = dense(q, k_cache, v_cache, qo_indptr, table, b)
        o_tol, lse_tol = fmha.tolerances(qd, kd, vd, o_ref[q0:q1][None].float(),
                                         lse_ref[:, q0:q1][None].float(), causal=causal)
        o_err = fmha.max_error(o[q0:q1].double(), o_ref[q0:q1])
        lse_err = fmha.max_error(lse[:, q0:q1].double(), lse_ref[:, q0:q1])
        assert o_err <= o_tol, f"sequence {b}: max|O - O_ref| = {o_err:.3g} > {o_tol:.3g}"
        assert lse_err <= lse_tol, f"sequence {b}: max|LSE - LSE_ref| = {lse_err:.3g} > {lse_tol:.3g}"


# (seq_q, seq_k) per sequence: ragged, keys a prefix longer, empty sequences
RAGGED_Q = [1, 17, 255, 0, 257, 3]
RAGGED_K = [1, 80, 300, 40, 257, 0]


@pytest.mark.parametrize("page_size, causal, heads, dtype", [
    (1, True, (2, 1), torch.bfloat16),
    (16, False, (2, 2), torch.float16),
    (64, True, (8, 1), torch.bfloat16),
    (1024, False, (2, 1), torch.bfloat16),
])
def test_ragged_paged(page_size, causal, heads, dtype):
    check(RAGGED_Q, RAGGED_K, page_size, *heads, dtype, causal, seed=page_size)


@pytest.mark.parametrize("page_size, causal, heads", [(1, True, (8, 1)), (16, False, (2, 1)), (64, True, (2, 2))])
def test_fp8_ragged_paged(page_size, causal, heads):
    check(RAGGED_Q, RAGGED_K, page_size, *heads, bp.FP8, causal, seed=11 + page_size)


@pytest.mark.parametrize("dtype, page_size, block_scales", [(torch.bfloat16, 16, False), (bp.FP8, 16, False),
                                                            (bp.FP8, 64, True), (bp.FP8, 4, True)])
def test_adversarial_schedules(dtype, page_size, block_scales):
    # waves interleaved and loads landing late (legal orders): every output bit as lockstep's
    q, k, v, qo, sglang, _ = make_problem([17, 70, 3], [40, 130, 0], page_size, 2, 1, dtype, 3)
    scales = dict(k_descale=torch.tensor([0.5])) if dtype == bp.FP8 else {}
    if block_scales:
        scales = dict(kv_block_descale=torch.rand(k.shape[0], 1, 2, generator=torch.Generator().manual_seed(4)) + 0.5)

    def run():
        return gfxasm.batch_prefill(q, k, v, qo, **sglang, **scales, causal=True, return_lse=True)
    assert adversarial.check(run, seeds=range(2)) == []


@pytest.mark.parametrize("page_size, causal, heads", [(64, True, (8, 1)), (1024, False, (2, 2))])
def test_fp8_block_scales(page_size, causal, heads):
    # kv_block_descale: a (k, v) scale per page and KV head, non-uniform; O is carried in the
    # current page's v units and rescaled at page changes (every tile at page size 64)
    check(RAGGED_Q, RAGGED_K, page_size, *heads, bp.FP8, causal, seed=23 + page_size, block_scales=True)


@pytest.mark.parametrize("page_size, causal, heads", [(1, True, (8, 1)), (2, False, (2, 2)), (4, True, (2, 1)),
                                                      (16, False, (8, 1)), (32, True, (2, 2))])
def test_fp8_block_scales_small_pages(page_size, causal, heads):
    # below page 64 (the _blks variants): a k scale per key on S, a v scale per key on P relative
    # to the tile's largest (2^9 and more above the smallest: block_descales), both tables
    check(RAGGED_Q, RAGGED_K, page_size, *heads, bp.FP8, causal, seed=31 + page_size, block_scales=True)


@pytest.mark.parametrize("dtype", [bp.FP8, torch.bfloat16])
def test_lazy_rescale(dtype):
    # keys growing along the sequence: a row's running max rises by more than the lazy
    # threshold (8 in log2 units) between tiles, so the out-of-line rescale of S, m, l and O
    # runs (FP8: from the lane halves' maxima, combined only there)
    check([40, 1, 130], [300, 260, 90], 16, 2, 1, dtype, False, seed=41, ramp=1 / 32)


@pytest.mark.parametrize("seq_q, reads", [([100, 156], 0), ([257, 3], 1)])
def test_query_tiles_read_from_qo_indptr_only_past_one_tile(monkeypatch, seq_q, reads):
    # The grid's x is cdiv(max seqlen_q, 256). Up to 256 queries in all it is 1 from q's
    # shape alone (no read: on a GPU no synchronisation); past that max seqlen_q is read, and
    # a sequence longer than one tile gets every row computed
    real, counted = bp.max_seq_q, []
    monkeypatch.setattr(bp, "max_seq_q", lambda qo_indptr: counted.append(1) or real(qo_indptr))
    bp.BATCH_PREFILL.clear_cache()
    check(seq_q, [70, 130], 16, 2, 1, torch.bfloat16, True, seed=3, both_tables=False)
    assert len(counted) == reads


def test_causal_more_queries_than_keys():
    # seqlen_q > seqlen_k: the first queries see no key (O = 0, LSE = -inf); 256 exactly one Q tile
    check([256, 20], [100, 7], 16, 2, 1, torch.bfloat16, True, seed=5, both_tables=False)


FULL_KINDS = [(dtype, page_size) for dtype in (torch.bfloat16, torch.float16, bp.FP8, "fp8 block scales")
              for page_size in (1, 2, 16, 64, 128, 1024)]


@pytest.mark.full
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype, page_size", FULL_KINDS)
@pytest.mark.parametrize("heads", [(1, 1), (8, 1), (8, 8), (16, 4)])
def test_full_cross_product(page_size, causal, dtype, heads):
    block_scales = dtype == "fp8 block scales"
    check([1, 17, 255, 256, 257, 0, 600], [1, 300, 255, 700, 257, 9, 600], page_size, *heads,
          bp.FP8 if block_scales else dtype, causal, seed=page_size + 7 * causal, block_scales=block_scales)


# ------------------------------------------------------------------ bad input

def _base(page_size=16):
    q, k, v, qo, sglang, vllm = make_problem([5, 9], [20, 33], page_size, 2, 1, torch.bfloat16, 0)
    return q, k, v, qo, sglang, vllm


def _call(**change):
    q, k, v, qo, sglang, vllm = _base()
    args = dict(q=q, k_cache=k, v_cache=v, qo_indptr=qo, **sglang)
    args.update(change)
    return gfxasm.batch_prefill(**args)


@pytest.mark.parametrize("change, error, words", [
    (dict(q=torch.zeros(14, 2, 96, dtype=torch.bfloat16)), ValueError, "'q' head dim must be 64 or 128, got 96"),
    (dict(q=torch.zeros(14, 2, 64, dtype=torch.bfloat16)), ValueError, r"'k_cache' head dim must equal q's \(64\)"),
    (dict(q=torch.zeros(14, 2, 128)), TypeError, "'q' dtype"),
    (dict(k_cache=torch.zeros(5, 16, 1, 128, dtype=torch.float16)), TypeError, "'k_cache' dtype"),
    (dict(k_cache=torch.zeros(5, 12, 1, 128, dtype=torch.bfloat16),
          v_cache=torch.zeros(5, 12, 1, 128, dtype=torch.bfloat16)), ValueError, "power of two"),
    (dict(q=torch.zeros(14, 3, 128, dtype=torch.bfloat16), k_cache=torch.zeros(8, 16, 2, 128, dtype=torch.bfloat16),
          v_cache=torch.zeros(8, 16, 2, 128, dtype=torch.bfloat16)), ValueError, "multiple"),
    (dict(qo_indptr=torch.tensor([0, 9, 5], dtype=torch.int32)), ValueError, "qo_indptr"),
    (dict(qo_indptr=torch.tensor([0, 5, 13], dtype=torch.int32)), ValueError, "total_q"),
    (dict(qo_indptr=torch.tensor([0], dtype=torch.int32), kv_indptr=torch.tensor([0], dtype=torch.int32),
          kv_last_page_len=torch.zeros(0, dtype=torch.int32)), ValueError, "total_q"),      # no sequence, 14 rows
    (dict(qo_indptr=torch.tensor([0, 5, 14])), TypeError, "'qo_indptr' dtype"),
    (dict(kv_indptr=torch.tensor([0, 3, 2], dtype=torch.int32)), ValueError, "kv_indptr"),
    (dict(kv_indptr=torch.tensor([0, 2, 9], dtype=torch.int32)), ValueError, "kv_indptr"),
    (dict(kv_last_page_len=torch.tensor([0, 1], dtype=torch.int32)), ValueError, "kv_last_page_len"),
    (dict(kv_last_page_len=torch.tensor([17, 1], dtype=torch.int32)), ValueError, "kv_last_page_len"),
    (dict(kv_page_indices=torch.tensor([0, 1, 99, 2, 3], dtype=torch.int32)), ValueError, "page ids"),
    (dict(kv_last_page_len=None), ValueError, "needs all"),
    (dict(block_table=torch.zeros(2, 4, dtype=torch.int32), seqlens_k=torch.tensor([1, 1], dtype=torch.int32)),
     ValueError, "not both"),
    (dict(kv_indptr=None, kv_page_indices=None, kv_last_page_len=None), ValueError, "page table is required"),
    (dict(causal=1), TypeError, "'causal'"),
    (dict(softmax_scale=float("inf")), ValueError, "softmax_scale"),
    (dict(q_descale=torch.tensor([1.0])), ValueError, "float8_e4m3fn inputs only"),
    (dict(kv_block_descale=torch.ones(8, 1, 2), k_descale=torch.tensor([1.0])), ValueError, "not both"),
])
def test_bad_input(change, error, words):
    with pytest.raises(error, match=words):
        _call(**change)


@pytest.mark.parametrize("seqlens, error", [([20, 80], "seqlens_k"), ([-1, 3], "seqlens_k")])
def test_bad_vllm_table(seqlens, error):
    q, k, v, qo, _, vllm = _base()
    with pytest.raises(ValueError, match=error):
        gfxasm.batch_prefill(q, k, v, qo, block_table=vllm["block_table"],
                             seqlens_k=torch.tensor(seqlens, dtype=torch.int32))


def _fp8_base():
    q, k, v, qo, sglang, _ = make_problem([5, 9], [20, 33], 16, 2, 1, bp.FP8, 0)
    return q, k, v, qo, sglang


@pytest.mark.parametrize("change, error, words", [
    (dict(out=torch.zeros(14, 2, 128, dtype=torch.float16)), TypeError, "'out' dtype must be torch.bfloat16"),
    (dict(k_descale=torch.tensor([1.0], dtype=torch.float64)), ValueError, "'k_descale' must be a float32"),
    (dict(v_descale=torch.ones(2)), ValueError, "'v_descale' must be a float32"),
    (dict(q_descale=0.5), TypeError, "'q_descale'"),
    (dict(k_descale=torch.tensor([-1.0])), ValueError, "'k_descale' must be finite and > 0"),
    # issue 26 crash 6: descales that make the kernel's rows NaN (c = q k scale and 8 / c in f32)
    (dict(q_descale=torch.tensor([-0.0])), ValueError, "'q_descale' must be finite and > 0"),
    (dict(q_descale=torch.tensor([1e-45])), ValueError, "'q_descale' must be finite and > 0"),
    (dict(k_descale=torch.tensor([float("inf")])), ValueError, "'k_descale' must be finite and > 0"),
    (dict(v_descale=torch.tensor([float("nan")])), ValueError, "'v_descale' must be finite and > 0"),
    (dict(v_descale=torch.tensor([2.0**63])), ValueError, "'v_descale' must be finite and > 0, within 2\\^-62"),
    (dict(softmax_scale=-0.1), ValueError, "'softmax_scale' must be >= 0"),
    # c = softmax_scale log2(e) q_descale k_descale in f32 (the kernel divides by it): 0 or inf -> NaN rows
    (dict(softmax_scale=0.0), ValueError, "'softmax_scale' \\* log2\\(e\\) \\* q_descale \\* k_descale must be"),
    (dict(softmax_scale=1e-30, q_descale=torch.tensor([2.0**-62]), k_descale=torch.tensor([2.0**62])), ValueError,
     "'softmax_scale' \\* log2"),                               # (q_descale times scale underflows first)
    (dict(softmax_scale=1e30, q_descale=torch.tensor([2.0**62]), k_descale=torch.tensor([2.0**62])), ValueError,
     "'softmax_scale' \\* log2"),
    # c times the largest K block scale must stay below 2^103 (a raw e4m3 score reaches 2^25, the
    # scaled one must fit f32): one page's K scale of 2^62 with q_descale 2^62 is refused
    (dict(q_descale=torch.tensor([2.0**62]), kv_block_descale=torch.ones(8, 1, 2).index_fill_(0, torch.tensor([3]),
                                                                                          2.0**62)),
     ValueError, r"the largest K kv_block_descale\) must stay below 2\^103"),
    (dict(kv_block_descale=torch.zeros(8, 1, 2)), ValueError, "'kv_block_descale' must be finite and > 0"),
    (dict(kv_block_descale=torch.ones(8, 2, 2)), ValueError, "kv_block_descale' must be a contiguous float32"),
    (dict(k_cache=torch.zeros(8, 16, 1, 128, dtype=torch.bfloat16)), TypeError, "'k_cache' dtype"),
])
def test_fp8_bad_input(change, error, words):
    q, k, v, qo, sglang = _fp8_base()
    args = dict(q=q, k_cache=k, v_cache=v, qo_indptr=qo, **sglang)
    args.update(change)
    with pytest.raises(error, match=words):
        gfxasm.batch_prefill(**args)


@pytest.mark.parametrize("softmax_scale, descales", [(None, (2.0**-62, 2.0**62, 2.0**-62)), (1e-40, (1.0, 1.0, 1.0))])
def test_fp8_extreme_legal_scales(softmax_scale, descales):
    # the ends of the descale range, and a c = softmax_scale log2(e) q_descale k_descale that is
    # an f32 subnormal: accepted, and the answer the reference gives
    q, k, v, qo, sglang = _fp8_base()
    scales = dict(zip(("q_descale", "k_descale", "v_descale"), (torch.tensor([d]) for d in descales)))
    out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16)
    o, lse = gfxasm.batch_prefill(q, k, v, qo, **sglang, causal=True, softmax_scale=softmax_scale, **scales, out=out,
                                  return_lse=True)
    table = bp.normalise(2, 16, k.shape[0], **sglang)
    o_ref, lse_ref, bound = bp.reference(q, k, v, qo, *table, causal=True, softmax_scale=softmax_scale,
                                         descales=descales, p_bound=True)
    check_fp8(o, lse, o_ref, lse_ref, bound, descales[2] * v.float().nan_to_num(0.0).abs().max().item())


def test_block_scales_judged_on_referenced_pages_only():
    # issue 22: an engine's pool holds whatever was there before; the launch reads the scales of
    # the pages the tables name only, so a NaN or 0 scale on any other page is accepted (and
    # harmless: O matches the reference), while one on a page a sequence uses is refused
    q, k, v, qo, sglang, vllm = make_problem([5, 9], [20, 33], 16, 2, 1, bp.FP8, 9)
    kv_block = block_descales(k.shape[0], 1, sglang, 10)
    used = sglang["kv_page_indices"].long()
    unused = torch.ones(k.shape[0], dtype=torch.bool)
    unused[used] = False
    assert unused.sum() == 3                                                # (make_problem's spare pages)
    kv_block[unused] = torch.tensor([float("nan"), 0.0])
    table = bp.normalise(2, 16, k.shape[0], **sglang)
    o_ref, lse_ref, bound = bp.reference(q, k, v, qo, *table, kv_block_descale=kv_block, p_bound=True)
    v_max = kv_block[used, :, 1].max().item() * v.float().nan_to_num(0.0).abs().max().item()
    for tables in (sglang, vllm):
        out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16)
        o, lse = gfxasm.batch_prefill(q, k, v, qo, **tables, kv_block_descale=kv_block, out=out, return_lse=True)
        check_fp8(o, lse, o_ref, lse_ref, bound, v_max)
    kv_block[used[-1], 0, 1] = float("nan")
    with pytest.raises(ValueError, match="'kv_block_descale' must be finite and > 0"):
        gfxasm.batch_prefill(q, k, v, qo, **sglang, kv_block_descale=kv_block)


@pytest.mark.parametrize("causal", [False, True])
def test_nan_key_gives_nan_rows(causal):
    # issue 26 crash 6: an e4m3 NaN code in K is legal input whose answer is NaN: exactly the
    # rows that see that key get NaN O and LSE (IEEE; the float64 reference likewise), every
    # other row, causally masked ones included, its value within the FP8 bound
    q, k, v, qo, sglang, _ = make_problem([17, 70, 5], [40, 130, 9], 16, 4, 2, bp.FP8, 7)
    key = 100                                                               # of sequence 1, KV head 1
    k.view(torch.uint8)[page_list(sglang, 1)[key // 16], key % 16, 1, 5] = 0x7F
    out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16)
    o, lse = gfxasm.batch_prefill(q, k, v, qo, **sglang, causal=causal, out=out, return_lse=True)
    table = bp.normalise(3, 16, k.shape[0], **sglang)
    o_ref, lse_ref, bound = bp.reference(q, k, v, qo, *table, causal=causal, p_bound=True)
    sees = torch.isnan(o_ref).all(-1)                                       # [total_q, Hq]
    first = key - (130 - 70) if causal else 0                              # sequence 1's first query seeing it
    assert sees.sum() == 2 * (70 - first) and sees[17 + first:17 + 70, 2:].all()   # (the input does what it claims)
    assert torch.equal(torch.isnan(o).any(-1), sees) and torch.isnan(o[sees]).all()
    assert torch.equal(torch.isnan(lse), sees.t()) and torch.equal(torch.isnan(lse_ref), sees.t())
    rows = ~sees[..., None]
    check_fp8(o.where(rows, 0), lse.where(~sees.t(), 0), o_ref.where(rows, 0), lse_ref.where(~sees.t(), 0),
              bound.where(rows, 0), v.float().nan_to_num(0.0).abs().max().item())


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("kind", [torch.bfloat16, torch.float16, bp.FP8, "fp8 block scales"])
def test_padding_keys_weigh_zero(kind, page_size):
    # issue 26 (fuzzing): the keys past seqlen_k in the last 64-key tile re-read the sequence's
    # last key row (the clamped gather) with P = 0, so a non-finite V there gave 0 * inf = NaN;
    # they must read V = 0. seqlen_k 2, 65, 130 (none a multiple of 64); the last key's V holds
    # +inf, -inf and NaN (FP8: the e4m3 NaN codes 0x7F, 0xFF) in three columns. Not causal:
    # every row sees that key with P > 0, so those columns are exactly +inf, -inf, NaN, and
    # every other column and LSE are bit for bit those of the same call without them (a
    # column of O is P times that column of V), which is within the float64 reference's bound.
    dtype = bp.FP8 if kind == "fp8 block scales" else kind
    seq_q, seq_k = [3, 5, 2], [2, 65, 130]
    q, k, v, qo, sglang, vllm = make_problem(seq_q, seq_k, page_size, 2, 1, dtype, 50 + page_size)
    scales = dict(kv_block_descale=block_descales(k.shape[0], 1, sglang, 51)) if kind == "fp8 block scales" else {}
    table = bp.normalise(3, page_size, k.shape[0], **sglang)

    def run(v_cache, tables):
        out = torch.full(q.shape, float("nan"), dtype=bp.out_dtype(dtype))
        o, lse = gfxasm.batch_prefill(q, k, v_cache, qo, **tables, out=out, return_lse=True, **scales)
        assert o is out
        return o, lse

    o, lse = run(v, sglang)
    o_ref, lse_ref, bound = bp.reference(q, k, v, qo, *table, kv_block_descale=scales.get("kv_block_descale"),
                                         p_bound=True)
    if dtype == bp.FP8:
        v_scale = scales["kv_block_descale"][..., 1].max().item() if scales else 1.0
        check_fp8(o, lse, o_ref, lse_ref, bound, v_scale * v.float().nan_to_num(0.0).abs().max().item())
    else:
        check_sequences(q, k, v, qo, table, o, lse, o_ref, lse_ref, seq_q, seq_k, False)
    poisoned = v.clone()
    columns, nan_columns = ([9, 13], [9, 13]) if dtype == bp.FP8 else ([5, 9, 13], [13])
    for b, s in enumerate(seq_k):
        page, slot = page_list(sglang, b)[(s - 1) // page_size], (s - 1) % page_size
        if dtype == bp.FP8:
            poisoned.view(torch.uint8)[page, slot, 0, columns] = torch.tensor([0x7F, 0xFF], dtype=torch.uint8)
        else:
            poisoned[page, slot, 0, columns] = torch.tensor([float("inf"), float("-inf"), float("nan")], dtype=dtype)
    others = torch.ones(D, dtype=torch.bool)
    others[columns] = False
    for tables in (sglang, vllm):
        o2, lse2 = run(poisoned, tables)
        if dtype != bp.FP8:
            assert (o2[..., 5] == float("inf")).all() and (o2[..., 9] == float("-inf")).all()
        assert torch.isnan(o2[..., nan_columns]).all()
        assert not torch.isnan(o2[..., others]).any(), "NaN outside the poisoned columns"
        assert torch.equal(o2[..., others].view(torch.int16), o[..., others].view(torch.int16))
        assert torch.equal(lse2, lse)


@pytest.mark.parametrize("mode", ["meta", "fake"])
@pytest.mark.parametrize("change, error, words", [
    (dict(q=torch.zeros(14, 2, 96, dtype=torch.bfloat16)), ValueError, "'q' head dim"),
    (dict(k_cache=torch.zeros(5, 16, 1, 128, dtype=torch.float16)), TypeError, "'k_cache' dtype"),
    (dict(kv_indptr=torch.zeros(2, dtype=torch.int32)), ValueError, "'kv_indptr' must have 3 entries"),
    (dict(block_table=torch.zeros(2, 4, dtype=torch.int32), seqlens_k=torch.ones(2, dtype=torch.int32)),
     ValueError, "not both"),
    (dict(out=torch.zeros(14, 2, 128, dtype=torch.float16)), TypeError, "'out' dtype"),
])
def test_traced_call_refuses_bad_shapes(change, error, words, mode):
    # the fake kernels run the metadata checks (they once checked only q's rank, so a
    # torch.compile trace accepted these): meta tensors, and FakeTensorMode as a trace has
    q, k, v, qo, sglang, _ = _base()
    args = dict(q=q, k_cache=k, v_cache=v, qo_indptr=qo, **sglang)
    args.update(change)
    fake = FakeTensorMode()
    args = {n: t.to("meta") if mode == "meta" else fake.from_tensor(t) for n, t in args.items()}
    with fake if mode == "fake" else contextlib.nullcontext(), pytest.raises(error, match=words):
        gfxasm.batch_prefill(**args)


@pytest.mark.parametrize("name", ["qo_indptr", "kv_page_indices", "block_table", "out"])
def test_index_tensor_on_another_device_refused(name):
    # issue 26 item 2: qo_indptr on "meta", the rest on the CPU, returned an uninitialised
    # tensor (the fake ran and checked nothing); every tensor of a call must be on q's device
    q, k, v, qo, sglang, vllm = _base()
    args = dict(q=q, k_cache=k, v_cache=v, qo_indptr=qo, **(vllm if name == "block_table" else sglang),
                out=torch.empty_like(q))
    args[name] = args[name].to("meta")
    with pytest.raises(ValueError, match=f"'{name}' must be on q's device \\(cpu\\), got meta"):
        gfxasm.batch_prefill(**args)


def test_out_overlapping_input_refused():
    q, k, v, qo, sglang, _ = _base()
    with pytest.raises(ValueError, match="overlaps"):
        gfxasm.batch_prefill(q, k, v, qo, **sglang, out=q)


def test_torch_op_functional_equals_out():
    q, k, v, qo, sglang, _ = _base()
    tables = (sglang["kv_indptr"], sglang["kv_page_indices"], sglang["kv_last_page_len"], None, None)
    o, lse = torch.ops.gfxasm.batch_prefill_with_lse(q, k, v, qo, *tables, True, None, *NO_FEATURES, None, None, None,
                                                     None)
    out = torch.full_like(q, float("nan"))
    lse2 = torch.full_like(lse, float("nan"))
    torch.ops.gfxasm.batch_prefill_out(q, k, v, qo, *tables, out, lse2, True, None, *NO_FEATURES, None, None, None,
                                       None)
    assert torch.equal(o.view(torch.int16), out.view(torch.int16)) and torch.equal(lse, lse2)
    with torch.device("meta"):
        mo, ml = torch.ops.gfxasm.batch_prefill_with_lse(q.to("meta"), k.to("meta"), v.to("meta"), qo.to("meta"),
                                                         *(t.to("meta") if t is not None else None for t in tables),
                                                         True, None, *NO_FEATURES, None, None, None, None)
    assert mo.shape == q.shape and ml.shape == (q.shape[1], q.shape[0])


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("which", ["k", "v"])
@pytest.mark.parametrize("e", [-62, -40, 20, 40, 62])
def test_fp8_block_scale_extremes(e, which, page_size):
    # fuzzing: a K block scale >= 2^40 gave NaN rows (0 and NaN before the -FLT_MAX floor): the
    # exp2 argument c k S - c m was one fma of two products rounded apart, so at scores of
    # ~2^40 log2 units its error alone overflowed exp2. Every block scale in SCALE_RANGE gives
    # the float64 reference's answer: K or V scales (powers of two, 2^e or 2^(e -+ 1) per page,
    # the other kind 0.5 .. 1), seqlen_k 1, 64, 65 (padding keys), poisoned outputs, both tables.
    seq_q, seq_k = [2, 3, 2], [1, 64, 65]
    q, k, v, qo, sglang, vllm = make_problem(seq_q, seq_k, page_size, 2, 1, bp.FP8, 60 + page_size)
    g = torch.Generator().manual_seed(e + 100)
    step = torch.arange(k.shape[0]) % 2 * (-1 if e > 0 else 1)
    kv_block = torch.stack([torch.rand(k.shape[0], generator=g) * 0.5 + 0.5] * 2, dim=-1)[:, None, :].contiguous()
    kv_block[:, 0, 0 if which == "k" else 1] = torch.exp2((e + step).float())
    table = bp.normalise(3, page_size, k.shape[0], **sglang)
    o_ref, lse_ref, bound = bp.reference(q, k, v, qo, *table, kv_block_descale=kv_block, p_bound=True)
    assert torch.isfinite(o_ref).all() and torch.isfinite(lse_ref).all()
    v_max = kv_block[..., 1].max().item() * v.float().nan_to_num(0.0).abs().max().item()
    for tables in (sglang, vllm):
        out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16)
        o, lse = gfxasm.batch_prefill(q, k, v, qo, **tables, kv_block_descale=kv_block, out=out, return_lse=True)
        assert o is out
        check_fp8(o, lse, o_ref, lse_ref, bound, v_max)


def test_repeated_layout_reads_each_calls_data():
    # The plan is kept per tensor layout and max seqlen_q (issue 21 item 5): calls of one
    # layout with other contents (qo_indptr, page tables, K/V; max seqlen_q 7, 12, 7) must each
    # bind their own tables and grid, and a later call's bad data must still be refused.
    bp.BATCH_PREFILL.clear_cache()
    for seq_q, seq_k, seed, kind in (([7, 7], [20, 33], 1, "sglang"), ([2, 12], [33, 20], 2, "vllm"),
                                     ([7, 7], [33, 20], 3, "sglang")):
        q, k, v, qo, sglang, vllm = make_problem(seq_q, seq_k, 16, 2, 1, torch.bfloat16, seed)
        out = torch.full(q.shape, float("nan"), dtype=q.dtype)
        o, lse = gfxasm.batch_prefill(q, k, v, qo, **(sglang if kind == "sglang" else vllm), causal=True, out=out,
                                      return_lse=True)
        table = bp.normalise(2, 16, k.shape[0], **sglang)
        o_ref, lse_ref = bp.reference(q, k, v, qo, *table, causal=True)
        check_sequences(q, k, v, qo, table, o, lse, o_ref, lse_ref, seq_q, seq_k, True)
    assert len(bp.BATCH_PREFILL._cache) == 2             # the two layouts (return_lse and out given: one each)
    bad = sglang["kv_page_indices"].clone()
    bad[3] = k.shape[0]
    with pytest.raises(ValueError, match="page ids outside the pool"):
        gfxasm.batch_prefill(q, k, v, qo, **dict(sglang, kv_page_indices=bad), causal=True, out=out, return_lse=True)
    with pytest.raises(ValueError, match="'qo_indptr' must start at 0"):
        gfxasm.batch_prefill(q, k, v, torch.tensor([0, 9, 5], dtype=torch.int32), **sglang, causal=True, out=out,
                             return_lse=True)


def counting(monkeypatch, module, names) -> collections.Counter:
    """Calls of `module`'s functions `names` (each still runs), counted by name."""
    counts = collections.Counter()
    for name in names:
        def counted(*args, _real=getattr(module, name), _name=name, **kwargs):
            counts[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(module, name, counted)
    return counts


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_metadata_checked_once_per_layout_contents_every_call(kind, monkeypatch):
    # Host cost (issue 21 item 5): a layout's metadata checks (q and the caches, the page
    # table's tensors) run on its first call only, once; the table's contents are read on
    # every call, once (the launch stubbed: the host path alone), and max seqlen_q not at
    # all at these few queries (test_query_tiles_read_from_qo_indptr_only_past_one_tile)
    monkeypatch.setattr(launcher.emu_backend, "launch", lambda *args: None)
    counts = counting(monkeypatch, bp, ("_check_attention", "_check_table", "_table_contents", "max_seq_q"))
    bp.BATCH_PREFILL.clear_cache()
    q, k, v, qo, sglang, vllm = _base()
    out = torch.empty_like(q)
    for _ in range(3):
        gfxasm.batch_prefill(q, k, v, qo, **(sglang if kind == "sglang" else vllm), out=out)
    assert counts == {"_check_attention": 1, "_check_table": 1, "_table_contents": 3}


def test_one_query_into_an_out_with_a_zero_stride_token_dim():
    # One token ([1, Hq, D]) written into a view whose token dim has stride 0:
    # torch leaves a size-1 dim's stride arbitrary, and the kernel drops the padding rows of a
    # tile by a buffer range of (rows - 1) x seq stride + one row, so a seq stride of 0 would put
    # all 255 padding rows on row 0. The seq stride of a dim of one is one row (kernels.yaml
    # strides: filled by the launcher but for such dims: fmha.unstepped_strides).
    q, k, v, _, _, vllm = make_problem([1], [40], 16, 4, 2, torch.bfloat16, 5)
    qo = torch.tensor([0, 1], dtype=torch.int32)
    expected = gfxasm.batch_prefill(q, k, v, qo, **vllm, causal=True)
    out = torch.full((4, D), float("nan"), dtype=torch.bfloat16).as_strided((1, 4, D), (0, D, 1))
    assert out.stride(0) == 0
    gfxasm.batch_prefill(q, k, v, qo, **vllm, causal=True, out=out)
    assert torch.equal(out.view(torch.int16), expected.view(torch.int16))
