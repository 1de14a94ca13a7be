"""The attention launches bench/fmha.py and bench/prefill.py model, built for gfxasm.perf
(code object variant, grid, packed kernarg, pointer buffers) and never run: dense
fmha_fwd_d128 in bf16, and paged batch_prefill_d128 over one sequence through an SGLang
page table. bench/causal_model.py takes either as a `Launch`.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import torch

from gfxasm import kernarg
from gfxasm.launcher import fill_strides
from gfxasm.ops import batch_prefill as bp
from gfxasm.ops import fmha

D = fmha.HEAD_DIM
# Every launch here is an object built from asm/fmha_fwd_d128.s: eight waves per workgroup,
# each workgroup one Q tile (batch_prefill's Q_TILE is fmha's).
BLOCK = (512, 1, 1)
Q_TILE = fmha.Q_TILE


@dataclass(frozen=True)
class Launch:
    """One attention kernel as bench/causal_model.py models it. parts(B, Hq, Hk, Sq, Sk, causal)
    gives (manifest variant, grid, kernarg bytes, pointer buffers); skip_mfma is passed to
    gfxasm.perf.estimate (True, its default: MFMAs are stubbed in the timing runs)."""
    parts: Callable[[int, int, int, int, int, bool], tuple]
    skip_mfma: bool = True


def flops(B, Hq, S, causal) -> float:
    """The problem's FLOPs at Sq = Sk = S: 4 B Hq S^2 D, causal counting only visible pairs."""
    pairs = S * (S + 1) / 2 if causal else S * S
    return 4.0 * B * Hq * pairs * D


def _packed(variant, args: dict, grid) -> tuple:
    """(variant, grid, kernarg bytes, pointer buffers) from the kernel's arguments by name,
    the byte strides the op leaves to the launcher filled as it fills them (fill_strides)."""
    args = fill_strides(variant, args)
    values = {a.name: args[a.name].data_ptr() if a.type.is_pointer else args[a.name] for a in variant.args}
    raw = kernarg.pack(variant.args, variant.kernarg_size, values)
    return variant, grid, raw, [args[a.name] for a in variant.args if a.type.is_pointer]


def dense_parts(B, Hq, Hk, Sq, Sk, causal, head_dim=D, window=(-1, -1), sinks=False, softcap=0.0) -> tuple:
    """fmha_fwd_d128 (head_dim 64: fmha_fwd_d64), bf16, on torch.empty buffers (untouched
    pages read as zeros); window (left, right) as the op passes it (causal: right 0), sinks zeros,
    softcap > 0: the soft-capped variant."""
    q = torch.empty(B, Sq, Hq, head_dim, dtype=torch.bfloat16)
    k = torch.empty(B, Sk, Hk, head_dim, dtype=torch.bfloat16)
    v = torch.empty(B, Sk, Hk, head_dim, dtype=torch.bfloat16)
    o = torch.empty(B, Sq, Hq, head_dim, dtype=torch.bfloat16)
    lse = torch.empty(B, Hq, Sq, dtype=torch.float32)
    if causal:
        window = (window[0], 0)                        # (causal means right = 0, as the op passes it)
    args = fmha.kernel_args(q, k, v, o, lse, 1.0 / math.sqrt(head_dim), torch.zeros(Hq) if sinks else None,
                            window, softcap)
    variant = fmha.variant(torch.bfloat16, causal, fmha.windowed(causal, window), softcap > 0, head_dim=head_dim)
    return _packed(variant, args, (math.ceil(Sq / Q_TILE), Hq, B))


def paged_parts(B, Hq, Hk, Sq, Sk, causal, dtype=torch.bfloat16, block_scales=False, page=None) -> tuple:
    """batch_prefill_d128 over one sequence, page size `page` (default 1; block scales: 1024,
    CK's configuration), page ids a seeded random permutation of the pool. Block scales below
    bp.BLOCK_SCALE_MIN_PAGE are random (0.5 .. 2, seeded) so that O is rescaled at every tile,
    as with real scales; at larger pages they are ones."""
    assert B == 1 and Sq == Sk
    g = torch.Generator().manual_seed(0)
    page = page or (1024 if block_scales else 1)
    pages = -(-Sk // page)
    q = torch.zeros(Sq, Hq, D, dtype=dtype)           # (zeros: an e4m3 NaN byte would stop the emulator)
    k = torch.zeros(pages, page, Hk, D, dtype=dtype)
    v = torch.zeros(pages, page, Hk, D, dtype=dtype)
    o = torch.empty(Sq, Hq, D, dtype=bp.out_dtype(dtype))
    lse = torch.empty(Hq, Sq, dtype=torch.float32)
    e = q.element_size()
    args = dict(q=q, k_cache=k, v_cache=v, o=o, lse=lse, qo_indptr=torch.tensor([0, Sq], dtype=torch.int32),
                kv_start=torch.zeros(1, dtype=torch.int32), seqlen_k=torch.tensor([Sk], dtype=torch.int32),
                page_list=torch.randperm(pages, generator=g).to(torch.int32), descales=torch.ones(3),
                kv_scales=(torch.rand(pages * Hk * 2, generator=g) * 1.5 + 0.5 if page < bp.BLOCK_SCALE_MIN_PAGE
                           else torch.ones(pages * Hk * 2)), heads_k=Hk, max_seq_q=Sq,
                q_seq_stride=q.stride(0) * e, q_head_stride=q.stride(1) * e, k_seq_stride=k.stride(1) * e,
                k_head_stride=k.stride(2) * e, v_seq_stride=v.stride(1) * e, v_head_stride=v.stride(2) * e,
                o_seq_stride=o.stride(0) * 2, o_head_stride=o.stride(1) * 2, lse_head_stride=lse.stride(0) * 4,
                page_shift=page.bit_length() - 1, page_stride_shift=page.bit_length() - 1, kv_head_magic=0 if Hq == Hk else -(-2**32 // (Hq // Hk)),
                store_lse=1, **fmha.score_args(1 / math.sqrt(D), 0.0), **fmha.sinks_args(None, q.device),
                **fmha.window_args((-1, -1)))
    variant = bp.variant(dtype, causal, block_scales, page)
    return _packed(variant, args, (math.ceil(Sq / Q_TILE), Hq, B))


DENSE_BF16 = Launch(dense_parts)


def paged(dtype, block_scales=False, page=None) -> Launch:
    """paged_parts at these settings. FP8 executes the MFMAs in the timing runs instead of
    stubbing them, so the scores are real: a stub leaves stale registers, whose NaN the
    emulator's e4m3 conversion of P refuses (its NaN byte is unverified), and whose values
    would steer the post-hoc lazy test (a tile formed again whenever its sums are not
    finite) where a real run would not."""
    return Launch(functools.partial(paged_parts, dtype=dtype, block_scales=block_scales, page=page),
                  skip_mfma=dtype != bp.FP8)
