"""gfxasm.mxfp8_gemm on the strict gfx950 emulator against the exact product of the same
quantized values (gfxasm.ops.mxfp8_gemm.reference, float64 -> float32).

Inputs: random e4m3 codes (every finite code: zeros, subnormals, +-448) and NON-uniform
random E8M0 scales per 32-block (2^-6 .. 2^6 around a centre), so a wrong K order in the
scaled MFMA, a scale applied to the wrong block, or a lost tail chunk changes the answer.

Tolerance per element (error_bound): the final bf16/fp16 rounding (2^-8 / 2^-11 relative)
plus (K/16 + 128) f32 roundings of sum_k |a_k b_k| for the accumulation; and the relative
Frobenius error must stay below 2^-7 (bf16) / 2^-10 (fp16).

Memory safety: a and b sit inside larger buffers whose neighbouring bytes are fp8 NaN (0x7F),
and out inside a larger NaN-poisoned buffer. A read past a tensor would bring NaN into the
result; a stray store would overwrite the poison around out; an element left unwritten stays
NaN. All three are checked.

Shapes: M in {1, 2, 3, 4, 8, 15, 16, 17, 32, 64, 100, 256}, N including non-multiples of every
tile (8, 4, 2 rows for the GEMV; 64, 32 columns for the MFMA kernel), K in {32, 96, 4096, 7168}
(one 32-block, a partial 128-step, whole 1 KiB chunks, a partial chunk); large K runs at small N
to keep this file's emulator time to about a minute. M in {1, 3, 4, 8, 15, 16} runs through both kernels;
split-K (the second pass) runs forced and as chosen.
"""
from __future__ import annotations


import pytest
import torch

import gfxasm

from gfxasm.ops import mxfp8_gemm as mx

E4M3, E8M0 = torch.float8_e4m3fn, torch.float8_e8m0fnu
FP8_NAN = 0x7F


@pytest.fixture(scope="module", autouse=True)
def built():
    mx.build_kernels()      # this op's kernels only: another kernel mid-edit cannot fail these tests


def embedded(t: torch.Tensor, fill: float | int, before: int = 64, after: int = 80):
    """(view, base): t copied into the middle of a larger 1-D buffer full of `fill`, at a
    16-byte-aligned offset; the view is contiguous and has t's shape."""
    if t.dtype == E4M3:
        base = torch.full((before + t.numel() + after,), fill, dtype=torch.uint8).view(E4M3)
    else:
        base = torch.full((before + t.numel() + after,), fill, dtype=t.dtype)
    view = base[before:before + t.numel()].view(t.shape)
    view.copy_(t)
    return view, base


def check(M, N, K, kernel="auto", out_dtype=torch.bfloat16, splits=None, seed=0, scale_dtype=E8M0):
    gen = torch.Generator().manual_seed(1000 * M + 10 * K + N + seed)
    a, a_scale, b, b_scale = mx.random_operands(M, N, K, gen, **mx.OPERAND_RANGES[out_dtype])
    if scale_dtype == torch.uint8:
        a_scale, b_scale = a_scale.view(torch.uint8), b_scale.view(torch.uint8)
    a_in, a_base = embedded(a, FP8_NAN)
    b_in, b_base = embedded(b, FP8_NAN)
    out, out_base = embedded(torch.full((M, N), float("nan"), dtype=out_dtype), float("nan"))
    result = gfxasm.mxfp8_gemm(a_in, a_scale, b_in, b_scale, out=out, out_dtype=out_dtype, kernel=kernel,
                               splits=splits)
    assert result is out
    ref = mx.reference(a, a_scale, b, b_scale).double()
    bound = mx.error_bound(a, a_scale, b, b_scale, out_dtype)
    got = out.double()
    assert not torch.isnan(got).any(), f"{int(torch.isnan(got).sum())} of {M * N} outputs left unwritten (NaN)"
    err = (got - ref).abs()
    worst = int(torch.argmax(err / bound))
    assert (err <= bound).all(), (f"{int((err > bound).sum())} outputs off; worst [{worst // N}, {worst % N}]: "
                                  f"{got.view(-1)[worst]:.6g} vs {ref.view(-1)[worst]:.6g} (bound {bound.view(-1)[worst]:.3g})")
    rel = float((got - ref).norm() / ref.norm())
    assert rel <= (2.0 ** -7 if out_dtype == torch.bfloat16 else 2.0 ** -10), f"relative error {rel:.3g}"
    poison = torch.cat([out_base[:64], out_base[64 + M * N:]])
    assert torch.isnan(poison).all(), "a store landed outside out"
    assert torch.equal(a_base.view(torch.uint8)[64 + M * K:], torch.full((80,), FP8_NAN, dtype=torch.uint8))
    assert torch.equal(b_base.view(torch.uint8)[64 + N * K:], torch.full((80,), FP8_NAN, dtype=torch.uint8))


