"""Benchmarks of the hardware-proven aiter code objects (../shared/conformance/), on the
shapes whose MI355X results are published (conformance README) — the timing model's
calibration points — plus comparable GEMM / decode shapes.

Buffers are torch.empty: the model only needs addresses and control flow, and a
full-size problem (B8 H64 S16384: 2 GiB per Q/O tensor) stays virtual memory.
"""
from __future__ import annotations

import math
import struct
from pathlib import Path

import torch

from bench.common import BenchCase

CONFORMANCE = Path(__file__).resolve().parents[2] / "shared" / "conformance"
FMHA_SYMBOL = "_ZN5aiter19fmha_fwd_hd128_bf16E"

# (B, Hq, Hk, S, published TFLOP/s, source) — conformance README
FMHA_PUBLISHED = [
    (4, 64, 8, 8192, 1390, "ROCm/aiter PR #3390"),
    (1, 16, 16, 16384, 1333, "ROCm/aiter PR #3390"),
    (8, 64, 8, 1024, 980, "aiter op_tests/cpp/mha/README.md chart (~)"),
    (8, 64, 8, 4096, 1362, "aiter op_tests/cpp/mha/README.md chart (~)"),
    (8, 64, 8, 16384, 1438, "aiter op_tests/cpp/mha/README.md chart (~)"),
]


class _Args:
    def __init__(self, size):
        self.raw = bytearray(size)

    def ptr(self, off, t):
        struct.pack_into("<Q", self.raw, off, t.data_ptr())

    def u32(self, off, v):
        struct.pack_into("<I", self.raw, off, int(v))

    def f32(self, off, v):
        struct.pack_into("<f", self.raw, off, float(v))


def fmha_case(B, Hq, Hk, S, published=None, source="") -> BenchCase:
    """CASES.md §1 kernarg for fwd_hd128_bf16.co, BSHD layout, non-causal, LSE written."""
    D = 128
    q = torch.empty(B, S, Hq, D, dtype=torch.bfloat16)
    k = torch.empty(B, S, Hk, D, dtype=torch.bfloat16)
    v = torch.empty(B, S, Hk, D, dtype=torch.bfloat16)
    o = torch.empty(B, S, Hq, D, dtype=torch.bfloat16)
    lse = torch.empty(B, Hq, S, dtype=torch.float32)
    a = _Args(512)
    for off, t in ((0, o), (16, q), (32, k), (48, v), (64, lse)):
        a.ptr(off, t)
    a.f32(80, 1 / math.sqrt(D))
    a.u32(96, S)
    a.u32(112, q.stride(1) * 2)
    a.u32(128, 256 * q.stride(1) * 2)
    a.u32(144, q.stride(2) * 2)
    a.u32(160, q.stride(0) * 2)
    a.u32(176, Hq // Hk)
    a.u32(192, k.stride(1) * 2)
    a.u32(208, k.stride(2) * 2)
    a.u32(224, k.stride(0) * 2)
    a.u32(240, 5)
    a.u32(256, 1)
    a.u32(272, S)
    a.u32(288, D)
    a.u32(304, D)
    a.u32(320, Hq)
    a.u32(336, v.stride(1) * 2)
    a.u32(352, v.stride(2) * 2)
    a.u32(368, v.stride(0) * 2)
    a.u32(384, o.stride(1) * 2)
    a.u32(400, o.stride(2) * 2)
    a.u32(416, o.stride(0) * 2)
    a.u32(464, lse.stride(1) * 4)
    flops = 4.0 * B * Hq * S * S * D
    nbytes = 2.0 * (q.numel() + k.numel() + v.numel() + o.numel()) + 4.0 * lse.numel()
    return BenchCase(f"fmha_fwd_hd128_bf16 (aiter) B{B} H{Hq}/{Hk} S{S}", "fmha fwd bf16 d128",
                     str(CONFORMANCE / "fwd_hd128_bf16.co"), FMHA_SYMBOL, (math.ceil(S / 256), Hq, B),
                     (512, 1, 1), bytes(a.raw), [q, k, v, o, lse], flops, nbytes, "bf16",
                     published, source)


def gemm_bf16_case(M, N, K) -> BenchCase:
    """CASES.md §2 kernarg for bf16gemm_bf16_tn_256x256.co (bf16 out)."""
    A = torch.empty(M, K, dtype=torch.bfloat16)
    Bm = torch.empty(N, K, dtype=torch.bfloat16)
    D = torch.empty(M, N, dtype=torch.bfloat16)
    a = _Args(352)
    a.ptr(0, D)
    a.ptr(32, A)
    a.ptr(48, Bm)
    a.f32(64, 1.0)
    a.u32(96, N * 2)
    a.u32(128, N * 2)
    a.u32(160, K * 2)
    a.u32(192, K * 2)
    a.u32(224, M)
    a.u32(240, N)
    a.u32(256, K)
    a.u32(272, 1)
    a.u32(288, 1)
    return BenchCase(f"bf16gemm_tn_256x256 (aiter) M{M} N{N} K{K}", "gemm bf16",
                     str(CONFORMANCE / "bf16gemm_bf16_tn_256x256.co"), None,
                     (math.ceil(N / 256), math.ceil(M / 256), 1), (256, 1, 1), bytes(a.raw), [A, Bm, D],
                     2.0 * M * N * K, 2.0 * (M * K + N * K + M * N), "bf16")


def cases(full: bool = True) -> list[BenchCase]:
    if not full:
        return [fmha_case(1, 2, 1, 512)]
    out = [fmha_case(*p) for p in FMHA_PUBLISHED]
    out.append(gemm_bf16_case(8192, 8192, 8192))
    return out


def calibration_cases() -> list[BenchCase]:
    return [fmha_case(*p) for p in FMHA_PUBLISHED]


if __name__ == "__main__":
    import sys
    from bench.common import run
    sel = calibration_cases() if "--calibration" in sys.argv else cases("--small" not in sys.argv)
    run(sel, out="bench/results_conformance.json", png="bench/roofline_conformance.png")
