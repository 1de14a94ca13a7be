"""Launch recipe for aiter's FMHA backward dq/dk/dv kernel (see cases.py).

Host code: aiter_meta/hsa/gfx950/fmha_v3_bwd/codegen.py, fmha_bwd_v3_genl_gfx950() filling
struct fmha_bwd_v3_args_gfx950 (same file) and fmha_bwd_v3_kernel::launch_kernel for it
(grid (ceil(Sk / ts_kv), Hq, B), 256 threads), from the fmha_bwd_args that
aiter_meta/csrc/py_itfs_cu/asm_mha_bwd.cu builds. The asm object is the middle of three
launches: CK's dot_do_o kernel computes D = rowsum(dO * O) (here: torch), this kernel
writes dk and dv and adds dq into the fp32 dq_accum [1, B, Hq, Sq, 128] (zeroed by the
host, `is_v3_atomic_fp32`), and CK's convert kernel casts dq_accum to dq (here: the check
reads dq_accum). MHA only (Hq == Hk): GQA adds a dk/dv expansion and sum on the host.
"""
from __future__ import annotations

import math

import torch

from .cases import Case, Kernarg, aiter_symbol, poison

D_HEAD = 128
TS_KV = 256     # FmhaBwdV3Ts<128, 128, Bf16, mask 0, atomic32, ...>::ts_kv


def fmha_bwd(B: int, H: int, Sq: int, Sk: int, seed: int = 0) -> Case:
    """q/do/o [B, Sq, H, 128], k/v [B, Sk, H, 128] bf16, lse and D [B, H, Sq] f32."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Sq, H, D_HEAD, generator=g).to(torch.bfloat16)
    k = torch.randn(B, Sk, H, D_HEAD, generator=g).to(torch.bfloat16)
    v = torch.randn(B, Sk, H, D_HEAD, generator=g).to(torch.bfloat16)
    do = torch.randn(B, Sq, H, D_HEAD, generator=g).to(torch.bfloat16)
    scale = 1.0 / math.sqrt(D_HEAD)
    # The forward's outputs, as aiter's forward hands them over: O in bf16, LSE in f32.
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) * scale
    lse = s.logsumexp(-1).float().contiguous()                                 # [B, H, Sq]
    o = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v.double()).to(torch.bfloat16)
    d = (do.float() * o.float()).sum(-1).permute(0, 2, 1).contiguous()         # [B, H, Sq]
    dq_acc = torch.zeros(1, B, H, Sq, D_HEAD)
    dk = poison((B, Sk, H, D_HEAD), torch.bfloat16)
    dv = poison((B, Sk, H, D_HEAD), torch.bfloat16)

    ka = Kernarg(0x2c0)
    for off, t in ((0x00, dq_acc), (0x10, dk), (0x20, dv), (0x30, q), (0x40, k), (0x50, v), (0x60, do),
                   (0x70, lse), (0x80, d)):
        ka.ptr(off, t)
    ka.f32(0x90, scale)
    ka.f32(0xa0, math.log2(math.e))
    ka.u32(0xb0, Sq)
    ka.u32(0xc0, TS_KV * k.stride(1) * 2)
    for off, t in ((0xd0, q), (0x110, k), (0x190, v), (0x1c0, do), (0x1f0, dk), (0x210, dv)):
        ka.u32(off, t.stride(2) * 2)            # Hs_*
    for off, t in ((0xe0, q), (0x120, k), (0x1a0, v), (0x1d0, do), (0x200, dk), (0x220, dv)):
        ka.u32(off, t.stride(0) * 2)            # BAs_*
    for off, t in ((0xf0, q), (0x130, k), (0x140, dk), (0x1b0, v), (0x1e0, do), (0x230, dv)):
        ka.u32(off, t.stride(1) * 2)            # Seqs_*
    ka.u32(0x100, 1)                            # ratio nhead_q / nhead_k
    ka.u32(0x150, Sk)
    ka.u32(0x160, D_HEAD)
    ka.u32(0x170, D_HEAD)
    ka.u32(0x180, H)
    ka.u32(0x240, lse.stride(1) * 4)            # Hs_lsed
    ka.u32(0x290, Sq)                           # max_seqlen_dq

    def check():
        qd, kd, vd, dod = (t.double().requires_grad_() for t in (q, k, v, do))
        sd = torch.einsum("bqhd,bkhd->bhqk", qd, kd) * scale
        out = torch.einsum("bhqk,bkhd->bqhd", sd.softmax(-1), vd)
        gq, gk, gv = torch.autograd.grad(out, (qd, kd, vd), dod)
        assert not dk.isnan().any() and not dv.isnan().any(), "dk/dv not fully written"
        for name, got, ref in (("dq", dq_acc[0].permute(0, 2, 1, 3), gq), ("dk", dk, gk), ("dv", dv, gv)):
            # bf16 inputs, fp32 accumulation; dk/dv rounded once to bf16.
            tol = 1e-2 * ref.abs().max().item()
            err = (got.double() - ref).abs().max().item()
            assert err <= tol, f"{name} max error {err:.3g} > {tol:.3g}"

    name = "bwd_hd128_bf16_a32_psskddv"
    return Case(f"fmha_v3_bwd/{name}.co", aiter_symbol("fmha_" + name), (math.ceil(Sk / TS_KV), H, B),
                (256, 1, 1), ka.bytes(), [q, k, v, do, o, lse, d, dq_acc, dk, dv], check)