# (M, N, K): GEMV cases (M <= 16); N not a multiple of the 8/4/2-row tiles where possible
GEMV_CASES = [
    (1, 13, 32), (1, 9, 96), (1, 21, 4096), (1, 5, 7168),
    (2, 7, 96), (2, 6, 4096), (2, 3, 7168),
    (3, 11, 32), (3, 5, 4096),
    (4, 9, 96), (4, 3, 7168),
    (8, 6, 96), (8, 5, 4096),
    (15, 7, 32), (15, 3, 4096),
    (16, 5, 96), (16, 3, 7168),
]
# MFMA cases (any M; auto takes it from M = 3); N not a multiple of the 64/32-column tiles
MFMA_CASES = [
    (1, 19, 96), (3, 70, 4096), (4, 9, 7168),
    (8, 70, 96), (8, 33, 4096),
    (15, 17, 7168), (16, 65, 32), (16, 40, 4096),
    (17, 40, 96), (17, 20, 7168),
    (32, 65, 32), (32, 33, 4096),
    (64, 31, 96), (64, 20, 7168),
    (100, 17, 96), (100, 33, 4096),
    (256, 9, 32), (256, 20, 4096),
]


@pytest.mark.parametrize("M,N,K", GEMV_CASES, ids=lambda v: str(v))
def test_gemv(M, N, K):
    check(M, N, K, kernel="gemv")


@pytest.mark.parametrize("M,N,K", MFMA_CASES, ids=lambda v: str(v))
def test_mfma(M, N, K):
    check(M, N, K, kernel="mfma")


@pytest.mark.parametrize("kernel,M,N,K,splits", [
    ("gemv", 1, 20, 7168, 2),          # 7 chunks over 8 workers: one worker has none
    ("gemv", 3, 9, 4096, 4),           # every worker one chunk
    ("gemv", 16, 3, 7168, 3),          # splits need not be a power of two
    ("mfma", 16, 40, 4096, 4),
    ("mfma", 17, 20, 7168, 16),        # 56 steps over 64 workers, batches of 8 in the reduce
    ("mfma", 100, 33, 4096, 2),
])
def test_split_k(kernel, M, N, K, splits):
    check(M, N, K, kernel=kernel, splits=splits)


@pytest.mark.parametrize("kernel,M,N,K", [("gemv", 4, 9, 96), ("mfma", 17, 40, 96), ("gemv", 1, 5, 4096),
                                          ("mfma", 64, 20, 4096)])
def test_fp16_output(kernel, M, N, K):
    check(M, N, K, kernel=kernel, out_dtype=torch.float16)


def test_auto_chooses_by_m():
    assert mx.plan(1, 4096, 7168).kind == "gemv" and mx.plan(2, 4096, 7168).kind == "gemv"
    assert mx.plan(3, 4096, 7168).kind == "mfma" and mx.plan(256, 4096, 7168).kind == "mfma"
    assert mx.plan(3, 8, 32, kernel="gemv").kernel == "mxfp8_gemv_m4"
    assert mx.plan(17, 8, 32).kernel == "mxfp8_gemm_m32" and mx.plan(100, 8, 32).kernel == "mxfp8_gemm_m64"


