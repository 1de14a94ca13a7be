"""Launch recipe for aiter's MX-FP8 attention forward, fmha_v4_fwd/fwd_hd128_mxfp8.co (see cases.py).

The object is a pinned extra (gfxasm.corpus.EXTRA_OBJECTS: ROCm/aiter e8f438a, no wheel on
the package index carries it); its manifest row (hsa/gfx950/fmha_v4_fwd/fmha_v4_fwd.csv)
is Q/K/V FP8 E4M3, Q and K scales E8M0 per 1x32 (mode 5), V one f32 scale (mode 1), BF16
O, ts_qo 256, symbol _ZN5aiter28fmha_fwd_hd128_mxfp8_gfx950E.

Host code (same commit): csrc/py_itfs_cu/asm_mha_v4_fwd.cu, struct FmhaV4Kernarg (656
bytes, every argument in a 16-byte slot), fmha_v4_fwd(): input strides in bytes as the
element strides (one-byte formats), O strides times 2, s_Ts = ts_qo * Q's sequence
stride, s_opt 5, s_lse 0 (no LSE pointer), s_gqa 1; Q/K descales uint8 [B, S, H, 4]
(batch stride, head stride = stride(2), slots the kernel never loads: it takes the scales
as dense arrays); V descale one float (strides 0). Grid
(ceil(Sq / 256), Hq, B), 512 threads. aiter/ops/mha_v4.py and
op_tests/op_benchmarks/triton/bench_sage.py (_production_quantize_mxfp8) quantize Q
after multiplying it by softmax_scale * log2(e) (mha_v4_q_multiplier): the kernel's
scores are in log2 units, P = 2^(s - max).

GQA: the host refuses Hq != Hk (its first rows are MHA-only) but the kernarg has s_gqa
and the kernel divides the head by it; the GQA cases set s_gqa = Hq / Hk.
"""
from __future__ import annotations

import math

import torch

from gfxasm import corpus

from .cases import Case, Kernarg, poison

NAME = "fmha_v4_fwd/fwd_hd128_mxfp8.co"
SYMBOL = "_ZN5aiter28fmha_fwd_hd128_mxfp8_gfx950E"
TS_QO = 256
TS_KV = 128
D = 128
BLOCK = 32                     # E8M0 scale block along the head dimension
LOG2E = 1.4426950408889634


