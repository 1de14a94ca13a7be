"""The ops as torch.library citizens: gfxasm::fmha_fwd(_out) and gfxasm::mxfp8_gemm(_out).

opcheck (schema, fake kernel against the real one, autograd registration, AOT dispatch),
torch.compile(fullgraph=True) against eager, meta tensors, requires_grad refused. Real
runs go through the strict emulator with tiny shapes; outputs are poisoned with NaN first.
One compiled function holds both ops (Inductor's compile dominates this file: ~10-40 s).
"""
from __future__ import annotations

import pytest
import torch

import gfxasm
from gfxasm.build import build_manifest
from gfxasm.manifest import default_manifest
from gfxasm.ops import fmha
from gfxasm.ops import mxfp8_gemm as mx

# test_schema compares inputs before and after with torch.allclose, which has no CPU kernel
# for float8 in torch 2.13; the mxfp8 ops are checked without it, and test_mxfp8_inputs_untouched
# checks what it would (inputs unchanged bit for bit, out written).
NO_SCHEMA = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.fixture(scope="module", autouse=True)
def built():
    build_manifest(default_manifest())


def qkv(seed=0, batch=1, seq_q=3, seq_k=5, heads_q=2, heads_k=1, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, s, h, 128, generator=g).to(dtype)
                 for s, h in ((seq_q, heads_q), (seq_k, heads_k), (seq_k, heads_k)))


def mx_operands(M=2, N=19, K=64, seed=0):
    return mx.random_operands(M, N, K, torch.Generator().manual_seed(seed))


def nan_like(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype)


def test_opcheck_fmha():
    q, k, v = qkv()
    torch.library.opcheck(torch.ops.gfxasm.fmha_fwd.default, (q, k, v, True, None, True))
    torch.library.opcheck(torch.ops.gfxasm.fmha_fwd.default, (q, k, v, False, 0.3, False))
    torch.library.opcheck(torch.ops.gfxasm.fmha_fwd_out.default,
                          (q, k, v, nan_like(q.shape, q.dtype), nan_like((1, 2, 3), torch.float32), True, None))


def test_opcheck_mxfp8():
    a, sa, b, sb = mx_operands()
    torch.library.opcheck(torch.ops.gfxasm.mxfp8_gemm.default, (a, sa, b, sb, torch.bfloat16, "auto", None),
                          test_utils=NO_SCHEMA)
    torch.library.opcheck(torch.ops.gfxasm.mxfp8_gemm_out.default,
                          (a, sa.view(torch.uint8), b, sb, nan_like((2, 19), torch.float16), torch.float16, "mfma", 2),
                          test_utils=NO_SCHEMA)


def test_mxfp8_inputs_untouched():
    a, sa, b, sb = mx_operands(seed=1)
    before = [t.view(torch.uint8).clone() for t in (a, sa, b, sb)]
    out = nan_like((2, 19), torch.bfloat16)
    torch.ops.gfxasm.mxfp8_gemm_out(a, sa, b, sb, out, torch.bfloat16, "auto", None)
    assert all(torch.equal(t.view(torch.uint8), old) for t, old in zip((a, sa, b, sb), before))
    assert not torch.isnan(out).any()


def test_compile_fullgraph_equals_eager():
    q, k, v = qkv(seed=2)
    a, sa, b, sb = mx_operands(seed=2)

    def f(q, k, v, a, sa, b, sb, out):
        o, lse = gfxasm.fmha_fwd(q, k, v, causal=True, return_lse=True)
        gfxasm.mxfp8_gemm(a, sa, b, sb, out=out)
        return o, lse, gfxasm.mxfp8_gemm(a, sa, b, sb, out_dtype=torch.float16)

    compiled = torch.compile(f, fullgraph=True)
    out_c, out_e = nan_like((2, 19), torch.bfloat16), nan_like((2, 19), torch.bfloat16)
    got = compiled(q, k, v, a, sa, b, sb, out_c)
    want = f(q, k, v, a, sa, b, sb, out_e)
    assert all(torch.equal(x, y) for x, y in zip(got, want))
    assert torch.equal(out_c, out_e) and not torch.isnan(out_c).any()
    o_ref, _ = fmha.reference(q, k, v, causal=True)          # eager itself is right, independently
    assert fmha.max_error(want[0].float(), o_ref) < 0.05


def test_meta_tensors_give_shapes():
    q, k, v = (t.to("meta") for t in qkv(batch=2, seq_q=7, heads_q=4, heads_k=2))
    o, lse = gfxasm.fmha_fwd(q, k, v, return_lse=True)
    assert (o.device.type, o.shape, o.dtype) == ("meta", (2, 7, 4, 128), torch.bfloat16)
    assert (lse.shape, lse.dtype) == ((2, 4, 7), torch.float32)
    a, sa, b, sb = (t.to("meta") for t in mx_operands(M=3, N=40, K=96))
    out = gfxasm.mxfp8_gemm(a, sa, b, sb, out_dtype=torch.float16)
    assert (out.device.type, out.shape, out.dtype) == ("meta", (3, 40), torch.float16)
    with pytest.raises(ValueError, match="'b_scale' must be \\[40, 3\\]"):        # fake kernels check too
        gfxasm.mxfp8_gemm(a, sa, b, sb[:, :2])


def test_requires_grad_refused():
    q, k, v = qkv()
    q.requires_grad_(True)
    with pytest.raises(RuntimeError, match="fmha_fwd: 'q' requires grad, but gfxasm ops have no backward"):
        gfxasm.fmha_fwd(q, k, v)
    with pytest.raises(RuntimeError, match="'q' requires grad"):
        torch.ops.gfxasm.fmha_fwd(q, k, v, False, None, False)        # the op itself, too
    with pytest.raises(RuntimeError, match="fmha_fwd_out: 'q' requires grad"):
        gfxasm.fmha_fwd(q, k, v, out=torch.empty(q.shape, dtype=q.dtype))
    with torch.no_grad():
        assert gfxasm.fmha_fwd(q, k, v).grad_fn is None
    a, sa, b, sb = mx_operands()
    b = b.float().requires_grad_(True)                                  # fp8 cannot require grad
    with pytest.raises(RuntimeError, match="mxfp8_gemm: 'b' requires grad"):
        gfxasm.mxfp8_gemm(a, sa, b, sb)
