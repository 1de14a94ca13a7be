"""The ops as torch.library citizens: gfxasm::fmha_fwd(_out), gfxasm::mxfp8_gemm(_out) and
gfxasm::decode_attention(_out).

opcheck (schema, fake kernel against the real one, autograd registration, AOT dispatch),
torch.compile(fullgraph=True) against eager, meta tensors, requires_grad refused. Real
runs go through the strict emulator with tiny shapes; outputs are poisoned with NaN first.
One compiled function holds fmha_fwd and mxfp8_gemm (Inductor's compile dominates this
file: ~10-40 s); decode_attention's own compiled function adds ~3 s.
"""
from __future__ import annotations

import collections

import pytest
import torch

import gfxasm
from gfxasm.build import build_manifest
from gfxasm.manifest import default_manifest
from gfxasm.ops import decode_attention as da
from gfxasm.ops import fmha
from gfxasm.ops import mxfp8_gemm as mx

# test_schema compares inputs before and after with torch.allclose, which has no CPU kernel
# for float8 in torch 2.13; the mxfp8 ops and decode_attention on FP8 caches are checked
# without it, and test_mxfp8_inputs_untouched / test_decode_fp8_inputs_untouched check what
# it would (inputs unchanged bit for bit, out written).
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


# window_left, window_right, sinks, softcap of the attention ops' schemas: the defaults
NO_FEATURES = (-1, -1, None, 0.0)

def nan_like(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype)


def test_opcheck_fmha():
    q, k, v = qkv()
    torch.library.opcheck(torch.ops.gfxasm.fmha_fwd_with_lse.default, (q, k, v, True, None, *NO_FEATURES))
    torch.library.opcheck(torch.ops.gfxasm.fmha_fwd.default, (q, k, v, False, 0.3, *NO_FEATURES))
    torch.library.opcheck(torch.ops.gfxasm.fmha_fwd_out.default,
                          (q, k, v, nan_like(q.shape, q.dtype), nan_like((1, 2, 3), torch.float32), True, None,
                           *NO_FEATURES))


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
        o, lse = gfxasm.fmha_fwd(q, k, v, causal=True, return_lse=True)       # fmha_fwd_with_lse
        gfxasm.mxfp8_gemm(a, sa, b, sb, out=out)
        return o, lse, gfxasm.fmha_fwd(q, k, v), gfxasm.mxfp8_gemm(a, sa, b, sb, out_dtype=torch.float16)

    compiled = torch.compile(f, fullgraph=True)
    out_c, out_e = nan_like((2, 19), torch.bfloat16), nan_like((2, 19), torch.bfloat16)
    got = compiled(q, k, v, a, sa, b, sb, out_c)
    want = f(q, k, v, a, sa, b, sb, out_e)
    assert all(torch.equal(x, y) for x, y in zip(got, want))
    assert torch.equal(out_c, out_e) and not torch.isnan(out_c).any()
    o_ref, _ = fmha.reference(q, k, v, causal=True)          # eager itself is right, independently
    assert fmha.max_error(want[0].float(), o_ref) < 0.05


def test_functional_op_and_its_with_lse_form():
    """Through the dispatcher the functional op returns out alone and its `_with_lse` op
    (out, lse), each what the eager call returns and out within the reference's bound; an
    op without an optional output has no `_with_` form."""
    q, k, v = qkv(seed=5)
    o_eager, lse_eager = gfxasm.fmha_fwd(q, k, v, causal=True, return_lse=True)
    o = torch.ops.gfxasm.fmha_fwd(q, k, v, True, None, *NO_FEATURES)
    o2, lse = torch.ops.gfxasm.fmha_fwd_with_lse(q, k, v, True, None, *NO_FEATURES)
    assert isinstance(o, torch.Tensor) and torch.equal(o, o_eager) and torch.equal(o2, o_eager)
    assert torch.equal(lse, lse_eager)
    o_ref, lse_ref = fmha.reference(q, k, v, causal=True)
    o_tol, lse_tol = fmha.tolerances(q, k, v, o_ref, lse_ref, causal=True)
    assert fmha.max_error(o.float(), o_ref) <= o_tol and (lse - lse_ref).abs().max() <= lse_tol
    assert not hasattr(torch.ops.gfxasm, "mxfp8_gemm_with_lse")
    with pytest.raises(TypeError, match="fmha_fwd: unexpected keyword argument 'return_out'"):
        fmha.FMHA_FWD(q, k, v, True, None, *NO_FEATURES, return_out=True)
    with pytest.raises(TypeError, match="'return_lse' must be a bool, got int"):
        fmha.FMHA_FWD(q, k, v, True, None, *NO_FEATURES, return_lse=1)


def test_an_op_with_two_optional_outputs_is_refused_before_it_registers():
    """One `_with_<output>` functional op serves an optional output, so a Spec with two is
    refused (nothing registered)."""
    from gfxasm.ops import framework
    spec = framework.Spec("two_optional_outputs", params=(framework.Param("x", "Tensor"),),
                          outputs=(framework.Output("y"), framework.Output("a", optional=True),
                                   framework.Output("b", optional=True)),
                          check=lambda call: None, allocate=lambda call, names: {}, plan=lambda checked, call: None)
    with pytest.raises(ValueError, match="at most one optional output"):
        framework.define(spec)
    assert not hasattr(torch.ops.gfxasm, "two_optional_outputs")


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
        torch.ops.gfxasm.fmha_fwd(q, k, v, False, None, *NO_FEATURES)        # the op itself, too
    with pytest.raises(RuntimeError, match="fmha_fwd_out: 'q' requires grad"):
        gfxasm.fmha_fwd(q, k, v, out=torch.empty(q.shape, dtype=q.dtype))
    with torch.no_grad():
        assert gfxasm.fmha_fwd(q, k, v).grad_fn is None
    a, sa, b, sb = mx_operands()
    b = b.float().requires_grad_(True)                                  # fp8 cannot require grad
    with pytest.raises(RuntimeError, match="mxfp8_gemm: 'b' requires grad"):
        gfxasm.mxfp8_gemm(a, sa, b, sb)