def test_auto_runs_both_ends():
    check(1, 12, 4096)          # auto: GEMV
    check(24, 40, 1024)         # auto: MFMA


def test_splits_heuristic():
    # plenty of weight rows: no split; few rows and deep K: split, within the workers' chunks
    assert mx.plan(1, 36864, 7168).splits == 1
    assert mx.plan(16, 36864, 7168).splits == 1
    small = mx.plan(16, 768, 7168)
    assert small.kind == "mfma" and small.splits > 1 and 4 * small.splits <= 7168 // 128 // 2
    gemv = mx.plan(1, 256, 7168)
    assert 4 * gemv.splits <= 7                                  # every K worker keeps a 1 KiB chunk
    starved = mx.plan(8, 1024, 6144)                             # 16 workgroups: split, despite the second pass
    assert starved.splits > 1 and 4 * starved.splits <= 6144 // 128 // 2
    for M, N, K in [(1, 768, 7168), (16, 768, 7168), (64, 1280, 6144), (8, 36864, 7168)]:
        chosen = mx.plan(M, N, K)
        assert chosen.splits == 1 or chosen.splits % 2 == 0


def test_uint8_scales():
    check(3, 10, 96, kernel="gemv", scale_dtype=torch.uint8)
    check(9, 10, 96, kernel="mfma", scale_dtype=torch.uint8)


def test_allocates_out():
    gen = torch.Generator().manual_seed(3)
    a, a_scale, b, b_scale = mx.random_operands(2, 6, 64, gen, **mx.OPERAND_RANGES[torch.float16])
    out = gfxasm.mxfp8_gemm(a, a_scale, b, b_scale, out_dtype=torch.float16)
    assert out.dtype == torch.float16 and out.shape == (2, 6)
    ref = mx.reference(a, a_scale, b, b_scale).double()
    assert ((out.double() - ref).abs() <= mx.error_bound(a, a_scale, b, b_scale, torch.float16)).all()


def test_reference_known_answer():
    # a = [1, 2, ...] in block 0 scaled by 2^1 and [0.5 ...] in block 1 scaled by 2^-2
    a = torch.cat([torch.full((1, 32), 1.0), torch.full((1, 32), 0.5)], dim=1).to(E4M3)
    b = torch.cat([torch.full((1, 32), 2.0), torch.full((1, 32), -3.0)], dim=1).to(E4M3)
    a_scale = torch.tensor([[128, 125]], dtype=torch.uint8)
    b_scale = torch.tensor([[127, 130]], dtype=torch.uint8)
    expected = 32 * (1.0 * 2 * 2.0 * 1) + 32 * (0.5 * 0.25 * -3.0 * 8)
    assert mx.reference(a, a_scale, b, b_scale).item() == expected
    assert torch.isnan(mx.reference(a, torch.tensor([[255, 127]], dtype=torch.uint8), b, b_scale)).all()


# ------------------------------------------------------------------ bad inputs

def good(M=2, N=5, K=64):
    return mx.random_operands(M, N, K, torch.Generator().manual_seed(0))


def raises(exc, match, *args, **kwargs):
    with pytest.raises(exc, match=match):
        gfxasm.mxfp8_gemm(*args, **kwargs)


def test_bad_dtypes(no_launch):
    a, sa, b, sb = good()
    raises(TypeError, r"'a' dtype must be torch.float8_e4m3fn, got torch.float16", a.half(), sa, b, sb)
    raises(TypeError, r"'b' dtype must be torch.float8_e4m3fn, got torch.float8_e5m2", a, sa,
           b.view(torch.uint8).view(torch.float8_e5m2), sb)
    raises(TypeError, r"'b_scale' dtype must be torch.float8_e8m0fnu or torch.uint8.*got torch.float32", a, sa, b,
           sb.float())
    raises(TypeError, r"'out_dtype' must be torch.bfloat16 or torch.float16, got torch.float32", a, sa, b, sb,
           out_dtype=torch.float32)
    raises(TypeError, r"'out' dtype must be out_dtype \(torch.bfloat16\), got torch.float16", a, sa, b, sb,
           out=torch.empty(2, 5, dtype=torch.float16))
    raises(TypeError, r"'a' must be a torch.Tensor.*got list", [[1.0]], sa, b, sb)


