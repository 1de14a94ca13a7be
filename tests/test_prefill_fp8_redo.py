"""The per-tensor FP8 prefill's post-hoc lazy test and its redo (asm/include/fmha_fp8.inc,
posthoc_test and rare_redo) on the strict gfx950 emulator against the float64 reference.

The kernel forms P = exp2(c (S - m)) against a row's running m without the tile's max and
keeps the tile when every lane's sum of P is <= 2^8; otherwise (and for NaN) it forms S(j)
again from Q and K(j) in LDS, rescales O, l, m and S(j+1), and forms P(j) once more. Inputs
here make the redo run several times per row: keys scaled by 1 + ramp j, so a row's largest
score grows along the keys. A tile whose largest visible score exceeds every earlier one of
the row by more than 8 (log2 units) must take the redo, whatever the row's lazy history (m
never exceeds the row's running max, so one of its P is above 2^8); redo_tiles counts those
tiles and the test asserts each row has several (the inputs do what they claim). Tolerances:
test_batch_prefill's FP8 bound (check_fp8). The NaN case is test_batch_prefill's
test_nan_key_gives_nan_rows (a NaN key past the rows' first tile: the NaN sum fails the test).
"""
from __future__ import annotations

import pytest
import torch

import gfxasm
from gfxasm.ops import batch_prefill as bp

from test_batch_prefill import D, block_descales, check_fp8, make_problem, ramp_keys

DESCALES = (0.37, 1.9, 0.61)
LAZY_LOG2 = 8.0                     # the kernel's threshold: P <= 2^8


def redo_tiles(q, k_cache, qo_indptr, table, c, causal, kv_block=None):
    """Per sequence, [Hq, rows]: the tiles after a row's first visible one whose largest visible
    score (log2 units; kv_block: times each key's page's k scale) exceeds the row's running max
    of the earlier tiles by more than 8."""
    page_list, kv_start, seqlen_k = table
    counts = []
    for b in range(len(seqlen_k)):
        q0, q1, sk = int(qo_indptr[b]), int(qo_indptr[b + 1]), int(seqlen_k[b])
        if q0 == q1 or sk == 0:
            continue
        k = bp.gather_kv(k_cache, page_list, int(kv_start[b]), sk).double()
        if kv_block is not None:
            pages = page_list[int(kv_start[b]) + torch.arange(sk) // k_cache.shape[1]].long()
            k = k * kv_block[pages, :, 0, None].double()
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        s = torch.einsum("qhd,khd->hqk", q[q0:q1].double(), k) * c
        if causal:                                              # bottom-right aligned
            rows = torch.arange(q1 - q0)[:, None] + (sk - (q1 - q0))
            s = s.masked_fill(torch.arange(sk)[None, :] > rows, float("-inf"))
        tile_max = torch.stack([t.amax(-1) for t in s.split(bp.KV_TILE, dim=-1)])
        before = tile_max.cummax(0).values[:-1]
        counts.append(((tile_max[1:] - before > LAZY_LOG2) & (before > float("-inf"))).sum(0))
    return counts


@pytest.mark.parametrize("seq_q, seq_k, page_size, heads, causal, block, least", [
    ([40, 3], [640, 330], 16, (2, 1), False, False, 3),
    ([33], [700], 1, (8, 1), True, False, 4),          # the diagonal tile: the redo masks S(j) again
    ([33], [700], 64, (2, 1), True, True, 3),          # BLK: the redo scales S(j) by tile j's k scale again
])
def test_redo_several_times_per_row(seq_q, seq_k, page_size, heads, causal, block, least):
    q, k_cache, v_cache, qo_indptr, sglang, _ = make_problem(seq_q, seq_k, page_size, *heads, bp.FP8, seed=61)
    ramp_keys(k_cache, sglang, seq_k, 1 / 8)
    table = bp.normalise(len(seq_q), page_size, k_cache.shape[0], **sglang)
    descales = DESCALES
    scales = dict(zip(("q_descale", "k_descale", "v_descale"), (torch.tensor([d]) for d in DESCALES)))
    kv_block = None
    if block:                           # k scales 1 .. 1.25 (the ramp does the growing), v scales 2^9 apart
        kv_block = block_descales(k_cache.shape[0], heads[1], sglang, 62)
        kv_block[..., 0] = 1 + torch.rand(kv_block.shape[:2], generator=torch.Generator().manual_seed(63)) / 4
        descales = (DESCALES[0], 1.0, 1.0)
        scales = dict(q_descale=scales["q_descale"], kv_block_descale=kv_block)
    c = descales[0] * descales[1] * bp.LOG2E / D**0.5
    counts = redo_tiles(q, k_cache, qo_indptr, table, c, causal, kv_block)
    assert min(int(n.min()) for n in counts) >= least, "some row takes the redo fewer times than claimed"
    out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16)
    o, lse = gfxasm.batch_prefill(q, k_cache, v_cache, qo_indptr, **sglang, causal=causal, out=out,
                                  return_lse=True, **scales)
    o_ref, lse_ref, bound = bp.reference(q, k_cache, v_cache, qo_indptr, *table, causal=causal, descales=descales,
                                         kv_block_descale=kv_block, p_bound=True)
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    v_scale = descales[2] * (kv_block[..., 1].max().item() if block else 1.0)
    check_fp8(o, lse, o_ref, lse_ref, bound, v_scale * v_cache.float().nan_to_num(0.0).abs().max().item())