def test_out_op_bumps_output_versions_and_refuses_grad_through_torch_ops():
    # what torch.library.custom_op's autograd and ADInplaceOrView kernels did, the one
    # kernel does (library.py): the _out op marks out (and lse) modified in place, on the
    # direct path and through the dispatcher, and refuses inputs that require grad there too
    q, k, v = qkv(seed=3)
    out, lse = nan_like(q.shape, q.dtype), nan_like((1, 2, 3), torch.float32)
    before = out._version, lse._version
    gfxasm.fmha_fwd(q, k, v, out=out)
    assert out._version > before[0] and lse._version == before[1]
    torch.ops.gfxasm.fmha_fwd_out(q, k, v, out, lse, False, None, *NO_FEATURES)
    assert out._version > before[0] + 1 and lse._version > before[1]
    expected, expected_lse = fmha.reference(q, k, v)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, expected_lse, atol=5e-3, rtol=5e-3)
    with pytest.raises(RuntimeError, match="fmha_fwd_out: 'k' requires grad"):
        torch.ops.gfxasm.fmha_fwd_out(q, k.clone().requires_grad_(True), v, out, None, False, None, *NO_FEATURES)
    versions = out._version, lse._version          # the eager out= call (no dispatcher) refuses it too, writing nothing
    with pytest.raises(RuntimeError, match="fmha_fwd_out: 'k' requires grad"):
        gfxasm.fmha_fwd(q, k.clone().requires_grad_(True), v, out=out)
    assert (out._version, lse._version) == versions



def test_repeated_out_call_runs_from_the_cache_with_every_per_call_check(monkeypatch):
    # a repeated out= layout goes from the arguments straight to the cached launch
    # (framework.Op._run_cached): each call's data, pointers and grad are still checked
    from gfxasm.ops import library
    q, k, v = qkv(seed=4, seq_q=3, seq_k=9, heads_q=4, heads_k=2)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(4))
    gfxasm.fmha_fwd(q, k, v, sinks=sinks, out=nan_like(q.shape, q.dtype))       # plans the layout

    def general_way(*args):
        raise AssertionError("a repeated out= layout went the general way")
    monkeypatch.setattr(library.Op, "run_direct", general_way)
    q2, k2, v2 = qkv(seed=5, seq_q=3, seq_k=9, heads_q=4, heads_k=2)
    sinks2 = torch.randn(4, generator=torch.Generator().manual_seed(5))
    out = nan_like(q.shape, q.dtype)
    version = out._version
    assert gfxasm.fmha_fwd(q2, k2, v2, sinks=sinks2, out=out) is out
    expected, _ = fmha.reference(q2, k2, v2, sinks=sinks2)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)      # this call's tensors, this out
    assert out._version > version
    with pytest.raises(ValueError, match="'sinks' must be finite, got inf for query head 2"):
        gfxasm.fmha_fwd(q2, k2, v2, sinks=sinks2.index_fill(0, torch.tensor([2]), float("inf")), out=out)
    base = torch.empty(q.numel() + 1, dtype=q.dtype)
    with pytest.raises(ValueError, match="'out' data must be 16-byte aligned"):
        gfxasm.fmha_fwd(q2, k2, v2, sinks=sinks2, out=base[1:].view(q.shape))
    memory = torch.empty(q.numel() + 128 * 4, dtype=q.dtype)
    q_in = memory[:q.numel()].view(q.shape).copy_(q2)
    with pytest.raises(ValueError, match="'out' overlaps the memory of 'q'"):       # in place, but shifted a row
        gfxasm.fmha_fwd(q_in, k2, v2, sinks=sinks2, out=memory[128 * 4:].view(q.shape))
    with pytest.raises(RuntimeError, match="fmha_fwd_out: 'v' requires grad"):
        gfxasm.fmha_fwd(q2, k2, v2.clone().requires_grad_(True), sinks=sinks2, out=out)


def test_repeated_functional_call_runs_from_the_cache_with_every_per_call_check(monkeypatch):
    # the same for a repeated functional layout (framework.Op._fresh_function's written-out call): fresh
    # outputs per call, this call's data and alignment checked
    from gfxasm.ops import framework
    q, k, v = qkv(seed=6, seq_q=3, seq_k=9, heads_q=4, heads_k=2)
    gfxasm.fmha_fwd(q, k, v, causal=True, return_lse=True)                          # plans the layout

    def general_way(*args):
        raise AssertionError("a repeated functional layout went the general way")
    monkeypatch.setattr(framework.Op, "_run_fresh", general_way)
    q2, k2, v2 = qkv(seed=7, seq_q=3, seq_k=9, heads_q=4, heads_k=2)
    out, lse = gfxasm.fmha_fwd(q2, k2, v2, causal=True, return_lse=True)
    again, lse_again = gfxasm.fmha_fwd(q2, k2, v2, causal=True, return_lse=True)
    assert again.data_ptr() != out.data_ptr() and lse_again.data_ptr() != lse.data_ptr()
    expected, expected_lse = fmha.reference(q2, k2, v2, causal=True)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, expected_lse, atol=5e-3, rtol=5e-3)
    base = torch.empty(q.numel() + 1, dtype=q.dtype)
    with pytest.raises(ValueError, match="'q' data must be 16-byte aligned"):
        gfxasm.fmha_fwd(base[1:].view(q.shape).copy_(q2), k2, v2, causal=True, return_lse=True)
    with pytest.raises(RuntimeError, match="fmha_fwd: 'k' requires grad"):
        gfxasm.fmha_fwd(q2, k2.clone().requires_grad_(True), v2, causal=True, return_lse=True)


