"""Benchmarks of hardware-proven aiter code objects, on the shapes whose MI355X results
are published (../shared/conformance/README.md) — the timing model's calibration points —
plus a comparable GEMM shape. The FMHA object comes from the pinned corpus
(gfxasm.corpus); the bf16 GEMM object exists only in ../shared/conformance and is left
out, with a notice, where that folder is absent.

Buffers are torch.empty: the model only needs addresses and control flow, and a
full-size problem (B8 H64 S16384: 2 GiB per Q/O tensor) stays virtual memory.
"""
from __future__ import annotations

import math
import sys

import torch

from bench.common import BenchCase
from gfxasm import corpus
# The launch recipes of the conformance objects are written once, with their tests.
from tests.conformance.cases import SHARED_DIR, bf16_gemm_kernarg, fmha_fwd_kernarg

FMHA_SYMBOL = "_ZN5aiter19fmha_fwd_hd128_bf16E"

# (B, Hq, Hk, S, published TFLOP/s, source) — conformance README
FMHA_PUBLISHED = [
    (4, 64, 8, 8192, 1390, "ROCm/aiter PR #3390"),
    (1, 16, 16, 16384, 1333, "ROCm/aiter PR #3390"),
    (8, 64, 8, 1024, 980, "aiter op_tests/cpp/mha/README.md chart (~)"),
    (8, 64, 8, 4096, 1362, "aiter op_tests/cpp/mha/README.md chart (~)"),
    (8, 64, 8, 16384, 1438, "aiter op_tests/cpp/mha/README.md chart (~)"),
]


def fmha_case(B, Hq, Hk, S, published=None, source="") -> BenchCase:
    """CASES.md §1 kernarg for fwd_hd128_bf16.co, BSHD layout, non-causal, LSE written."""
    D = 128
    q = torch.empty(B, S, Hq, D, dtype=torch.bfloat16)
    k = torch.empty(B, S, Hk, D, dtype=torch.bfloat16)
    v = torch.empty(B, S, Hk, D, dtype=torch.bfloat16)
    o = torch.empty(B, S, Hq, D, dtype=torch.bfloat16)
    lse = torch.empty(B, Hq, S, dtype=torch.float32)
    flops = 4.0 * B * Hq * S * S * D
    nbytes = 2.0 * (q.numel() + k.numel() + v.numel() + o.numel()) + 4.0 * lse.numel()
    return BenchCase(f"fmha_fwd_hd128_bf16 (aiter) B{B} H{Hq}/{Hk} S{S}", "fmha fwd bf16 d128",
                     str(corpus.path(f"{corpus.GFX950_DIR}/fmha_v3_fwd/fwd_hd128_bf16.co")), FMHA_SYMBOL, (math.ceil(S / 256), Hq, B),
                     (512, 1, 1), fmha_fwd_kernarg(q, k, v, o, lse, 1 / math.sqrt(D)), [q, k, v, o, lse],
                     flops, nbytes, "bf16", published, source)


def gemm_bf16_case(M, N, K) -> BenchCase:
    """CASES.md §2 kernarg for bf16gemm_bf16_tn_256x256.co (bf16 out)."""
    A = torch.empty(M, K, dtype=torch.bfloat16)
    Bm = torch.empty(N, K, dtype=torch.bfloat16)
    D = torch.empty(M, N, dtype=torch.bfloat16)
    return BenchCase(f"bf16gemm_tn_256x256 (aiter) M{M} N{N} K{K}", "gemm bf16",
                     str(SHARED_DIR / "bf16gemm_bf16_tn_256x256.co"), None,
                     (math.ceil(N / 256), math.ceil(M / 256), 1), (256, 1, 1), bf16_gemm_kernarg(A, Bm, D),
                     [A, Bm, D],
                     2.0 * M * N * K, 2.0 * (M * K + N * K + M * N), "bf16")


def cases(full: bool = True) -> list[BenchCase]:
    if not full:
        return [fmha_case(1, 2, 1, 512)]
    out = [fmha_case(*p) for p in FMHA_PUBLISHED]
    if SHARED_DIR.is_dir():
        out.append(gemm_bf16_case(8192, 8192, 8192))
    else:
        print(f"bench_conformance: {SHARED_DIR} is absent: the bf16 GEMM case is left out", file=sys.stderr)
    return out


def calibration_cases() -> list[BenchCase]:
    return [fmha_case(*p) for p in FMHA_PUBLISHED]


if __name__ == "__main__":
    from bench.common import run
    sel = calibration_cases() if "--calibration" in sys.argv else cases("--small" not in sys.argv)
    run(sel, out="bench/results_conformance.json", png="bench/roofline_conformance.png")