def _mx_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., 128] float -> (FP8 E4M3 codes, E8M0 scale bytes [..., 4]): per 32 values the
    power of two that brings the block's absolute maximum to at most 448."""
    blocks = x.reshape(*x.shape[:-1], D // BLOCK, BLOCK)
    amax = blocks.abs().amax(-1).clamp_min(2.0 ** -100)
    exp = torch.ceil(torch.log2(amax / 448.0)).clamp(-127, 127)
    data = (blocks / torch.exp2(exp)[..., None]).to(torch.float8_e4m3fn).reshape(x.shape)
    return data, (exp + 127).to(torch.uint8)


def _with_slack(scale: torch.Tensor, tile: int) -> torch.Tensor:
    """The kernel loads the E8M0 scales of whole tiles with global_load_ubyte (no range
    check), addressing them as a dense [B, S, H, 4] array of its own (it never loads the
    kernarg's descale strides): the last sequence's rows past its end, up to the tile's,
    are read past the tensor, and their scores dropped. Give the tensor that much finite
    slack of large magnitude (2^20) after it, so a leak into O would show."""
    B, S, H, n = scale.shape
    room = torch.full((scale.numel() + (-S % tile) * H * n,), 127 + 20, dtype=torch.uint8)
    room[:scale.numel()] = scale.flatten()
    return room[:scale.numel()].view(B, S, H, n)


def _mx_value(data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    blocks = data.double().reshape(*data.shape[:-1], D // BLOCK, BLOCK)
    return (blocks * torch.exp2(scale.double() - 127)[..., None]).reshape(data.shape)


def mxfp8_attention(B: int, Hq: int, Hk: int, Sq: int, Sk: int, seed: int = 0,
                    late_peak: float = 0.0) -> Case:
    """q/o [B, Sq, Hq, 128], k/v [B, Sk, Hk, 128]. `late_peak` (log2 units) adds that much to
    the scores of the last 64 keys against every query: a running maximum set by the early
    keys is then exceeded by far more than log2(448), so P of the late keys would not fit
    FP8 without the kernel rescaling (its P > 448 path)."""
    g = torch.Generator().manual_seed(seed)
    softmax_scale = 1.0 / math.sqrt(D)
    q_real = torch.randn(B, Sq, Hq, D, generator=g, dtype=torch.float64) * softmax_scale * LOG2E
    k_real = torch.randn(B, Sk, Hk, D, generator=g, dtype=torch.float64)
    if late_peak:
        # a shared direction in Q and in the last keys: their scores rise by late_peak
        u = torch.randn(D, generator=g, dtype=torch.float64)
        u /= u.norm()
        q_real = q_real + u * math.sqrt(late_peak)
        k_real[:, -64:] += u * math.sqrt(late_peak)
    v_real = torch.randn(B, Sk, Hk, D, generator=g, dtype=torch.float64)
    q, q_scale = _mx_quantize(q_real)
    k, k_scale = _mx_quantize(k_real)
    q_scale = _with_slack(q_scale, TS_QO)
    k_scale = _with_slack(k_scale, TS_KV)
    v_descale = (v_real.abs().max() / 448.0).float().reshape(1)
    v = (v_real / v_descale.double()).to(torch.float8_e4m3fn)
    o = poison((B, Sq, Hq, D), torch.bfloat16)

    def check():
        qv, kv = _mx_value(q, q_scale), _mx_value(k, k_scale)
        vv = v.double() * float(v_descale)
        rep = Hq // Hk
        s = torch.einsum("bqhd,bkhd->bhqk", qv, kv.repeat_interleave(rep, 2))      # log2 units
        p = torch.exp2(s - s.amax(-1, keepdim=True))
        vr = vv.repeat_interleave(rep, 2)
        ref = torch.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdim=True), vr)
        # The kernel forms P in FP8 (E4M3) for P.V and for the row sum: the error of that
        # evaluation (P of the true row maximum rounded to E4M3) sets the tolerance, twice it.
        p8 = p.to(torch.float8_e4m3fn).double()
        ref8 = torch.einsum("bhqk,bkhd->bqhd", p8 / p8.sum(-1, keepdim=True), vr)
        assert not o.isnan().any(), "O not fully written"
        got = o.double()
        cos = torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), 0).item()
        err = (got - ref).abs().max().item()
        tol = 2 * (ref8 - ref).abs().max().item() + 2.0 ** -8 * ref.abs().max().item()      # + bf16 O
        assert err <= tol and cos >= 0.999, f"O max error {err:.3g} (tolerance {tol:.3g}), cosine {cos:.6f}"
        check.measured = (err, tol, cos)
        assert err <= tol and cos >= 0.999, f"O max error {err:.3g} (tolerance {tol:.3g}), cosine {cos:.6f}"

    qb, kb, vb = q.view(torch.uint8), k.view(torch.uint8), v.view(torch.uint8)
    ka = Kernarg(656)
    for off, t in ((0x000, o), (0x010, qb), (0x020, kb), (0x030, vb), (0x200, q_scale), (0x210, k_scale),
                   (0x220, v_descale)):
        ka.ptr(off, t)
    ka.f32(0x050, softmax_scale)
    for off, value in ((0x060, Sq), (0x070, qb.stride(1)), (0x080, TS_QO * qb.stride(1)), (0x090, qb.stride(2)),
                       (0x0a0, qb.stride(0)), (0x0b0, Hq // Hk), (0x0c0, kb.stride(1)), (0x0d0, kb.stride(2)),
                       (0x0e0, kb.stride(0)), (0x0f0, 5), (0x100, 0), (0x110, Sk), (0x120, D), (0x130, D),
                       (0x140, Hq), (0x150, vb.stride(1)), (0x160, vb.stride(2)), (0x170, vb.stride(0)),
                       (0x180, o.stride(1) * 2), (0x190, o.stride(2) * 2), (0x1a0, o.stride(0) * 2),
                       (0x230, q_scale.stride(0)), (0x240, q_scale.stride(2)),
                       (0x250, k_scale.stride(0)), (0x260, k_scale.stride(2))):
        ka.u32(off, value)
    return Case(NAME, SYMBOL, (math.ceil(Sq / TS_QO), Hq, B), (512, 1, 1), ka.bytes(),
                [q, k, v, o, q_scale, k_scale, v_descale], check)


def path():
    """The pinned object; CorpusMissing (naming the fetch command) where it is absent."""
    return corpus.extra_object(NAME)