# ------------------------------------------------------------------ decode_attention

def decode_inputs(seed=0, batch=2, seq_q=2, heads_q=4, heads_kv=2, dim=64, page=16, pages=7, seqlens=(37, 20)):
    """Random q, paged caches (page ids shuffled, one page unused) and cache_seqlens."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seq_q, heads_q, dim, generator=g).bfloat16()
    k, v = (torch.randn(pages, page, heads_kv, dim, generator=g).bfloat16() for _ in range(2))
    table = torch.randperm(pages, generator=g)[:batch * 3].to(torch.int32).view(batch, 3)
    return q, k, v, torch.tensor(seqlens, dtype=torch.int32), table


def decode_args(q, k, v, seqlens, table, k_descale=None, v_descale=None, pairs=(None, None), softmax_scale=None,
                causal=True, window_size=(-1, -1), sinks=None, num_splits=None, cache_leftpad=None, softcap=0.0):
    """The ops' positional arguments up to num_splits, in schema order."""
    return (q, k, v, seqlens, table, cache_leftpad, k_descale, v_descale, *pairs, softmax_scale, causal, *window_size,
            sinks, softcap, num_splits)


def test_opcheck_decode_attention():
    q, k, v, seqlens, table = decode_inputs()
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(1))
    torch.library.opcheck(torch.ops.gfxasm.decode_attention_with_lse.default,
                          decode_args(q, k, v, seqlens, table, sinks=sinks, num_splits=2))
    g = torch.Generator().manual_seed(2)
    k_flat, v_flat = (torch.randn(2, 40, 2, 64, generator=g).bfloat16() for _ in range(2))     # contiguous cache
    torch.library.opcheck(torch.ops.gfxasm.decode_attention_out.default,
                          decode_args(q, k_flat, v_flat, seqlens, None, softmax_scale=0.3, causal=False, window_size=(9, 2),
                                      cache_leftpad=torch.tensor([3, 0], dtype=torch.int32), softcap=20.0)
                          + (nan_like(q.shape, q.dtype), nan_like((2, 4, 2), torch.float32)))
    fp8 = torch.randn(k.shape, generator=g).to(torch.float8_e4m3fn)
    pairs = (da.random_pairs(k.shape, g), da.random_pairs(k.shape, g))
    torch.library.opcheck(torch.ops.gfxasm.decode_attention.default,
                          decode_args(q, fp8, fp8, seqlens, table, pairs=pairs), test_utils=NO_SCHEMA)


def test_decode_fp8_inputs_untouched():
    q, k, v, seqlens, table = decode_inputs(seed=3)
    g = torch.Generator().manual_seed(3)
    fp8 = torch.randn(k.shape, generator=g).to(torch.float8_e4m3fn)
    descales = (torch.tensor([0.5]), torch.tensor([1.25]))
    inputs = (q, fp8, seqlens, table, *descales)
    before = [t.view(torch.uint8).clone() if t.dtype == torch.float8_e4m3fn else t.clone() for t in inputs]
    out, lse = nan_like(q.shape, q.dtype), nan_like((2, 4, 2), torch.float32)
    torch.ops.gfxasm.decode_attention_out(*decode_args(q, fp8, fp8, seqlens, table, *descales), out, lse)
    after = [t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t for t in inputs]
    assert all(torch.equal(t, old) for t, old in zip(after, before))
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()


def test_decode_out_op_checks_lse():
    q, k, v, seqlens, table = decode_inputs()
    args = decode_args(q, k, v, seqlens, table)
    out = nan_like(q.shape, q.dtype)
    with pytest.raises(ValueError, match=r"decode_attention: 'lse' must be a contiguous float32 \[batch, heads_q, "
                                         r"seq_q\] = \[2, 4, 2\], got torch.float32 shape \(2, 2, 4\)"):
        torch.ops.gfxasm.decode_attention_out(*args, out, nan_like((2, 2, 4), torch.float32))
    both = torch.empty(q.numel() + 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="'lse' overlaps the memory of 'out'"):
        torch.ops.gfxasm.decode_attention_out(*args, both[:q.numel()].view(q.shape), both[:32].view(torch.float32)
                                              .view(2, 4, 2))