def test_bad_k(no_launch):
    a, sa, b, sb = good(K=64)
    raises(ValueError, r"K \(a.shape\[1\]\) must be a multiple of 32, got 48",
           a[:, :48].contiguous(), sa[:, :1].contiguous(), b[:, :48].contiguous(), sb[:, :1].contiguous())


def test_shape_mismatch(no_launch):
    a, sa, b, sb = good(M=2, N=5, K=64)
    b96 = good(N=5, K=96)[2]
    raises(ValueError, r"'b' must be \[N, K\] with K = 64 \(a's\), got shape \(5, 96\)", a, sa, b96, sb)
    raises(ValueError, r"'a_scale' must be \[2, 2\].*got shape \(2, 3\)", a, torch.zeros(2, 3, dtype=torch.uint8), b, sb)
    raises(ValueError, r"'b_scale' must be \[5, 2\].*got shape \(4, 2\)", a, sa, b, sb[:4])
    raises(ValueError, r"'out' must be \[M, N\] = \[2, 5\], got shape \(5, 2\)", a, sa, b, sb,
           out=torch.empty(5, 2, dtype=torch.bfloat16))
    raises(ValueError, r"'a' must be 2-D.*got shape \(2, 1, 64\)", a.unsqueeze(1), sa, b, sb)


def test_unsupported_strides(no_launch):
    a, sa, b, sb = good(M=2, N=5, K=64)
    wide = torch.zeros(5, 128, dtype=torch.uint8).view(E4M3)
    raises(ValueError, r"'b' must be contiguous.*strides \(64, 1\)\), got strides \(128, 1\)", a, sa, wide[:, :64], sb)
    at = torch.zeros(64, 2, dtype=torch.uint8).view(E4M3).T
    raises(ValueError, r"'a' must be contiguous.*got strides \(1, 2\)", at, sa, b, sb)
    raises(ValueError, r"'a_scale' must be contiguous", a, torch.zeros(2, 4, dtype=torch.uint8)[:, ::2], b, sb)
    raises(ValueError, r"'out' must be contiguous", a, sa, b, sb, out=torch.empty(5, 2, dtype=torch.bfloat16).T)


