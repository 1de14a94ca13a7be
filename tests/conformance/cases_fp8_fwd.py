"""Launch recipes for aiter's FP8 attention forwards, fmha_v3_fwd/fwd_hd128_fp8*.co (see cases.py).

The objects are pinned extras (gfxasm.corpus.EXTRA_OBJECTS: ROCm/aiter e8f438a; the
amd-aiter wheel carries only the bf16 forms of fmha_v3_fwd). Their manifest rows
(hsa/gfx950/fmha_v3_fwd/fmha_fwd.csv): dtype fp8bf16, hdim 128/128, ts_qo 256, ts_kv 128;
mask 0 or 2 (causal, bottom-right), mode 0 (batch) or 1 (group); the symbols are the
manifest's knl_name column (SYMBOLS), whose length prefixes are one short of the names
they precede (24 for the 25-character fmha_fwd_hd128_fp8_gfx950): the loader looks them
up as strings, so they are taken as written, not computed (cases.aiter_symbol).

Host code (same commit): csrc/cpp_itfs/mha_fwd.cu, init_fmha_fwd_v3_args and get_grid_dim
fill struct fmha_fwd_v3_args (csrc/include/mha_fwd.h, 656 bytes, every argument in a
16-byte slot): for fp8bf16 the input strides are the element strides (in_bpe 1), O's
times 2 (bf16), and the three descale pointers sit at 0x200/0x210/0x220 with their
batch/head strides (times 4, f32) after them. csrc/py_itfs_cu/asm_mha_fwd.cu accepts
descales of shape [1] or [B, Hk]. tune_opt and the grid are the bf16 kernels' (cases.py:
_fmha_tune_opt, _fmha_q_tiles): a causal workgroup takes two Q tiles.

What the objects do with the descales (read from the code): each loads one dword at
offset 0 of each descale pointer and never loads the descale strides (kernarg
0x230-0x280), so only per-tensor scales are honoured; a [B, Hk] descale the host accepts
would be applied as its first element everywhere. The recipes use per-tensor scales.
"""
from __future__ import annotations

import math

import torch

from gfxasm import corpus

from .cases import Case, Kernarg, _fmha_q_tiles, _fmha_tune_opt, cu_seqlens, poison

TS_QO = 256
TS_KV = 128
D = 128
FP8_MAX = 448.0
KV_SLACK = 4 * TS_KV              # rows of finite slack after K and V (_fp8_with_slack)
SYMBOLS = {                       # fmha_fwd.csv knl_name, by co_name
    "fwd_hd128_fp8": "_ZN5aiter24fmha_fwd_hd128_fp8_gfx950E",
    "fwd_hd128_fp8_causal": "_ZN5aiter31fmha_fwd_hd128_fp8_causal_gfx950E",
    "fwd_hd128_fp8_group": "_ZN5aiter30fmha_fwd_hd128_fp8_group_gfx950E",
    "fwd_hd128_fp8_causal_group": "_ZN5aiter37fmha_fwd_hd128_fp8_causal_group_gfx950E",
}


def name(causal: bool, group: bool) -> str:
    return "fwd_hd128_fp8" + ("_causal" if causal else "") + ("_group" if group else "")


def path(causal: bool = False, group: bool = False):
    """The pinned object; CorpusMissing (naming the fetch command) where it is absent."""
    return corpus.extra_object(f"fmha_v3_fwd/{name(causal, group)}.co")