def test_decode_compile_fullgraph_equals_eager():
    q, k, v, seqlens, table = decode_inputs(seed=4)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(4))

    def f(q, k, v, seqlens, table, sinks, out):
        o, lse = gfxasm.decode_attention(q, k, v, seqlens, block_table=table, sinks=sinks, num_splits=2,
                                         return_lse=True)
        gfxasm.decode_attention(q, k, v, seqlens, block_table=table, window_size=(9, -1), out=out)
        return o, lse

    compiled = torch.compile(f, fullgraph=True)
    out_c, out_e = nan_like(q.shape, q.dtype), nan_like(q.shape, q.dtype)
    got = compiled(q, k, v, seqlens, table, sinks, out_c)
    want = f(q, k, v, seqlens, table, sinks, out_e)
    assert all(torch.equal(x, y) for x, y in zip(got, want))
    assert torch.equal(out_c, out_e) and not torch.isnan(out_c).any()
    o_ref, lse_ref, o_abs = da.reference(q, k, v, seqlens, block_table=table, sinks=sinks)   # eager is right
    assert ((want[0].double() - o_ref).abs() <= da.tolerance(o_ref, o_abs, q.dtype)).all()
    assert torch.allclose(want[1].double(), lse_ref, rtol=0, atol=da.LSE_TOL * max(1.0, lse_ref.abs().max()))


def test_decode_meta_tensors_give_shapes():
    q, k, v, seqlens, table = (t.to("meta") for t in decode_inputs(batch=3, seq_q=5, heads_q=8, dim=128,
                                                                     pages=10, seqlens=(1, 2, 3)))
    o, lse = gfxasm.decode_attention(q, k, v, seqlens, block_table=table, return_lse=True)
    assert (o.device.type, o.shape, o.dtype) == ("meta", (3, 5, 8, 128), torch.bfloat16)
    assert (lse.device.type, lse.shape, lse.dtype) == ("meta", (3, 8, 5), torch.float32)
    out = torch.empty(q.shape, dtype=q.dtype, device="meta")
    assert gfxasm.decode_attention(q, k, v, seqlens, block_table=table, out=out) is out
    with pytest.raises(ValueError, match=r"'sinks' must be \[8\]"):                   # fake kernels check too
        gfxasm.decode_attention(q, k, v, seqlens, block_table=table, sinks=torch.zeros(4, device="meta"))


def test_decode_requires_grad_refused():
    q, k, v, seqlens, table = decode_inputs()
    q.requires_grad_(True)
    with pytest.raises(RuntimeError, match="decode_attention: 'q' requires grad, but gfxasm ops have no backward"):
        gfxasm.decode_attention(q, k, v, seqlens, block_table=table)
    with pytest.raises(RuntimeError, match="'q' requires grad"):
        torch.ops.gfxasm.decode_attention(*decode_args(q, k, v, seqlens, table))   # the op itself, too
    with pytest.raises(RuntimeError, match="decode_attention_out: 'q' requires grad"):
        gfxasm.decode_attention(q, k, v, seqlens, block_table=table, out=torch.empty(q.shape, dtype=q.dtype))
    sinks = torch.zeros(4, requires_grad=True)
    with pytest.raises(RuntimeError, match="decode_attention: 'sinks' requires grad"):
        gfxasm.decode_attention(q.detach(), k, v, seqlens, block_table=table, sinks=sinks)
    with torch.no_grad():
        assert gfxasm.decode_attention(q, k, v, seqlens, block_table=table).grad_fn is None


def test_decode_repeat_call_checks_its_data():
    # a repeat of a layout reuses the checked plan: what the data can change is checked again
    q, k, v, seqlens, table = decode_inputs(seed=5)
    out = nan_like(q.shape, q.dtype)
    first = gfxasm.decode_attention(q, k, v, seqlens, block_table=table, out=out).clone()
    q2, k2, v2, _, _ = decode_inputs(seed=6)
    again = gfxasm.decode_attention(q2, k2, v2, seqlens, block_table=table, out=out)
    o_ref, _, o_abs = da.reference(q2, k2, v2, seqlens, block_table=table)
    assert ((again.double() - o_ref).abs() <= da.tolerance(o_ref, o_abs, q.dtype)).all()
    assert not torch.equal(again, first)
    with pytest.raises(ValueError, match=r"max\(cache_seqlens\) = 49 exceeds the cache: block_table holds 3 pages"):
        gfxasm.decode_attention(q, k, v, torch.tensor([49, 3], dtype=torch.int32), block_table=table, out=out)
    with pytest.raises(ValueError, match="'cache_seqlens' must be >= 0, got -1"):
        gfxasm.decode_attention(q, k, v, torch.tensor([-1, 3], dtype=torch.int32), block_table=table, out=out)
    with pytest.raises(ValueError, match="'out' overlaps the memory of 'q'"):
        gfxasm.decode_attention(q, k, v, seqlens, block_table=table, out=q)
    shifted = torch.empty(k.numel() + 1, dtype=k.dtype)[1:].view(k.shape).copy_(k)      # same strides, 2 bytes off
    with pytest.raises(ValueError, match="'k_cache' data must be 16-byte aligned"):
        gfxasm.decode_attention(q, shifted, v, seqlens, block_table=table, out=out)


# ------------------------------------------------------------------ MoE (issue 11)

