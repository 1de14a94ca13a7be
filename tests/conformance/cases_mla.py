"""Launch recipe for aiter's MLA decode (DeepSeek latent attention), see cases.py.

Host code: aiter_meta/csrc/py_itfs_cu/asm_mla.cu, struct KernelArgs and
mla_decode_stage1_asm_fwd(), called by aiter/mla.py mla_decode_fwd() (not persistent:
num_kv_splits_indptr from get_meta_param). One latent KV head of 576 = 512 (the V part)
+ 64 (rope) per token, Q [tokens, 16 heads, 576]; paged KV [num_page, page_size, 1, 576]
with kv_indptr / kv_page_indices / kv_last_page_lens; 16 heads and one query token per
sequence select mla_a8w8_qh16_qseqlen1_gqaratio16.co for fp8 Q and KV. With one KV split
and fp8 Q, mla_decode_fwd hands the bf16 output itself to the kernel as splitData
(`logits = o.view(...)`, out_16_nosplit = 1) and returns it: no stage 2.
"""
from __future__ import annotations

import math

import torch

from .cases import Case, Kernarg, aiter_symbol, fp8_rowwise, poison

QK_DIM = 576           # kv_lora_rank 512 + rope 64
V_DIM = 512
HEADS = 16


def mla_decode_fp8(ctx_lens: list[int], page_size: int = 1, seed: int = 0) -> Case:
    if page_size & (page_size - 1) or page_size < 1:
        raise ValueError(f"page_size must be a power of two (s_log2_plen), got {page_size}")
    g = torch.Generator().manual_seed(seed)
    B = len(ctx_lens)
    pages = [math.ceil(n / page_size) for n in ctx_lens]
    num_page = sum(pages)
    q_f = torch.randn(B, HEADS, QK_DIM, generator=g)
    kv_f = torch.randn(num_page, page_size, 1, QK_DIM, generator=g)
    # Per-tensor scales, as aiter's test quantizes (scaled_fp8_quant: absmax / 448).
    q_scale = (q_f.abs().max() / 448).reshape(1)
    kv_scale = (kv_f.abs().max() / 448).reshape(1)
    q = (q_f / q_scale).to(torch.float8_e4m3fn)
    kv = (kv_f / kv_scale).to(torch.float8_e4m3fn)
    kv_indptr = torch.tensor([0] + pages, dtype=torch.int32).cumsum(0).to(torch.int32)
    kv_page_indices = torch.randperm(num_page, generator=g).to(torch.int32)
    last = torch.tensor([n - (p - 1) * page_size for n, p in zip(ctx_lens, pages)], dtype=torch.int32)
    qo_indptr = torch.arange(B + 1, dtype=torch.int32)
    kv_splits_indptr = torch.arange(B + 1, dtype=torch.int32)          # num_kv_splits = 1
    o = poison((B, HEADS, V_DIM), torch.bfloat16)
    lse = poison((B, 1, HEADS, 1), torch.float32)
    scale = 1.0 / math.sqrt(QK_DIM)

    qb, kvb = q.view(torch.uint8), kv.view(torch.uint8)
    ka = Kernarg(304)
    for off, t in ((0, o), (16, lse), (32, qb), (48, kvb), (64, kv_indptr), (80, kv_page_indices),
                   (96, last), (208, qo_indptr), (224, kv_splits_indptr), (240, o), (256, q_scale),
                   (272, kv_scale)):
        ka.ptr(off, t)
    ka.f32(112, scale)
    ka.u32(128, HEADS)                                 # s_MQA = gqa_ratio * max_seqlen_q
    ka.u32(144, 1)                                     # s_kv_split
    ka.u32(160, qb.stride(0))                          # s_Q_Bs = Q.stride(0) * itemsize * max_seqlen_q
    ka.u32(176, kvb.stride(0))                         # s_Bs: bytes per page
    ka.u32(192, int(math.log2(page_size)))
    ka.u32(288, 1)                                     # out_16_nosplit = kv_split

    def reference(pmap=lambda p: p):
        """float64 attention over the dequantized inputs, P mapped by `pmap` before P.V:
        (out [B, 16, 512], lse [B, 16])."""
        qd = q.double() * q_scale.double()
        kvd = (kv.double() * kv_scale.double()).view(num_page * page_size, QK_DIM)
        out, lses = torch.empty(B, HEADS, V_DIM, dtype=torch.float64), torch.empty(B, HEADS, dtype=torch.float64)
        for b, n in enumerate(ctx_lens):
            pg = kv_page_indices[kv_indptr[b]:kv_indptr[b + 1]].long()
            rows = (pg[:, None] * page_size + torch.arange(page_size)).reshape(-1)[:n]
            s = qd[b] @ kvd[rows].T * scale
            out[b] = pmap(s.softmax(-1)) @ kvd[rows, :V_DIM]
            lses[b] = s.logsumexp(-1)
        return out, lses

    def check():
        ref, _ = reference()
        assert not o.isnan().any(), "O not fully written"
        # The kernel multiplies P by V in FP8 (a8w8): allow twice the error of an FP8
        # evaluation (P rounded to e4m3 with a per-row scale), as for fp8 paged attention.
        tol = 2 * (reference(lambda p: fp8_rowwise(p.float()).double())[0] - ref).abs().max().item()
        err = (o.double() - ref).abs().max().item()
        assert err <= tol, f"O max error {err:.3g} > tolerance {tol:.3g}"

    name = "mla_a8w8_qh16_qseqlen1_gqaratio16"
    return Case(f"mla/{name}.co", aiter_symbol(name), (1, B, 1), (256, 1, 1), ka.bytes(),
                [qb, kvb, kv_indptr, kv_page_indices, last, qo_indptr, kv_splits_indptr, o, lse,
                 q_scale, kv_scale], check)