def test_buffer_beyond_32bit_offsets(no_launch):
    # meta tensors stand in for the big ones: nothing is allocated
    K = 8192
    big_b = torch.empty((2**31 // K, K), dtype=E4M3, device="meta")                  # exactly 2^31 bytes
    big_sb = torch.empty((2**31 // K, K // 32), dtype=E8M0, device="meta")
    a = torch.empty((1, K), dtype=E4M3, device="meta")
    sa = torch.empty((1, K // 32), dtype=E8M0, device="meta")
    raises(ValueError, r"'b' is 2147483648 bytes.*below 2\^31 bytes", a, sa, big_b, big_sb)
    big_a = torch.empty((2**31 // K, K), dtype=E4M3, device="meta")
    big_sa = torch.empty((2**31 // K, K // 32), dtype=E8M0, device="meta")
    b = torch.empty((8, K), dtype=E4M3, device="meta")
    sb = torch.empty((8, K // 32), dtype=E8M0, device="meta")
    raises(ValueError, r"'a' is 2147483648 bytes", big_a, big_sa, b, sb, kernel="mfma")
    # an output of 2^31 bytes or more
    rows = torch.empty((2**15, 32), dtype=E4M3, device="meta")
    row_scales = torch.empty((2**15, 1), dtype=E8M0, device="meta")
    raises(ValueError, r"output \[M, N\] = \[32768, 32768\] would be 2147483648 bytes", rows, row_scales, rows,
           row_scales)
    # within range, meta tensors give the output's shape (the op's fake kernel); nothing runs
    assert gfxasm.mxfp8_gemm(a, sa, b, sb).shape == (1, 8)


def test_bad_kernel_choice(no_launch):
    a, sa, b, sb = good(M=17, K=32)
    raises(ValueError, r"kernel='gemv' takes M <= 16, got M = 17", a, sa, b, sb, kernel="gemv")
    a, sa, b, sb = good(M=4, K=32)
    raises(ValueError, r"'kernel' must be one of 'auto', 'gemv', 'mfma', got 'cublas'", a, sa, b, sb, kernel="cublas")
    raises(ValueError, r"'splits' must be an int in \[1, 16\] or None, got 0", a, sa, b, sb, splits=0)


def test_device_and_alignment(no_launch):
    a, sa, b, sb = good(M=2, N=5, K=64)
    raises(ValueError, r"'b' must be on a's device \(cpu\), got meta", a, sa, b.to("meta"), sb)
    shifted = torch.zeros(2 * 64 + 8, dtype=torch.uint8).view(E4M3)[8:].view(2, 64)
    raises(ValueError, r"'a' data must be 16-byte aligned", shifted, sa, b, sb)


def test_out_overlapping_an_input_is_refused(no_launch):
    a, sa, b, sb = good(M=2, N=32, K=64)
    # out [2, 32] bf16 = 128 bytes = b's first two rows: the same memory, another dtype
    raises(ValueError, r"'out' overlaps the memory of 'b'", a, sa, b, sb, out=b.view(torch.bfloat16)[:2])
    raises(ValueError, r"'out' overlaps the memory of 'a'", a, sa, b, sb, out=a.view(torch.bfloat16).view(2, 32))
    scales = torch.zeros(64 + 64, dtype=torch.uint8)
    raises(ValueError, r"'out' overlaps the memory of 'b_scale'", a, sa, b, scales[64:].view(32, 2),
           out=scales.view(torch.bfloat16).view(2, 32))


def test_out_with_shared_elements_is_refused(no_launch):
    a, sa, b, sb = good(M=2, N=5, K=64)
    raises(ValueError, r"'out' must be contiguous", a, sa, b, sb,
           out=torch.empty(1, 5, dtype=torch.bfloat16).expand(2, 5))


def test_blocked_scales_are_refused(no_launch):
    """The cuBLAS / torch._scaled_mm blocked layout pads rows to 128 and K/32 to 4."""
    a, sa, b, sb = good(M=2, N=5, K=64)
    blocked_a = torch.zeros(128 * 4, dtype=torch.uint8)
    raises(ValueError, r"'a_scale' must be \[2, 2\].*size of the blocked \(swizzled 128x4-tile\) scale layout", a,
           blocked_a, b, sb)
    raises(ValueError, r"'b_scale' must be \[5, 2\].*blocked", a, sa, b, torch.zeros(128, 4, dtype=torch.uint8))
    raises(ValueError, r"'b_scale' must be \[5, 2\] .*got shape \(10,\)$", a, sa, b, sb.view(-1))   # plain, flat


def test_empty_like_torch():
    a, sa, b, sb = good(M=3, N=5, K=64)
    assert gfxasm.mxfp8_gemm(a[:0], sa[:0], b, sb).shape == (0, 5)               # M = 0, as torch.mm
    assert gfxasm.mxfp8_gemm(a, sa, b[:0], sb[:0], out_dtype=torch.float16).shape == (3, 0)
    out = torch.full((3, 5), float("nan"), dtype=torch.bfloat16)
    result = gfxasm.mxfp8_gemm(a[:, :0], sa[:, :0], b[:, :0], sb[:, :0], out=out)     # K = 0: zeros
    assert result is out and torch.equal(out, torch.zeros(3, 5, dtype=torch.bfloat16))


def scaled_overflow_operands():
    """M = 2, N = 3, K = 64, where the GEMV's f32 scaling overflows but the exact products are
    finite: a[0, 5] = 2 and a[1, 40] = -2 at scale byte 254 (2 x 2^127 = 2^128), b's scales
    2^-27 for columns 0 and 2 (products 2^101) and 2^0 for column 1 (-2^128: -inf in f32 too)."""
    a, b = torch.ones(2, 64).to(E4M3), torch.ones(3, 64).to(E4M3)
    a_scale, b_scale = torch.full((2, 2), 127, dtype=torch.uint8), torch.full((3, 2), 100, dtype=torch.uint8)
    a[0, 5], a[1, 32:] = 2.0, 0.0
    a[1, 40] = -2.0
    a_scale[0, 0], a_scale[1, 1], b_scale[1, 1] = 254, 254, 127
    return a, a_scale, b, b_scale


def test_gemv_scaled_overflow_is_refused(no_launch):
    """Issue 26 (crash 7): the GEMV scales each element in f32 before the dot product, so
    |x| 2^(s - 127) >= 2^128 becomes inf there; on CPU tensors such a call is refused before
    launch (first call and cached layout alike), naming the operand, for 'gemv' and 'auto'."""
    a, sa, b, sb = scaled_overflow_operands()
    for kernel in ("gemv", "auto"):
        raises(ValueError, r"'a' row 0, block 0: 2.0 x 2\^\(254 - 127\) reaches 2\^128.*pass kernel='mfma'", a, sa,
               b, sb, kernel=kernel)
    with pytest.raises(AssertionError, match="a kernel was launched"):
        gfxasm.mxfp8_gemm(a, sa, b, sb, kernel="mfma")                      # the MFMA kernel takes them
    fine = torch.ones(2, 64).to(E4M3), torch.full((2, 2), 127, dtype=torch.uint8)
    with pytest.raises(AssertionError, match="a kernel was launched"):
        gfxasm.mxfp8_gemm(*fine, b, sb, kernel="gemv")                      # plans (and caches) this layout
    # the cached layout is checked again; the limit at byte 247 is 2^8: 240 passes, 256 does not
    big_b = torch.ones(3, 64).to(E4M3)
    big_b[2, 63] = 240.0
    edge = sb.clone()
    edge[2, 1] = 247
    with pytest.raises(AssertionError, match="a kernel was launched"):
        gfxasm.mxfp8_gemm(*fine, big_b, edge, kernel="gemv")
    big_b[2, 63] = 256.0
    raises(ValueError, r"'b' row 2, block 1: 256.0 x 2\^\(247 - 127\) reaches 2\^128", *fine, big_b, edge,
           kernel="gemv")
    nan_scale = sb.clone()
    nan_scale[0, 0] = 255                                                    # NaN: not an overflow
    with pytest.raises(AssertionError, match="a kernel was launched"):
        gfxasm.mxfp8_gemm(*fine, b, nan_scale, kernel="gemv")


def test_mfma_scaled_overflow_matches_the_reference():
    """The operands the GEMV refuses: the MFMA kernel scales the products, not the elements,
    and gives the float64 reference's finite values and its -inf where the product is."""
    a, sa, b, sb = scaled_overflow_operands()
    out = gfxasm.mxfp8_gemm(a, sa, b, sb, kernel="mfma")
    ref = mx.reference(a, sa, b, sb).double()
    assert torch.equal(ref.isinf(), torch.tensor([[False, False, False], [False, True, False]]))
    assert torch.equal(out.isinf(), ref.isinf()) and out[1, 1] == ref[1, 1]
    finite = ~ref.isinf()
    assert ((out.double() - ref).abs()[finite] <= mx.error_bound(a, sa, b, sb)[finite]).all()


def test_pointer_checks_survive_the_plan_cache(no_launch):
    a, sa, b, sb = good(M=2, N=5, K=64)
    with pytest.raises(AssertionError, match="a kernel was launched"):
        gfxasm.mxfp8_gemm(a, sa, b, sb)                                 # plans this layout, reaches the launch
    shifted = torch.zeros(2 * 64 + 8, dtype=torch.uint8).view(E4M3)[8:].view(2, 64)
    raises(ValueError, r"'a' data must be 16-byte aligned", shifted, sa, b, sb)
