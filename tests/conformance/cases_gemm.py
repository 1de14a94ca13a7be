"""Launch recipes for the corpus GEMMs (see cases.py for what a recipe is).

Each kernarg is written field by field from the wheel's host code (cited per recipe);
every field sits in a 16-byte slot (a pointer + `p2`, or a 32-bit value + `p3`,
csrc/include/aiter_hip_common.h).
"""
from __future__ import annotations

import math

import torch

from .cases import Case, Kernarg, aiter_symbol, bf16_gemm_kernarg, poison


# ----------------------------------------------------------------- bf16 GEMM, fp32 out
def bf16gemm_outf32(M: int, N: int, K: int, tile_m: int, seed: int = 0) -> Case:
    """D[M, N] f32 = A[M, K] @ B[N, K]^T, bf16 in. aiter_meta/csrc/py_itfs_cu/asm_gemm_a16w16.cu,
    struct KernelArgs and gemm_a16w16_asm(): strides in bytes (A/B rows K*2, C and D rows
    N*4; the host sets stride_C0/A0/B0, the kernel stores D with stride_C0), alpha 1, beta
    0, ptr_C null, splitk 1 (the split-K path zeroes D and accumulates with atomics); grid
    (ceil(N/64), ceil(M/tile_m)), 256 threads. The object is bf16gemm_outf32.csv's row for
    tile_m (tileN is 64); the host refuses N % 64."""
    if tile_m not in (32, 48, 64, 96):
        raise ValueError(f"tile_m must be one of the bf16gemm_outf32 tiles 32/48/64/96, got {tile_m}")
    if N % 64 or K % 64:
        raise ValueError(f"N and K must be multiples of 64 (gemm_a16w16_asm), got N={N}, K={K}")
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g).to(torch.bfloat16)
    b = torch.randn(N, K, generator=g).to(torch.bfloat16)
    d = poison((M, N), torch.float32)

    def check():
        ref = a.double() @ b.double().T
        assert not d.isnan().any(), "D not fully written"
        # fp32 accumulation of K bf16 products: a few ulps of the row's magnitude.
        torch.testing.assert_close(d.double(), ref, rtol=1e-5, atol=1e-5 * math.sqrt(K))

    name = f"bf16gemm_outf32_tn_{tile_m}x64_pf3"
    # The same struct as the ../shared build's, which appends an output-type field at 288.
    kernarg = bf16_gemm_kernarg(a, b, d)[:288]
    return Case(f"bf16gemm/{name}.co", aiter_symbol(name),
                (math.ceil(N / 64), math.ceil(M / tile_m), 1), (256, 1, 1), kernarg, [a, b, d], check)


