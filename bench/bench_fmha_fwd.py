"""Our fmha_fwd_d128_bf16 on the shapes where aiter's FMHA has published MI355X results
(bench_conformance.py runs those), so `gfxasm bench` prints both side by side."""
from __future__ import annotations

import math

import torch

from bench.bench_conformance import FMHA_PUBLISHED
from bench.common import manifest_case


def fmha_case(B, Hq, Hk, S):
    D = 128
    q = torch.empty(B, S, Hq, D, dtype=torch.bfloat16)
    k = torch.empty(B, S, Hk, D, dtype=torch.bfloat16)
    v = torch.empty(B, S, Hk, D, dtype=torch.bfloat16)
    o = torch.empty(B, S, Hq, D, dtype=torch.bfloat16)
    lse = torch.empty(B, Hq, S, dtype=torch.float32)
    g = Hq // Hk
    args = dict(q=q, k=k, v=v, o=o, lse=lse, seq_q=S, seq_k=S,
                q_seq_stride=q.stride(1) * 2, q_head_stride=q.stride(2) * 2, q_batch_stride=q.stride(0) * 2,
                k_seq_stride=k.stride(1) * 2, k_head_stride=k.stride(2) * 2, k_batch_stride=k.stride(0) * 2,
                v_seq_stride=v.stride(1) * 2, v_head_stride=v.stride(2) * 2, v_batch_stride=v.stride(0) * 2,
                o_seq_stride=o.stride(1) * 2, o_head_stride=o.stride(2) * 2, o_batch_stride=o.stride(0) * 2,
                lse_head_stride=lse.stride(1) * 4, lse_batch_stride=lse.stride(0) * 4,
                kv_head_magic=0 if g == 1 else -(-(1 << 32) // g),
                scale_log2=1 / math.sqrt(D) * math.log2(math.e), store_lse=1)
    nbytes = 2.0 * (q.numel() + k.numel() + v.numel() + o.numel()) + 4.0 * lse.numel()
    return manifest_case("fmha_fwd_d128", "fmha_fwd_d128_bf16", f"fmha_fwd_d128_bf16 (ours) B{B} H{Hq}/{Hk} S{S}",
                         "fmha fwd bf16 d128", 4.0 * B * Hq * S * S * D, nbytes, "bf16", **args)


def cases(full: bool = True):
    if not full:
        return [fmha_case(1, 2, 1, 512)]
    return [fmha_case(B, Hq, Hk, S) for B, Hq, Hk, S, *_ in FMHA_PUBLISHED]