def moe_operands(seed=0, T=3, top_k=2, E=4, H=64, I=32):
    """x, x_scale, w1, w1_scale, w2, w2_scale (e4m3 codes below 0x70, unit-ish scales), topk
    weights and distinct topk ids."""
    g = torch.Generator().manual_seed(seed)
    codes = lambda *s: torch.randint(0, 0x70, s, generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)  # noqa
    scales = lambda *s: torch.randint(118, 123, s, generator=g, dtype=torch.uint8).view(torch.float8_e8m0fnu)  # noqa
    ids = torch.stack([torch.randperm(E, generator=g)[:top_k] for _ in range(T)]).to(torch.int32)
    return (codes(T, H), scales(T, H // 32), codes(E, 2 * I, H), scales(E, 2 * I, H // 32), codes(E, H, I),
            scales(E, H, I // 32), torch.rand(T, top_k, generator=g), ids)


def test_opcheck_moe_ops():
    ids = moe_operands()[-1]
    torch.library.opcheck(torch.ops.gfxasm.moe_align_block_size.default, (ids, 16, 4, None, False, False))
    torch.library.opcheck(torch.ops.gfxasm.moe_align_block_size.default,
                          (ids, 32, 4, torch.tensor([1, -1, 0, 2], dtype=torch.int32), True, True))
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    torch.library.opcheck(torch.ops.gfxasm.swiglu_mxfp8_quant.default, (x, 1.702, 1.0, 7.0), test_utils=NO_SCHEMA)
    q, s = torch.empty(3, 64, dtype=torch.float8_e4m3fn), torch.empty(3, 2, dtype=torch.float8_e8m0fnu)
    torch.library.opcheck(torch.ops.gfxasm.swiglu_mxfp8_quant_out.default, (x, q, s, 1.702, 1.0, 7.0),
                          test_utils=NO_SCHEMA)
    args = moe_operands(seed=2)
    torch.library.opcheck(torch.ops.gfxasm.mxfp8_moe.default, (*args, None, 1.702, 1.0, 7.0, None),
                          test_utils=NO_SCHEMA)
    torch.library.opcheck(torch.ops.gfxasm.mxfp8_moe_out.default,
                          (*args, None, 1.702, 1.0, 7.0, 32, nan_like((3, 64), torch.bfloat16)), test_utils=NO_SCHEMA)


def test_moe_compile_fullgraph_equals_eager():
    args = moe_operands(seed=3)
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)

    def f(x, *args):
        sorted_ids, expert_ids, post = gfxasm.moe_align_block_size(args[-1], 16, 4)
        q, s = gfxasm.swiglu_mxfp8_quant(x)
        return sorted_ids, expert_ids, post, q.view(torch.uint8), s.view(torch.uint8), gfxasm.mxfp8_moe(*args)

    eager = f(x, *args)
    compiled = torch.compile(f, fullgraph=True)(x, *args)
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled))


def test_moe_meta_tensors_give_shapes():
    args = [t.to("meta") for t in moe_operands(T=5, top_k=3)]
    sorted_ids, expert_ids, post = gfxasm.moe_align_block_size(args[-1], 16, 4)
    assert (sorted_ids.device.type, sorted_ids.shape, expert_ids.shape, post.shape) == ("meta", (75,), (5,), (1,))
    q, s = gfxasm.swiglu_mxfp8_quant(torch.empty(5, 192, dtype=torch.float16, device="meta"))
    assert (q.shape, q.dtype, s.shape, s.dtype) == ((5, 96), torch.float8_e4m3fn, (5, 3), torch.float8_e8m0fnu)
    out = gfxasm.mxfp8_moe(*args)
    assert (out.device.type, out.shape, out.dtype) == ("meta", (5, 64), torch.bfloat16)
    with pytest.raises(ValueError, match="'w2' must be"):                 # the fake kernel checks too
        gfxasm.mxfp8_moe(*args[:4], args[4][:, :, :16], *args[5:])


def test_moe_requires_grad_refused():
    x = torch.randn(2, 64).to(torch.bfloat16).requires_grad_(True)
    with pytest.raises(RuntimeError, match="swiglu_mxfp8_quant: 'x' requires grad"):
        gfxasm.swiglu_mxfp8_quant(x)
    args = list(moe_operands())
    args[6] = args[6].requires_grad_(True)
    with pytest.raises(RuntimeError, match="mxfp8_moe: 'topk_weights' requires grad"):
        gfxasm.mxfp8_moe(*args)


# ------------------------------------------------------------------ batch_prefill (issue 10)