# ----------------------------------------------------------------- fp8 block-scale GEMM (MI350)
def f8_blockscale_mi350(M: int, N: int, K: int, seed: int = 0) -> Case:
    """C[M, N] bf16 = (X * x_scale) @ (W * w_scale)^T, e4m3 X [M, K] and W [N, K], one f32
    scale per 1x128 of X and per 128x128 of W. aiter_meta/csrc/py_itfs_cu/
    asm_mi350_a8w8_blockscale.cu, struct KernelArgs and mi350_a8w8_blockscale_asm():
    x_scale physically [K/128, M] (transposed, as the host's comment says), w_scale
    [N/128, K/128] (row-major as aiter's tests make it; the host comment's [K/128, N/128]
    does not match the kernel: it fails with that layout); Xs = Ws = K bytes, Cs = N*2;
    eprt_cnt 1, splitk 0, activation 0; object x32 for M <= 32 else x128; grid
    (ceil(N/256), ceil(M/tile_m)), 256 threads. W is pre-shuffled as aiter's
    gemm_a8w8_blockscale(isBpreshuffled=True) expects: aiter/ops/shuffle.py shuffle_weight
    with layout (16, 16) (16 rows x 32 K per tile, 16-byte K groups inner)."""
    if M < 16 or K < 512 or K % 128 or N % 256:
        # The host accepts N % 128 == 0, but a workgroup covers 256 columns: with N % 256 ==
        # 128 the kernel reads W past N and stores past each row's end (docs/conformance.md).
        raise ValueError(f"M >= 16, K >= 512, K % 128 == 0 and N % 256 == 0 needed, got M={M}, N={N}, K={K}")
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(M, K, generator=g) * 2).to(torch.float8_e4m3fn)
    w = (torch.randn(N, K, generator=g) * 2).to(torch.float8_e4m3fn)
    x_scale = torch.rand(M, K // 128, generator=g) + 0.5
    w_scale = torch.rand(N // 128, K // 128, generator=g) + 0.5
    w_shuf = w.view(torch.uint8).view(N // 16, 16, K // 32, 2, 16).permute(0, 2, 3, 1, 4).contiguous()
    xs_t = x_scale.T.contiguous()
    c = poison((M, N), torch.bfloat16)
    xb = x.view(torch.uint8)
    ka = Kernarg(368)
    for off, t in ((0, c), (16, xb), (32, w_shuf), (64, xs_t), (80, w_scale)):
        ka.ptr(off, t)
    ka.u32(144, K)
    ka.u32(160, N)
    ka.u32(176, M)
    ka.u32(192, 1)                  # eprt_cnt
    ka.u32(208, K)                  # Xs
    ka.u32(224, K)                  # Ws
    ka.u32(240, N * 2)              # Cs

    def check():
        xs = x_scale.double().repeat_interleave(128, 1)
        ws = w_scale.double().repeat_interleave(128, 0).repeat_interleave(128, 1)
        ref = (x.double() * xs) @ (w.double() * ws).T
        assert not c.isnan().any(), "C not fully written"
        # fp32 accumulation, one bf16 rounding of the result.
        torch.testing.assert_close(c.double(), ref, rtol=1e-2, atol=1e-3 * ref.abs().max().item())

    tile_m = 32 if M <= 32 else 128
    name = f"f8_block_scale_mi350_x{tile_m}"
    return Case(f"{name}.co", name, (math.ceil(N / 256), math.ceil(M / tile_m), 1), (256, 1, 1),
                ka.bytes(), [xb, w_shuf, xs_t, w_scale, c], check)


# ----------------------------------------------------------------- MX-FP4 GEMM (f4gemm)
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def f4gemm(M: int, N: int, K: int, tile: str = "32x128", seed: int = 0, preshuffle: bool = True,
           log2_k_split: int = 0, slack: bool = True) -> Case:
    """D[M, N] bf16 = A @ B^T with A [M, K] and B [N, K] in OCP MX-FP4 (E2M1, two per byte,
    the even element in the low nibble) and one e8m0 scale per 1x32 along K. Host code:
    aiter_meta/csrc/py_itfs_cu/asm_gemm_a4w4.cu gemm_a4w4_asm (struct KernelArgs, grid,
    split-K rule), packed by gfxasm.perf.aiter_f4gemm.kernarg/grid (no second copy here).
    B is pre-shuffled by aiter/ops/shuffle.py shuffle_weight (layout (16, 16) on the
    bytes), both scales by aiter/utility/fp4_utils.py e8m0_shuffle (rows padded to 256,
    columns to 8, then [m/32, 2, 16, n/8, 2, 4] -> (0, 3, 5, 2, 4, 1)); D has
    ceil(M/256)*256 rows, as aiter's tuner allocates it. The host refuses N % tile_n.
    preshuffle=False: the noBpreShuffle object, B [N, K/2] row-major as packed (it reads B
    past its end for K = 256, a fault here; K = 512 and 1024 run).
    log2_k_split > 0 (a split-K object): 2^log2 K slices of K / 2^log2 rounded up to 256,
    grid z their number, D zeroed first (the host's out.zero_(); the slices add into it
    with buffer_atomic_pk_add_bf16, so D is checked against a bound on bf16 rounding of
    each slice's sum and of each addition). Where a slice is one 256-element step, the
    prologue's two advances of the operand descriptors pass it and a num_records that drops
    below zero wraps, so at small M the loads read past the end of A or of A's scales
    (docs/conformance.md, finding F8): the operands get aiter_f4gemm.slack_bytes
    of 0xFF after them (FP4 -6.0 and e8m0 NaN scales, which would show in D if the kernel
    used them); slack=False leaves them out (the finding's test)."""
    from gfxasm.perf import aiter_f4gemm as f4
    kind = "BpreShuffle" if preshuffle else "noBpreShuffle"
    cfg = next((c for c in f4.configs().values() if c.co.endswith(f"_{kind}_{tile}.co")), None)
    if cfg is None:
        raise ValueError(f"no {kind} f4gemm object with tile {tile!r}")
    if N % cfg.tile_n or K % 256:
        raise ValueError(f"N must be a multiple of {cfg.tile_n} and K of 256, got N={N}, K={K}")
    if log2_k_split and not cfg.split_k:
        raise ValueError(f"{cfg.symbol} has no split-K")
    g = torch.Generator().manual_seed(seed)
    a_codes = torch.randint(0, 16, (M, K), generator=g, dtype=torch.uint8)
    b_codes = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
    a_exp = torch.randint(122, 132, (M, K // 32), generator=g, dtype=torch.uint8)
    b_exp = torch.randint(122, 132, (N, K // 32), generator=g, dtype=torch.uint8)
    a = a_codes[:, 0::2] | (a_codes[:, 1::2] << 4)
    b = b_codes[:, 0::2] | (b_codes[:, 1::2] << 4)
    if preshuffle:
        b = b.view(N // 16, 16, K // 64, 2, 16).permute(0, 2, 3, 1, 4).contiguous().view(N, K // 2)
    sa, sb = _e8m0_shuffle(a_exp), _e8m0_shuffle(b_exp)
    d = poison((math.ceil(M / 256) * 256, N), torch.bfloat16)
    if slack:
        a_slack, rest = f4.slack_bytes(cfg, K, log2_k_split)
        a, b, sa, sb = _with_slack(a, a_slack), _with_slack(b, rest), _with_slack(sa, rest), _with_slack(sb, rest)
    if log2_k_split:
        d.zero_()

    def check():
        av, bv = _mxfp4_value(a_codes, a_exp), _mxfp4_value(b_codes, b_exp)
        ref = av @ bv.T
        assert not d[:M].isnan().any(), "D not fully written"
        if not log2_k_split:
            # fp32 accumulation of exact products (E2M1 x E2M1 x 2^k), one bf16 rounding.
            torch.testing.assert_close(d[:M].double(), ref, rtol=1e-2, atol=1e-3 * ref.abs().max().item())
            return
        # S slices, each summed in fp32 and rounded to bf16 (at most 2^-9 |slice|), added
        # into D in bf16 in any order (each sum at most 2^-9 of sum |slice|): S + 1 halves
        # of a bf16 ulp of sum |slice|, beside the fp32 sums' share.
        step = f4.k_per_workgroup(K, log2_k_split)
        parts = [av[:, k:k + step] @ bv[:, k:k + step].T for k in range(0, K, step)]
        bound = 2.0 ** -9 * (len(parts) + 1) * sum(p.abs() for p in parts) + 1e-3 * ref.abs().max().item()
        err = (d[:M].double() - ref).abs()
        assert (err <= bound).all(), f"split-K D off by {err.max().item():.4g} (bound {bound.max().item():.4g})"

    return Case(cfg.co.removeprefix("aiter_meta/hsa/gfx950/"), cfg.symbol, f4.grid(cfg, M, N, K, log2_k_split),
                f4.BLOCK, f4.kernarg(d, a, b, sa, sb, M, N, K, log2_k_split=log2_k_split), [a, b, sa, sb, d], check)


def _with_slack(t: torch.Tensor, nbytes: int) -> torch.Tensor:
    """A copy of uint8 `t` as the head of a storage `nbytes` longer, the tail 0xFF."""
    flat = torch.full((t.numel() + nbytes,), 0xFF, dtype=torch.uint8)
    head = flat[:t.numel()].view(t.shape)
    head.copy_(t)
    return head


def _mxfp4_value(codes: torch.Tensor, exps: torch.Tensor) -> torch.Tensor:
    """float64 values of E2M1 codes [rows, K] with e8m0 scales [rows, K/32]."""
    mag = E2M1.double()[(codes & 7).long()]
    val = torch.where(codes & 8 > 0, -mag, mag)
    return val * torch.pow(2.0, exps.double() - 127).repeat_interleave(32, 1)


def _e8m0_shuffle(scale: torch.Tensor) -> torch.Tensor:
    m, n = scale.shape
    padded = torch.full(((m + 255) // 256 * 256, (n + 7) // 8 * 8), 127, dtype=torch.uint8)
    padded[:m, :n] = scale
    sm, sn = padded.shape
    return padded.view(sm // 32, 2, 16, sn // 8, 2, 4).permute(0, 3, 5, 2, 4, 1).contiguous().view(sm, sn)