def _quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor FP8 E4M3: (codes, f32 descale [1]) with codes * descale ~ x."""
    descale = (x.abs().max() / FP8_MAX).float().reshape(1)
    return (x / descale.double()).to(torch.float8_e4m3fn), descale


def _fp8_with_slack(x: torch.Tensor, seq_dim: int, g) -> torch.Tensor:
    """x's FP8 codes in storage that runs on past the last row, as cases._kv_with_slack
    does for bf16: the kernel walks KV tiles by soffset (no range check) and masks the
    rows past the end, so they must be finite; they are of full FP8 magnitude, so a
    leak of them into O would show."""
    big = list(x.shape)
    big[seq_dim] += KV_SLACK
    room = (torch.rand(big, generator=g, dtype=torch.float64) * 2 - 1).mul(FP8_MAX).to(torch.float8_e4m3fn)
    out = room.narrow(seq_dim, 0, x.shape[seq_dim])
    out.copy_(x)
    return out


def fp8_fwd(B: int, Hq: int, Hk: int, Sq: int, Sk: int, seed: int = 0, causal: bool = False) -> Case:
    """Batch mode: q/o [B, Sq, Hq, 128], k/v [B, Sk, Hk, 128]; causal is aiter's bottom-right
    mask (key j visible to query i iff j <= i + Sk - Sq)."""
    if causal and Sq > Sk:
        raise ValueError(f"causal needs Sq <= Sk (rows fully masked otherwise), got Sq={Sq}, Sk={Sk}")
    g = torch.Generator().manual_seed(seed)
    t = _tensors((B, Sq, Hq), (B, Sk, Hk), 1, g)
    o = poison((B, Sq, Hq, D), torch.bfloat16)
    lse = poison((B, Hq, Sq), torch.float32)

    def check():
        _check([tuple(x[b] for x in (*t.values, o)) + (lse[b],) for b in range(B)], t, causal)

    ka = _kernarg(t, o, lse, opt=_fmha_tune_opt(Hq, Sq, causal), seq=1, head=2, batch_stride=True)
    return Case(f"fmha_v3_fwd/{name(causal, False)}.co", SYMBOLS[name(causal, False)],
                (_fmha_q_tiles(Sq, causal), Hq, B), (512, 1, 1), ka, [*t.values, o, lse, *t.descales], check)


def fp8_fwd_group(seqlens_q: list[int], seqlens_k: list[int], Hq: int, Hk: int, seed: int = 0,
                  causal: bool = False) -> Case:
    """Group (varlen) mode: q/o [total_q, Hq, 128], k/v [total_k, Hk, 128], cu_seqlens int32
    [B+1] (given as both the sequence starts and the padded starts, as mha_fwd.cu does
    without cu_seqlen pointers), lse [Hq, total_q], batch strides 0; grid (Hq, B, tiles of
    total_q)."""
    cu_q, cu_k = cu_seqlens(seqlens_q, seqlens_k, causal)
    g = torch.Generator().manual_seed(seed)
    total_q = int(cu_q[-1])
    t = _tensors((total_q, Hq), (int(cu_k[-1]), Hk), 0, g)
    o = poison((total_q, Hq, D), torch.bfloat16)
    lse = poison((Hq, total_q), torch.float32)

    def check():
        parts = []
        for b in range(len(seqlens_q)):
            qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
            q, k, v = t.values
            parts.append((q[qs], k[ks], v[ks], o[qs], lse[:, qs]))
        _check(parts, t, causal)

    ka = _kernarg(t, o, lse, opt=_fmha_tune_opt(Hq, total_q, causal), seq=0, head=1, batch_stride=False,
                  seqstart=(cu_q, cu_k))
    return Case(f"fmha_v3_fwd/{name(causal, True)}.co", SYMBOLS[name(causal, True)],
                (Hq, len(seqlens_q), _fmha_q_tiles(total_q, causal)), (512, 1, 1), ka,
                [*t.values, o, lse, *t.descales, cu_q, cu_k], check)


class _Inputs:
    """Quantized q, k, v (FP8 codes; k and v with slack) and their f32 descales."""

    def __init__(self, values, descales):
        self.values, self.descales = values, descales


def _tensors(q_lead, kv_lead, seq_dim: int, g) -> _Inputs:
    # unequal magnitudes, so a descale applied to the wrong operand would show
    q, qd = _quantize(torch.randn(*q_lead, D, generator=g, dtype=torch.float64) * 1.5)
    k, kd = _quantize(torch.randn(*kv_lead, D, generator=g, dtype=torch.float64) * 0.7)
    v, vd = _quantize(torch.randn(*kv_lead, D, generator=g, dtype=torch.float64) * 3.0)
    return _Inputs((q, _fp8_with_slack(k, seq_dim, g), _fp8_with_slack(v, seq_dim, g)), (qd, kd, vd))


def _kernarg(t: _Inputs, o, lse, opt: int, seq: int, head: int, batch_stride: bool,
             seqstart=(None, None)) -> bytes:
    """struct fmha_fwd_v3_args for fp8bf16 (init_fmha_fwd_v3_args): one-byte inputs, so the
    byte strides are the element strides; O bf16; descale strides 0 (per-tensor)."""
    q, k, v = t.values
    Sq, Hq, Sk, Hk = q.shape[seq], q.shape[head], k.shape[seq], k.shape[head]
    bstride = (lambda x, bpe: x.stride(0) * bpe) if batch_stride else (lambda x, bpe: 0)  # noqa: E731
    ka = Kernarg(656)
    for off, x in ((0x000, o), (0x010, q), (0x020, k), (0x030, v), (0x040, lse), (0x1b0, seqstart[0]),
                   (0x1c0, seqstart[1]), (0x1e0, seqstart[0]), (0x1f0, seqstart[1]),
                   (0x200, t.descales[0]), (0x210, t.descales[1]), (0x220, t.descales[2])):
        ka.ptr(off, x)
    ka.f32(0x050, 1.0 / math.sqrt(D))
    for off, value in ((0x060, Sq), (0x070, q.stride(seq)), (0x080, TS_QO * q.stride(seq)),
                       (0x090, q.stride(head)), (0x0a0, bstride(q, 1)), (0x0b0, Hq // Hk),
                       (0x0c0, k.stride(seq)), (0x0d0, k.stride(head)), (0x0e0, bstride(k, 1)),
                       (0x0f0, opt), (0x100, 1), (0x110, Sk), (0x120, D), (0x130, D), (0x140, Hq),
                       (0x150, v.stride(seq)), (0x160, v.stride(head)), (0x170, bstride(v, 1)),
                       (0x180, o.stride(seq) * 2), (0x190, o.stride(head) * 2), (0x1a0, bstride(o, 2)),
                       (0x1d0, lse.stride(-2) * 4)):
        ka.u32(off, value)
    return ka.bytes()


def _check(parts, t: _Inputs, causal: bool):
    """parts: (q [Sq, Hq, D], k [Sk, Hk, D], v, o, lse [Hq, Sq]) per sequence, FP8 codes.

    Reference in float64 on the dequantized inputs. The kernel rounds P to FP8 E4M3 for
    P.V (v_cvt_pk_fp8_f32 before the PV MFMA), so the tolerance is twice the error of that
    evaluation (P of the exact row maximum rounded to E4M3, O and the row sum from it)
    plus bf16 rounding of O; LSE to twice that evaluation's row-sum error plus 1e-3."""
    qd, kd, vd = (float(d) for d in t.descales)
    scale = 1.0 / math.sqrt(D)
    for n, (q, k, v, o, lse) in enumerate(parts):
        (Sq, Hq, _), (Sk, Hk, _) = q.shape, k.shape
        rep = Hq // Hk
        kf = k.double().repeat_interleave(rep, 1) * kd
        vf = v.double().repeat_interleave(rep, 1) * vd
        s = torch.einsum("qhd,khd->hqk", q.double() * qd, kf) * scale
        if causal:
            hidden = torch.arange(Sk)[None, :] > torch.arange(Sq)[:, None] + (Sk - Sq)
            s = s.masked_fill(hidden, -math.inf)
        m = s.amax(-1, keepdim=True)
        p = torch.exp(s - m)
        ref = torch.einsum("hqk,khd->qhd", p / p.sum(-1, keepdim=True), vf)
        p8 = p.to(torch.float8_e4m3fn).double()
        ref8 = torch.einsum("hqk,khd->qhd", p8 / p8.sum(-1, keepdim=True), vf)
        assert not o.isnan().any(), f"sequence {n}: O not fully written"
        err = (o.double() - ref).abs().max().item()
        tol = 2 * (ref8 - ref).abs().max().item() + 2.0 ** -8 * ref.abs().max().item()
        assert err <= tol, f"sequence {n}: O max error {err:.3g} > tolerance {tol:.3g}"
        want_lse = (m.squeeze(-1) + p.sum(-1).log()).transpose(0, 1)          # [Sq, Hq]
        lse_tol = 2 * (p8.sum(-1).log() - p.sum(-1).log()).abs().max().item() + 1e-3
        lse_err = (lse.double().transpose(0, 1) - want_lse).abs().max().item()
        assert lse_err <= lse_tol, f"sequence {n}: LSE max error {lse_err:.3g} > {lse_tol:.3g}"