def prefill_inputs(seed=0, dtype=torch.bfloat16, page=16, seq_q=(3, 0, 5), seq_k=(20, 4, 33)):
    """q, caches and both page tables (SGLang's, vLLM's) of a shuffled pool."""
    g = torch.Generator().manual_seed(seed)
    counts = [-(-s // page) for s in seq_k]
    pages = torch.randperm(sum(counts) + 2, generator=g).to(torch.int32)
    k, v = (torch.randn(len(pages), page, 1, 128, generator=g).to(dtype) for _ in range(2))
    q = torch.randn(sum(seq_q), 2, 128, generator=g).to(dtype)
    qo = torch.tensor([0, *torch.tensor(seq_q).cumsum(0).tolist()], dtype=torch.int32)
    indptr = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32)
    last = torch.tensor([s - (n - 1) * page for s, n in zip(seq_k, counts)], dtype=torch.int32)
    table = torch.zeros(len(counts), max(counts), dtype=torch.int32)
    for b in range(len(counts)):
        table[b, :counts[b]] = pages[indptr[b]:indptr[b + 1]]
    return q, k, v, qo, (indptr, pages[:sum(counts)], last, None, None), (None, None, None, table,
                                                                          torch.tensor(seq_k, dtype=torch.int32))


def test_opcheck_batch_prefill():
    q, k, v, qo, sglang, vllm = prefill_inputs()
    no_scales = (None, None, None, None)
    torch.library.opcheck(torch.ops.gfxasm.batch_prefill_with_lse.default,
                          (q, k, v, qo, *sglang, True, None, *NO_FEATURES, *no_scales))
    torch.library.opcheck(torch.ops.gfxasm.batch_prefill_out.default,
                          (q, k, v, qo, *vllm, nan_like(q.shape, q.dtype), nan_like((2, 8), torch.float32), False,
                           0.3, *NO_FEATURES, *no_scales))
    q8, k8, v8, qo, sglang, _ = prefill_inputs(seed=1, dtype=torch.float8_e4m3fn)
    scales = (torch.tensor([0.5]), torch.tensor([1.5]), torch.tensor([0.75]), None)
    torch.library.opcheck(torch.ops.gfxasm.batch_prefill.default, (q8, k8, v8, qo, *sglang, True, None, *NO_FEATURES, *scales),
                          test_utils=NO_SCHEMA)


def test_batch_prefill_compile_fullgraph_equals_eager():
    q, k, v, qo, sglang, vllm = prefill_inputs(seed=2)
    indptr, pages, last, _, _ = sglang

    def f(q, k, v, qo, indptr, pages, last, table, seqlens, out):
        o, lse = gfxasm.batch_prefill(q, k, v, qo, kv_indptr=indptr, kv_page_indices=pages, kv_last_page_len=last,
                                      causal=True, return_lse=True)
        gfxasm.batch_prefill(q, k, v, qo, block_table=table, seqlens_k=seqlens, causal=True, out=out)
        return o, lse

    compiled = torch.compile(f, fullgraph=True)
    out_c, out_e = nan_like(q.shape, q.dtype), nan_like(q.shape, q.dtype)
    got = compiled(q, k, v, qo, indptr, pages, last, vllm[3], vllm[4], out_c)
    want = f(q, k, v, qo, indptr, pages, last, vllm[3], vllm[4], out_e)
    assert all(torch.equal(x, y) for x, y in zip(got, want))
    assert torch.equal(out_c, out_e) and torch.equal(out_e, want[0]) and not torch.isnan(out_c).any()


def test_batch_prefill_meta_and_grad():
    q, k, v, qo, sglang, _ = (t.to("meta") if isinstance(t, torch.Tensor) else t for t in prefill_inputs())
    sglang = tuple(t.to("meta") if t is not None else None for t in sglang)
    o, lse = gfxasm.batch_prefill(q, k, v, qo, kv_indptr=sglang[0], kv_page_indices=sglang[1],
                                  kv_last_page_len=sglang[2], return_lse=True)
    assert (o.device.type, o.shape, lse.shape) == ("meta", q.shape, (2, 8))
    q, k, v, qo, sglang, _ = prefill_inputs()
    with pytest.raises(RuntimeError, match="batch_prefill: 'q' requires grad"):
        gfxasm.batch_prefill(q.requires_grad_(True), k, v, qo, kv_indptr=sglang[0], kv_page_indices=sglang[1],
                             kv_last_page_len=sglang[2])


# ------------------------------------------------------------------ mxfp8_moe_gemm

def moe_inputs(seed=0):
    """T 3, top_k 2, E 4, N 19, K 64, block_m 16, every slot routed (so every output row is
    written: the functional op leaves unrouted rows uninitialised)."""
    from gfxasm.ops import moe_align
    gen = torch.Generator().manual_seed(seed)
    a, sa, _, _ = mx.random_operands(3, 1, 64, gen, **mx.OPERAND_RANGES[torch.float16])
    _, _, w, sw = mx.random_operands(1, 4 * 19, 64, gen, **mx.OPERAND_RANGES[torch.float16])
    ids = torch.stack([torch.randperm(4, generator=gen)[:2] for _ in range(3)]).flatten().tolist()
    sorted_ids, expert_ids, post = (torch.tensor(x, dtype=torch.int32).reshape(-1)
                                    for x in moe_align.reference(ids, 16, 4, None, True))
    return a, sa, w.view(4, 19, 64), sw.view(4, 19, 2), sorted_ids, expert_ids, post, torch.rand(3, 2, generator=gen)


def test_opcheck_mxfp8_moe_gemm():
    a, sa, w, sw, s, e, p, tw = moe_inputs()
    torch.library.opcheck(torch.ops.gfxasm.mxfp8_moe_gemm.default, (a, sa, w, sw, s, e, p, 2, tw, torch.bfloat16),
                          test_utils=NO_SCHEMA)
    torch.library.opcheck(torch.ops.gfxasm.mxfp8_moe_gemm_out.default,
                          (a, sa.view(torch.uint8), w, sw, s, e, p, 2, None, nan_like((6, 19), torch.float16),
                           torch.float16), test_utils=NO_SCHEMA)


def test_mxfp8_moe_gemm_compile_meta_grad():
    from gfxasm.ops import mxfp8_moe_gemm as moe
    a, sa, w, sw, s, e, p, tw = moe_inputs(seed=1)
    before = [t.view(torch.uint8).clone() for t in (a, sa, w, sw)]

    def f(a, sa, w, sw, s, e, p, tw, out):
        gfxasm.mxfp8_moe_gemm(a, sa, w, sw, s, e, p, a_div=2, topk_weights=tw, out=out)
        return gfxasm.mxfp8_moe_gemm(a, sa, w, sw, s, e, p, a_div=2, out_dtype=torch.float16)

    out_c, out_e = nan_like((6, 19), torch.bfloat16), nan_like((6, 19), torch.bfloat16)
    got = torch.compile(f, fullgraph=True)(a, sa, w, sw, s, e, p, tw, out_c)
    want = f(a, sa, w, sw, s, e, p, tw, out_e)
    assert torch.equal(got, want) and torch.equal(out_c, out_e) and not torch.isnan(out_c).any()
    assert all(torch.equal(t.view(torch.uint8), old) for t, old in zip((a, sa, w, sw), before))
    ref, written = moe.reference(a, sa, w, sw, s, e, p, 2, tw)          # eager itself is right, independently
    assert written.all() and torch.allclose(out_e.double(), ref, rtol=2.0 ** -7, atol=1e-3 * float(ref.abs().max()))
    meta = [t.to("meta") for t in (a, sa, w, sw, s, e, p)]
    out = gfxasm.mxfp8_moe_gemm(*meta, a_div=2, out_dtype=torch.float16)
    assert (out.device.type, out.shape, out.dtype) == ("meta", (6, 19), torch.float16)
    with pytest.raises(ValueError, match="'w_scale' must be"):          # fake kernels check too
        gfxasm.mxfp8_moe_gemm(*meta[:3], meta[3][:, :, :1], *meta[4:], a_div=2)
    with pytest.raises(RuntimeError, match="mxfp8_moe_gemm: 'topk_weights' requires grad"):
        gfxasm.mxfp8_moe_gemm(a, sa, w, sw, s, e, p, a_div=2, topk_weights=tw.requires_grad_(True))


# ------------------------------------------------------------------ the positional path of a repeated call

def refuse_general_way(monkeypatch):
    """From here a call that goes the framework's general way (a fresh check and plan, or
    a per-call bind) fails the test: only the cached positional path may run."""
    from gfxasm.ops import framework

    def general_way(*args):
        raise AssertionError("a repeated layout went the general way")
    monkeypatch.setattr(framework.Op, "_run", general_way)
    monkeypatch.setattr(framework.Op, "_run_fresh", general_way)


def prefill_out_args(q, k, v, qo, vllm, out, lse):
    """gfxasm::batch_prefill_out's positional arguments: a vLLM table, causal, no features."""
    return (q, k, v, qo, None, None, None, vllm["block_table"], vllm["seqlens_k"], out, lse, True, None,
            *NO_FEATURES, None, None, None, None)


def test_repeated_batch_prefill_runs_positionally_with_every_check(monkeypatch):
    # batch_prefill's plans are kept per layout and query tiles (its data_key); a vLLM
    # table's layout binds positionally: a repeated call, eager or through torch.ops, goes
    # from its arguments to the checks and the launch, reading this call's table and data
    from tests.test_batch_prefill import check_sequences, make_problem
    from gfxasm.ops import batch_prefill as bp
    bp.BATCH_PREFILL.clear_cache()

    def problem(seq_q, seq_k, seed):         # one layout for every seed: 8 pages, 4 table columns
        q, k, v, qo, sglang, vllm = make_problem(seq_q, seq_k, 16, 2, 1, torch.bfloat16, seed)
        return q, k, v, qo, vllm, bp.normalise(2, 16, k.shape[0], **sglang)

    q, k, v, qo, vllm, _ = problem([3, 2], [20, 33], 11)
    lse = nan_like((2, 5), torch.float32)
    gfxasm.batch_prefill(q, k, v, qo, **vllm, causal=True, return_lse=True)                 # plans the layouts
    gfxasm.batch_prefill(q, k, v, qo, **vllm, causal=True, out=nan_like(q.shape, q.dtype))
    torch.ops.gfxasm.batch_prefill_out(*prefill_out_args(q, k, v, qo, vllm, nan_like(q.shape, q.dtype), lse))
    refuse_general_way(monkeypatch)
    for seq_q, seq_k, seed in (([3, 2], [33, 20], 12), ([1, 4], [40, 17], 13)):    # max seqlen_q 3, then 4: one tile
        q, k, v, qo, vllm, table = problem(seq_q, seq_k, seed)
        o, lse = gfxasm.batch_prefill(q, k, v, qo, **vllm, causal=True, return_lse=True)
        o_ref, lse_ref = bp.reference(q, k, v, qo, *table, causal=True)
        check_sequences(q, k, v, qo, table, o, lse, o_ref, lse_ref, seq_q, seq_k, True)
        out, lse_out = nan_like(q.shape, q.dtype), nan_like((2, 5), torch.float32)
        torch.ops.gfxasm.batch_prefill_out(*prefill_out_args(q, k, v, qo, vllm, out, lse_out))
        again = nan_like(q.shape, q.dtype)
        assert gfxasm.batch_prefill(q, k, v, qo, **vllm, causal=True, out=again) is again
        assert torch.equal(out.view(torch.int16), o.view(torch.int16)) and torch.equal(lse_out, lse)
        assert torch.equal(again.view(torch.int16), o.view(torch.int16))
    bad = vllm["block_table"].clone()
    bad[1, 0] = k.shape[0]
    with pytest.raises(ValueError, match="'block_table' holds page ids outside the pool"):
        gfxasm.batch_prefill(q, k, v, qo, **dict(vllm, block_table=bad), causal=True, return_lse=True)
    base = torch.empty(q.numel() + 1, dtype=q.dtype)
    with pytest.raises(ValueError, match="'out' data must be 16-byte aligned"):
        gfxasm.batch_prefill(q, k, v, qo, **vllm, causal=True, out=base[1:].view(q.shape))
    memory = torch.empty(q.numel() + 128 * 2, dtype=q.dtype)
    q_in = memory[:q.numel()].view(q.shape).copy_(q)
    with pytest.raises(ValueError, match="'out' overlaps the memory of 'q'"):
        torch.ops.gfxasm.batch_prefill_out(*prefill_out_args(q_in, k, v, qo, vllm, memory[256:].view(q.shape),
                                                             nan_like((2, 5), torch.float32)))
    with pytest.raises(RuntimeError, match="batch_prefill: 'v_cache' requires grad"):
        gfxasm.batch_prefill(q, k, v.clone().requires_grad_(True), qo, **vllm, causal=True, return_lse=True)
    monkeypatch.undo()
    with pytest.raises(TypeError, match="'out' dtype must be torch.bfloat16"):     # a changed layout: checked anew
        gfxasm.batch_prefill(q, k, v, qo, **vllm, causal=True, out=nan_like(q.shape, torch.float16))


def test_repeated_moe_layer_runs_positionally_with_fresh_intermediates(monkeypatch):
    # the layer's plans bind positionally, its intermediates fresh per call (Plan.scratch):
    # the one-launch form's counter is zero at every launch, whatever the last call left in
    # its own; the checks of a repeated call are those of its first
    from tests.test_moe import check_layer
    from gfxasm import launcher
    from gfxasm.ops import moe_layer
    moe_layer.MXFP8_MOE.clear_cache()
    check_layer(1, 4, 8, 64, 32, None, "random", seed=1)             # plans the one-launch and sorted forms
    check_layer(2, 2, 8, 64, 32, 16, "random", seed=1)
    refuse_general_way(monkeypatch)
    _, one_args = check_layer(1, 4, 8, 64, 32, None, "random", seed=2)    # this call's operands, against the reference
    out, args = check_layer(2, 2, 8, 64, 32, 16, "random", seed=2)
    flags = []

    def launch(co_path, symbol, grid, block, kernarg, buffers, schedule):
        # the scratch buffers come as spans (allocation, byte offset, byte count) of one
        # allocation, in the layout's order (q, scale, flag): the counter is the last
        scratch, at, size = max((b for b in buffers if isinstance(b, tuple)), key=lambda b: b[1])
        assert size == 4
        flag = scratch[at:at + 4].view(torch.uint32)
        flags.append((scratch, int(flag)))
        flag.fill_(7)                     # as the kernel leaves it
    monkeypatch.setattr(launcher.emu_backend, "launch", launch)
    for _ in range(2):
        gfxasm.mxfp8_moe(**one_args, out=torch.empty(1, 64, dtype=torch.bfloat16))
    assert [value for _, value in flags] == [0, 0] and flags[0][0] is not flags[1][0]
    # only the one-launch form's scratch is zeroed (the sorted form's y alone can be GBs)
    zeroing = {cached.direct.plan.launches[-1].variant: cached.direct.scratch.func is torch.zeros
               for cached in moe_layer.MXFP8_MOE._cache.values()}
    assert zeroing == {moe_layer.FUSED_KERNEL + "_bf16": True, "moe_sum": False}, zeroing
    x = args["x"]
    base = torch.empty(x.numel() + 16, dtype=x.dtype)
    with pytest.raises(ValueError, match="'x' data must be 16-byte aligned"):
        gfxasm.mxfp8_moe(**dict(args, x=base[1:x.numel() + 1].view(x.shape).copy_(x)), block_m=16, out=out)
    memory = torch.empty(x.numel() + out.numel() * 2, dtype=torch.uint8)
    x_in = memory[:x.numel()].view(x.dtype).view(x.shape).copy_(x)
    with pytest.raises(ValueError, match="'out' overlaps the memory of 'x'"):
        gfxasm.mxfp8_moe(**dict(args, x=x_in), block_m=16, out=memory[:out.numel() * 2].view(torch.bfloat16)
                         .view(out.shape))
    with pytest.raises(RuntimeError, match="mxfp8_moe_out: 'topk_weights' requires grad"):
        gfxasm.mxfp8_moe(**dict(args, topk_weights=args["topk_weights"].clone().requires_grad_(True)), block_m=16,
                         out=out)


def test_pointer_checks_expression_refuses_exactly_what_the_rule_refuses():
    # framework._PointerChecks.passes, one expression per layout, against the rule written
    # here: each declared address aligned, an output's bytes meeting no input's but the
    # one it may alias exactly; where it fails, Op._check_pointers names the problem
    import itertools
    from gfxasm.ops import framework
    pairs = (("out", 64, "q", 64, True), ("out", 64, "k", 32, False), ("lse", 16, "out", 64, False))
    checks = framework._PointerChecks((("q", 16), ("out", 16)), pairs, {"q": 0, "k": 1, "out": 2, "lse": 3})
    places = range(0, 144, 8)
    counts = collections.Counter()
    for q, k, out, lse in itertools.product(places, places[::3], places, places[::4]):
        args = tuple(4096 + a for a in (q, k, out, lse))                    # the call's addresses
        at = dict(q=q, k=k, out=out, lse=lse)
        meets = [at[o] < at[n] + size and at[n] < at[o] + o_size and not (alias and at[o] == at[n])
                 for o, o_size, n, size, alias in pairs]
        expected = q % 16 == 0 and out % 16 == 0 and not any(meets)
        assert checks.passes(args) == expected, at
        counts[expected] += 1
        if not expected:
            with pytest.raises(ValueError, match="data must be 16-byte aligned|overlaps the memory of"):
                fmha.FMHA_FWD._check_pointers(args, checks)
    assert counts[True] > 100 and counts[False] > 100
