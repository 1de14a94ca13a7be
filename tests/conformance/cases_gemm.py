"""Launch recipes for the corpus GEMMs (see cases.py for what a recipe is).

Each kernarg is written field by field from the wheel's host code (cited per recipe);
every field sits in a 16-byte slot (a pointer + `p2`, or a 32-bit value + `p3`,
csrc/include/aiter_hip_common.h).
"""
from __future__ import annotations

import math

import torch

from .cases import Case, Kernarg, aiter_symbol, poison


# ----------------------------------------------------------------- bf16 GEMM, fp32 out
def bf16gemm_outf32(M: int, N: int, K: int, tile_m: int, seed: int = 0) -> Case:
    """D[M, N] f32 = A[M, K] @ B[N, K]^T, bf16 in. aiter_meta/csrc/py_itfs_cu/asm_gemm_a16w16.cu,
    struct KernelArgs and gemm_a16w16_asm(): strides in bytes (A/B rows K*2, C and D rows
    N*4; only stride_C0/A0/B0 are set), alpha 1, beta 0, ptr_C null, splitk 1 (the
    split-K path zeroes D and accumulates with atomics); grid (ceil(N/64), ceil(M/tile_m)),
    256 threads. The object is bf16gemm_outf32.csv's row for tile_m (tileN is 64); the
    host refuses N % 64."""
    if tile_m not in (32, 48, 64, 96):
        raise ValueError(f"tile_m must be one of the bf16gemm_outf32 tiles 32/48/64/96, got {tile_m}")
    if N % 64 or K % 64:
        raise ValueError(f"N and K must be multiples of 64 (gemm_a16w16_asm), got N={N}, K={K}")
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g).to(torch.bfloat16)
    b = torch.randn(N, K, generator=g).to(torch.bfloat16)
    d = poison((M, N), torch.float32)
    ka = Kernarg(288)
    ka.ptr(0, d)
    ka.ptr(32, a)
    ka.ptr(48, b)
    ka.f32(64, 1.0)
    ka.f32(80, 0.0)
    ka.u32(128, N * 4)              # stride_C0 (the kernel stores D with it)
    ka.u32(160, K * 2)              # stride_A0
    ka.u32(192, K * 2)              # stride_B0
    ka.u32(224, M)
    ka.u32(240, N)
    ka.u32(256, K)
    ka.u32(272, 1)                  # splitk

    def check():
        ref = a.double() @ b.double().T
        assert not d.isnan().any(), "D not fully written"
        # fp32 accumulation of K bf16 products: a few ulps of the row's magnitude.
        torch.testing.assert_close(d.double(), ref, rtol=1e-5, atol=1e-5 * math.sqrt(K))

    name = f"bf16gemm_outf32_tn_{tile_m}x64_pf3"
    return Case(f"bf16gemm/{name}.co", aiter_symbol(name),
                (math.ceil(N / 64), math.ceil(M / tile_m), 1), (256, 1, 1), ka.bytes(), [a, b, d], check)
