"""Launch aiter's asm MX-FP4 GEMMs (`aiter_meta/hsa/gfx950/f4gemm/*.co`) as aiter does.

The host side is `gemm_a4w4_asm` in the corpus file `aiter_meta/csrc/py_itfs_cu/asm_gemm_a4w4.cu`
(amd-aiter 0.1.7.post2.dev18): `struct __attribute__((packed)) KernelArgs` is 23 fields, each
a 16-byte slot (a pointer + `p2` padding, or a 32-bit value + `p3` padding), then
`log2_k_split`; the code objects declare a 384-byte kernarg segment. Grid: x = ceil(N /
tile_N), y = ceil(M / tile_M), z = 1, or for split-K objects z = ceil(K / k_per_tg) with
k_per_tg = K / 2^log2_k_split rounded up to a multiple of 256; block 256 (4 waves).
Tensors, as aiter's tuner makes them (`generate_data` in
`aiter_meta/csrc/ck_gemm_a4w4_blockscale/gemm_a4w4_blockscale_tune.py`): A [M, K/2] and
B [N, K/2] bytes (two FP4 per byte, B pre-shuffled), e8m0 scales padded by
`aiter/utility/fp4_utils.py e8m0_shuffle` to [ceil(rows/256)*256, ceil(K/32/8)*8], the
bf16 output padded to ceil(M/256)*256 rows.

Only sizes and addresses matter to the timing model, so the tensors are `torch.empty`.

Split-K launches read past their K slice where a slice is one 256-element step
(docs/conformance.md, finding F8: the prologue advances the operand descriptors two steps
before it checks the slice length, and a num_records that drops below zero wraps), at
small M past the end of A or of A's scales. So A gets a whole tile of rows plus
SPLITK_SLACK bytes of slack after it and the other operands SPLITK_SLACK (`slack_bytes`):
the reads land in memory the launch owns, as they must to be modelled (the results do not
depend on those bytes: tests/conformance).
"""
from __future__ import annotations

import csv
import math
import struct
from dataclasses import dataclass

import torch

KERNARG_BYTES = 384          # .kernarg_segment_size of every f4gemm object
SPLITK_SLACK = 4096          # bytes after each split-K operand, A's besides a tile of rows
BLOCK = (256, 1, 1)
CONFIG_CSV = "aiter_meta/hsa/gfx950/f4gemm/f4gemm_bf16_per1x32Fp4.csv"


@dataclass(frozen=True)
class F4Config:
    symbol: str
    co: str              # corpus-relative path of the code object
    tile_m: int
    tile_n: int
    split_k: bool


def configs() -> dict[str, F4Config]:
    """symbol -> F4Config, from the object directory's CSV (as aiter's codegen reads it)."""
    from .. import corpus
    out = {}
    with open(corpus.path(CONFIG_CSV), newline="") as f:
        for row in csv.DictReader(f):
            out[row["knl_name"]] = F4Config(row["knl_name"], f"aiter_meta/hsa/gfx950/f4gemm/{row['co_name']}",
                                            int(row["tile_m"]), int(row["tile_n"]), row["splitK"] == "1")
    return out


def _slot_ptr(v: int) -> bytes:
    return struct.pack("<Q8x", v)


def _slot_u32(v: int) -> bytes:
    return struct.pack("<I12x", v)


def _slot_f32(v: float) -> bytes:
    return struct.pack("<f12x", v)


def _ptr(t) -> int:
    return 0 if t is None else int(t.data_ptr())


