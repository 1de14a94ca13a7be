"""Launch recipes for hardware-proven gfx950 code objects.

Two sources. The corpus (gfxasm.corpus: the pinned amd-aiter 0.1.7.post2.dev18 wheel,
fetched by `gfxasm corpus fetch`) is the ground truth every checkout can reach; its
kernarg layouts are written from the wheel's own host code, cited per recipe. The
objects of ../shared/conformance/ (an older aiter commit, CASES.md) are extras that run
only where that folder exists; their layouts follow CASES.md.

Each case builds inputs, the kernarg (every argument in its own 16-byte slot), the grid,
and a float32 PyTorch reference. These kernels ran correctly on MI355X hardware: when
one disagrees with its reference here, the emulator (or the recipe) is wrong.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from gfxasm import corpus

SHARED_DIR = Path(__file__).resolve().parents[3] / "shared" / "conformance"


@dataclass
class Case:
    co: str                            # corpus: path under hsa/gfx950; shared: file name
    symbol: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    kernarg: bytes
    buffers: list
    check: Callable[[], None]          # raises AssertionError with the measured error
    keep: list = field(default_factory=list)
    source: str = "corpus"             # "corpus" or "shared"

    @property
    def path(self) -> Path:
        if self.source == "shared":
            return SHARED_DIR / self.co
        return corpus.path(f"{corpus.GFX950_DIR}/{self.co}")


class Kernarg:
    """Packs values into 16-byte slots at the offsets CASES.md gives."""

    def __init__(self, size: int):
        self.raw = bytearray(size)

    def ptr(self, offset: int, t: torch.Tensor | None):
        struct.pack_into("<Q", self.raw, offset, 0 if t is None else t.data_ptr())

    def u32(self, offset: int, value: int):
        struct.pack_into("<I", self.raw, offset, value)

    def f32(self, offset: int, value: float):
        struct.pack_into("<f", self.raw, offset, value)

    def bytes(self) -> bytes:
        return bytes(self.raw)


def poison(shape, dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype)


# ----------------------------------------------------------------- §2 bf16 GEMM
def bf16_gemm(M: int, N: int, K: int, out_bf16: bool = True, seed: int = 0) -> Case:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g).to(torch.bfloat16)
    b = torch.randn(N, K, generator=g).to(torch.bfloat16)
    out_dtype = torch.bfloat16 if out_bf16 else torch.float32
    d = poison((M, N), out_dtype)

    def check():
        ref = a.float() @ b.float().T
        assert not d.isnan().any(), "output not fully written"
        torch.testing.assert_close(d.float(), ref.to(out_dtype).float(), rtol=1e-2, atol=1e-2)

    return Case("bf16gemm_bf16_tn_256x256.co", "_ZN5aiter24bf16gemm_bf16_tn_256x256E",
                (math.ceil(N / 256), math.ceil(M / 256), 1), (256, 1, 1), bf16_gemm_kernarg(a, b, d),
                [a, b, d], check, source="shared")


def bf16_gemm_kernarg(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor) -> bytes:
    """CASES.md §2: D[M, N] = A[M, K] @ B[N, K]^T; D bf16 or fp32."""
    (M, K), N, esz = a.shape, b.shape[0], d.element_size()
    ka = Kernarg(352)
    ka.ptr(0, d)
    ka.ptr(32, a)
    ka.ptr(48, b)
    ka.f32(64, 1.0)
    ka.f32(80, 0.0)
    ka.u32(96, N * esz)
    ka.u32(128, N * esz)          # the kernel reads D's row stride from strideC0
    ka.u32(160, a.stride(0) * 2)
    ka.u32(192, b.stride(0) * 2)
    ka.u32(224, M)
    ka.u32(240, N)
    ka.u32(256, K)
    ka.u32(272, 1)
    ka.u32(288, 1 if d.dtype == torch.bfloat16 else 0)
    return ka.bytes()


# ----------------------------------------------------------------- §1 FMHA forward
def fmha_fwd(B: int, Hq: int, Hk: int, Sq: int, Sk: int, seed: int = 0) -> Case:
    g = torch.Generator().manual_seed(seed)
    D = 128
    q = torch.randn(B, Sq, Hq, D, generator=g).to(torch.bfloat16)
    # The kernel walks KV tiles by advancing soffset, which raw-buffer range checking
    # leaves out (CDNA4 ISA §9.1.5.2): the tile after the last one, and the rows past Sk
    # of a partial tile, are read from whatever memory follows K and V. The kernel masks
    # those scores to -inf, so P = 0 multiplies them: harmless for finite data (0 * NaN
    # would not be, on silicon too). Give it finite slack of large magnitude, so any
    # leak of it into O would show.
    slack = 2 * 64
    k = torch.empty(B, Sk + slack, Hk, D, dtype=torch.bfloat16)
    v = torch.empty(B, Sk + slack, Hk, D, dtype=torch.bfloat16)
    for t in (k, v):
        t.copy_(torch.randn(t.shape, generator=g) * 1e4)
        t[:, :Sk] = torch.randn(B, Sk, Hk, D, generator=g)
    k, v = k[:, :Sk], v[:, :Sk]
    o = poison((B, Sq, Hq, D), torch.bfloat16)
    lse = poison((B, Hq, Sq), torch.float32)
    scale = 1.0 / math.sqrt(D)

    def check():
        rep = Hq // Hk
        kf = k.float().repeat_interleave(rep, 2)
        vf = v.float().repeat_interleave(rep, 2)
        s = torch.einsum("bqhd,bkhd->bhqk", q.float(), kf) * scale
        ref_lse = s.logsumexp(-1)
        ref = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), vf)
        # aiter's rule: max error <= max(2 * error of a bf16 evaluation, 0.01).
        s16 = torch.einsum("bqhd,bkhd->bhqk", q, (kf * scale).to(torch.bfloat16))
        ref16 = torch.einsum("bhqk,bkhd->bqhd", s16.float().softmax(-1).to(torch.bfloat16),
                             vf.to(torch.bfloat16)).float()
        tol = max(2 * (ref16 - ref).abs().max().item(), 0.01)
        assert not o.isnan().any(), "O not fully written"
        err = (o.float() - ref).abs().max().item()
        assert err <= tol, f"O max error {err:.3g} > tolerance {tol:.3g}"
        lse_err = (lse - ref_lse).abs().max().item()
        assert lse_err <= 1e-3, f"LSE max error {lse_err:.3g} > 1e-3"

    return Case("fmha_v3_fwd/fwd_hd128_bf16.co", "_ZN5aiter19fmha_fwd_hd128_bf16E",
                (math.ceil(Sq / 256), Hq, B), (512, 1, 1), fmha_fwd_kernarg(q, k, v, o, lse, scale),
                [q, k, v, o, lse], check)


def fmha_fwd_kernarg(q, k, v, o, lse, scale: float) -> bytes:
    """q/o [B, Sq, Hq, 128], k/v [B, Sk, Hk, 128] bf16, lse [B, Hq, Sq] f32; every stride
    in bytes. CASES.md §1; the wheel's fmha_v3_fwd object takes the same layout (its host
    code: aiter_meta/csrc/py_itfs_cu/asm_mha_fwd.cu, struct fmha_fwd_v3_args)."""
    Sq, Hq, D = q.shape[1:]
    Sk, Hk = k.shape[1:3]
    ka = Kernarg(512)
    for off, t in ((0, o), (16, q), (32, k), (48, v), (64, lse)):
        ka.ptr(off, t)
    ka.f32(80, scale)
    ka.u32(96, Sq)
    ka.u32(112, q.stride(1) * 2)
    ka.u32(128, 256 * q.stride(1) * 2)
    ka.u32(144, q.stride(2) * 2)
    ka.u32(160, q.stride(0) * 2)
    ka.u32(176, Hq // Hk)
    ka.u32(192, k.stride(1) * 2)
    ka.u32(208, k.stride(2) * 2)
    ka.u32(224, k.stride(0) * 2)
    ka.u32(240, 5)
    ka.u32(256, 1)
    ka.u32(272, Sk)
    ka.u32(288, D)
    ka.u32(304, D)
    ka.u32(320, Hq)
    ka.u32(336, v.stride(1) * 2)
    ka.u32(352, v.stride(2) * 2)
    ka.u32(368, v.stride(0) * 2)
    ka.u32(384, o.stride(1) * 2)
    ka.u32(400, o.stride(2) * 2)
    ka.u32(416, o.stride(0) * 2)
    ka.u32(464, lse.stride(1) * 4)
    return ka.bytes()


# ----------------------------------------------------------------- §3 paged attention decode
def paged_attention(ctx_lens: list[int], Hk: int = 2, gqa: int = 8, block_size: int = 16,
                    seed: int = 0) -> Case:
    g = torch.Generator().manual_seed(seed)
    D = 128
    S = len(ctx_lens)
    Hq = Hk * gqa
    max_blocks = max(math.ceil(c / block_size) for c in ctx_lens)
    num_blocks = S * max_blocks
    q = (torch.rand(S, Hq, D, generator=g) * 2 - 1).to(torch.bfloat16)
    k_logical = (torch.rand(num_blocks, Hk, block_size, D, generator=g) * 2 - 1).to(torch.bfloat16)
    v_logical = (torch.rand(num_blocks, Hk, block_size, D, generator=g) * 2 - 1).to(torch.bfloat16)
    # K cache [nb, Hk, D/8, bs, 8]; V cache [nb, Hk, bs/8, D, 8] (asm_pa.cu's pa_fwd comments).
    k_cache = k_logical.view(num_blocks, Hk, block_size, D // 8, 8).permute(0, 1, 3, 2, 4).contiguous()
    v_cache = v_logical.view(num_blocks, Hk, block_size // 8, 8, D).permute(0, 1, 2, 4, 3).contiguous()
    block_table = torch.randperm(num_blocks, generator=g).to(torch.int32).view(S, max_blocks).contiguous()
    ctx = torch.tensor(ctx_lens, dtype=torch.int32)
    o = poison((S, Hq, D), torch.bfloat16)
    scale = 1.0 / math.sqrt(D)
    # aiter_meta/csrc/py_itfs_cu/asm_pa.cu, struct KernelArgs and pa_fwd(): no K/V scales
    # (noquant), no qo_indptr (not an MTP kernel); grid (Hk, batch), 4 waves.
    ka = Kernarg(256)
    for off, t in ((0, o), (16, q), (32, k_cache), (48, v_cache), (64, block_table), (80, ctx)):
        ka.ptr(off, t)
    ka.f32(128, scale * math.log2(math.e))
    ka.u32(144, block_table.stride(0))
    ka.u32(160, Hk)
    ka.u32(176, q.stride(0) * 2)
    ka.u32(192, k_cache.stride(0) * 2)
    ka.u32(208, k_cache.stride(1) * 2)
    ka.u32(224, gqa)

    def check():
        ref = torch.empty(S, Hq, D)
        for s, n in enumerate(ctx_lens):
            j = torch.arange(n)
            blk = block_table[s, j // block_size].long()
            keys = k_logical[blk, :, j % block_size].float()     # [n, Hk, D]
            vals = v_logical[blk, :, j % block_size].float()
            keys = keys.repeat_interleave(gqa, 1)
            vals = vals.repeat_interleave(gqa, 1)
            w = torch.einsum("hd,nhd->hn", q[s].float(), keys) * scale
            ref[s] = torch.einsum("hn,nhd->hd", w.softmax(-1), vals)
        assert not o.isnan().any(), "O not fully written"
        torch.testing.assert_close(o.float(), ref, rtol=1e-2, atol=1e-2)

    return Case("pa/pa_bf16_noquant_gqa8_1tg_4w.co", "_ZN5aiter27pa_bf16_noquant_gqa8_1tg_4wE",
                (Hk, S, 1), (256, 1, 1), ka.bytes(), [q, k_cache, v_cache, block_table, ctx, o], check)


# ----------------------------------------------------------------- §4 fp8 block-scale GEMM
def fp8_blockscale_gemm(M: int, N: int, K: int, seed: int = 0) -> Case:
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(M, K, generator=g) / 10).to(torch.float8_e4m3fn)
    w = (torch.rand(N, K, generator=g) / 10).to(torch.float8_e4m3fn)
    x_scale = torch.rand(M, K // 128, generator=g)
    w_scale = torch.rand(N // 128, K // 128, generator=g)
    bias = torch.randn(N, generator=g)
    w_shuf = w.view(torch.uint8).view(N // 16, 16, K // 32, 2, 16).permute(0, 2, 3, 1, 4).contiguous().view(N, K)
    sa = x_scale.T.contiguous()                                    # physically [K/128, M]
    c = poison((M, N), torch.bfloat16)
    xb = x.view(torch.uint8)
    ka = Kernarg(256)
    for off, t in ((0, c), (16, xb), (32, w_shuf), (48, sa), (64, w_scale), (80, bias)):
        ka.ptr(off, t)
    ka.u32(96, M)
    ka.u32(112, N)
    ka.u32(128, K)
    ka.u32(144, xb.stride(0))
    ka.u32(160, K)
    ka.u32(176, c.stride(0) * 2)
    ka.u32(192, 1)
    ka.u32(208, M)
    ka.u32(224, math.ceil(N / 128))
    ka.u32(240, math.ceil(K / 128))

    def check():
        xs = x_scale.repeat_interleave(128, 1)
        ws = w_scale.repeat_interleave(128, 0).repeat_interleave(128, 1)
        ref = (x.float() * xs) @ (w.float() * ws).T + bias
        assert not c.isnan().any(), "C not fully written"
        torch.testing.assert_close(c.float(), ref.to(torch.bfloat16).float(), rtol=1e-2, atol=1e-2)

    return Case("fp8gemm_bf16_blockscale_BpreShuffle_128x128.co",
                "_ZN5aiter43fp8gemm_bf16_blockscale_BpreShuffle_128x128E",
                (N // 128, math.ceil(M / 128), 1), (256, 1, 1), ka.bytes(),
                [xb, w_shuf, sa, w_scale, bias, c], check, source="shared")