def kernarg(D, A, B, scale_a, scale_b, M: int, N: int, K: int, *, bias=None, alpha: float = 1.0,
            beta: float = 0.0, log2_k_split: int = 0) -> bytes:
    """KernelArgs of asm_gemm_a4w4.cu, field by field. Strides are what gemm_a4w4_asm sets
    (stride_C0 = out.stride(0), A/B strides in FP4 elements, scale strides in bytes); the
    fields it leaves unset (stride_D0/D1, C1, A1, B1, ScaleA1, ScaleB1) are 0 here."""
    for name, v in (("M", M), ("N", N), ("K", K)):
        if not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if K % 32:
        raise ValueError(f"K must be a multiple of 32 (one e8m0 scale per 32 values), got {K}")
    out = b"".join([
        _slot_ptr(_ptr(D)), _slot_ptr(_ptr(bias)), _slot_ptr(_ptr(A)), _slot_ptr(_ptr(B)),
        _slot_f32(alpha), _slot_f32(beta),
        _slot_u32(0), _slot_u32(0),                       # stride_D0, stride_D1 (unset by aiter)
        _slot_u32(D.stride(0)), _slot_u32(0),             # stride_C0 = out.stride(0), stride_C1
        _slot_u32(A.stride(0) * 2), _slot_u32(0),         # stride_A0 (fp4 elements)
        _slot_u32(B.stride(0) * 2), _slot_u32(0),
        _slot_u32(M), _slot_u32(N), _slot_u32(K),
        _slot_ptr(_ptr(scale_a)), _slot_ptr(_ptr(scale_b)),
        _slot_u32(scale_a.stride(0)), _slot_u32(0), _slot_u32(scale_b.stride(0)), _slot_u32(0),
        struct.pack("<i", log2_k_split),
    ])
    return out.ljust(KERNARG_BYTES, b"\0")


def k_per_workgroup(K: int, log2_k_split: int) -> int:
    """K of one split-K slice: K / 2^log2_k_split rounded up to a multiple of 256."""
    k_num = 1 << log2_k_split
    if K % k_num:
        raise ValueError(f"K={K} is not a multiple of 2^log2_k_split={k_num}")
    return math.ceil(K // k_num / 256) * 256


def slack_bytes(cfg: F4Config, K: int, log2_k_split: int) -> tuple[int, int]:
    """(bytes after A, bytes after B and each scale tensor) a launch must own (finding F8)."""
    if not (cfg.split_k and log2_k_split):
        return 0, 0
    return cfg.tile_m * (K // 2) + SPLITK_SLACK, SPLITK_SLACK


def _owned(shape, extra: int) -> torch.Tensor:
    """An uninitialised uint8 tensor of `shape` at the head of a storage `extra` bytes longer."""
    n = math.prod(shape)
    return torch.empty(n + extra, dtype=torch.uint8)[:n].view(shape)


def grid(cfg: F4Config, M: int, N: int, K: int, log2_k_split: int = 0) -> tuple[int, int, int]:
    gz = 1
    if cfg.split_k:
        gz = math.ceil(K / k_per_workgroup(K, log2_k_split))
    elif log2_k_split:
        raise ValueError(f"{cfg.symbol} has no split-K; log2_k_split must be 0")
    return (math.ceil(N / cfg.tile_n), math.ceil(M / cfg.tile_m), gz)


def launch(cfg: F4Config, M: int, N: int, K: int, log2_k_split: int = 0) -> dict:
    """Keyword arguments for gfxasm.perf.estimate (co path, kernel, grid, block, kernarg, buffers)."""
    from .. import corpus
    pad = lambda rows: math.ceil(rows / 256) * 256          # noqa: E731  (e8m0_shuffle / tuner padding)
    sk = math.ceil(K // 32 / 8) * 8
    a_slack, slack = slack_bytes(cfg, K, log2_k_split)
    A = _owned((M, K // 2), a_slack)
    B = _owned((N, K // 2), slack)
    sa = _owned((pad(M), sk), slack)
    sb = _owned((pad(N), sk), slack)
    D = torch.empty(pad(M), N, dtype=torch.bfloat16)
    return dict(co=str(corpus.path(cfg.co)), kernel=cfg.symbol, grid=grid(cfg, M, N, K, log2_k_split),
                block=BLOCK, kernarg=kernarg(D, A, B, sa, sb, M, N, K, log2_k_split=log2_k_split),
                buffers=[D, A, B, sa, sb])
