"""The MoE ops of issue 11 on the strict gfx950 emulator: swiglu_mxfp8_quant, the MX-FP8 MoE
layer in both forms, its fused gate_up step and moe_sum. (gfxasm.moe_align_block_size has its
own module, test_moe_align.py; `routing` here is shared with it and test_mxfp8_moe_gemm.py.)
"""
from __future__ import annotations

import pytest
import torch

import gfxasm
from gfxasm import build
from gfxasm.ops import moe_align, moe_layer, mxfp8_moe_gemm
from gfxasm.ops import swiglu_quant as sq

@pytest.fixture(scope="module", autouse=True)
def built():
    build.build_kernels(moe_layer.kernel_names() + [sq.OP])
    mxfp8_moe_gemm.build_kernels()


# ------------------------------------------------------------------ routings

def routing(kind: str, T: int, top_k: int, E: int, gen: torch.Generator) -> torch.Tensor:
    """[T, top_k] int32 expert ids (distinct per token where the routing allows)."""
    if kind == "random":
        ids = torch.stack([torch.randperm(E, generator=gen)[:top_k] for _ in range(T)])
    elif kind == "hot":              # every token's first choice is one expert, the rest random
        ids = torch.stack([torch.randperm(E, generator=gen)[:top_k] for _ in range(T)])
        ids[:, 0] = 3 % E
    elif kind == "spread":           # every slot on an expert of its own (needs E >= T * top_k)
        ids = torch.randperm(E, generator=gen)[:T * top_k].view(T, top_k)
    elif kind == "few":              # most experts empty: ids drawn from 3 experts
        ids = torch.randint(0, 3, (T, top_k), generator=gen) * (E // 3)
    else:
        raise ValueError(kind)
    return ids.to(torch.int32)


# ------------------------------------------------------------------ swiglu_mxfp8_quant

def pow2(e) -> torch.Tensor:
    return torch.ldexp(torch.tensor(1.0, dtype=torch.float64), torch.tensor(e))


def crafted_gate_up(M: int, I: int, dtype, gen: torch.Generator) -> torch.Tensor:
    """x = gate | up in `dtype` whose products gate * up / 2 (the activation at alpha = 0, beta = 0,
    limit = inf) hit the scale rule's corners, block by block along the rows:
      row 0: all zeros (scale 0, q 0)
      row 1: per block, amax exactly a power of two 2^k (k varies: X = 2^(k-8), q = 256)
      row 2: per block, amax just below 2^(k+1) and elements past 448 X: saturation to +-448
      row 3: tiny values (amax ~2^-125: the scale clamps at 2^-127)
      rows 4..: random values over a wide range of exponents per block."""
    g = (torch.randn(M, I, generator=gen) * torch.ldexp(torch.ones(M, I),
                                                         torch.randint(-6, 7, (M, I // 32), generator=gen)
                                                         .repeat_interleave(32, 1))).double()
    u = torch.randn(M, I, generator=gen).double() * 2
    g[0], u[1:4] = 0, 2.0
    for b in range(I // 32):
        sl = slice(32 * b, 32 * b + 32)
        k = b % 9 - 4
        g[1, sl] = pow2(k) * (torch.rand(32, generator=gen).double() * 0.9)     # |y| < 2^k ...
        g[1, 32 * b + b % 32] = -pow2(k) if b % 2 else pow2(k)                  # ... and one = +-2^k
        g[2, sl] = pow2(k) * torch.linspace(1.0, 1.99, 32).double() * (-1) ** b    # y / X up to 509
        g[3, sl] = pow2(-62) * torch.linspace(0.5, 1.0, 32).double() * pow2(-b % 3)
        u[3, sl] = pow2(-62)
    x = torch.cat([g, u], 1).to(dtype)
    assert x.isfinite().all()
    return x


def exact_product(x: torch.Tensor) -> torch.Tensor:
    """gate * up / 2 in float64: exact for 16-bit inputs (the activation at alpha = 0, beta = 0)."""
    I = x.shape[1] // 2
    return x[:, :I].double() * x[:, I:].double() * 0.5


def embedded(t: torch.Tensor, fill: int, before: int = 64, after: int = 48) -> tuple[torch.Tensor, torch.Tensor]:
    """(view, base): a poisoned 1-D byte buffer holding a 16-byte-aligned view shaped like t."""
    base = torch.full((before + t.numel() * t.element_size() + after,), fill, dtype=torch.uint8)
    return base[before:before + t.numel() * t.element_size()].view(t.dtype).view(t.shape), base


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M,I", [(6, 288), (37, 96), (7, 32)])
def test_swiglu_quant_scale_rule_exact(dtype, M, I):
    """alpha = 0 makes the sigmoid exactly 1/2, so every q and scale byte is predictable: the
    kernel must equal the float64 quantisation bit for bit (zeros, powers of two, saturation,
    the clamp at 2^-127, random blocks), writing every output byte and nothing around them."""
    gen = torch.Generator().manual_seed(M * I)
    x = crafted_gate_up(M, I, dtype, gen)
    q_want, s_want = sq.quantize_reference(exact_product(x))
    q, q_base = embedded(torch.empty(M, I, dtype=torch.float8_e4m3fn), 0x7F)        # NaN codes
    s, s_base = embedded(torch.empty(M, I // 32, dtype=torch.float8_e8m0fnu), 0xFF)  # NaN scales
    sq.swiglu_mxfp8_quant(x, alpha=0.0, beta=0.0, limit=float("inf"), out=(q, s))
    assert torch.equal(s.view(torch.uint8), s_want.view(torch.uint8))
    assert torch.equal(q.view(torch.uint8), q_want.view(torch.uint8))
    assert s_want.view(torch.uint8)[0].eq(0).all() and q_want.float()[0].eq(0).all()   # row 0: zeros
    assert q.float()[2].abs().max() == 448                                                       # saturated
    for base, n in ((q_base, q.numel()), (s_base, s.numel())):
        assert base[:64].eq(base[0]).all() and base[64 + n:].eq(base[0]).all()


def test_swiglu_quant_powers_of_two():
    """amax = 2^k exactly gives scale 2^(k-8) and q = +-256 at the maximum."""
    x = torch.zeros(1, 2 * 64, dtype=torch.bfloat16)
    x[0, 5], x[0, 64 + 5] = 2.0 ** -3, 2.0              # y = 2^-3 in block 0
    x[0, 40], x[0, 64 + 40] = -(2.0 ** 7), 2.0          # y = -2^7 in block 1
    x[0, 41], x[0, 64 + 41] = 2.0 ** 6, 2.0             # y = 2^6, half of it
    q, s = sq.swiglu_mxfp8_quant(x, alpha=0.0, beta=0.0, limit=float("inf"))
    assert s.view(torch.uint8).tolist() == [[127 - 3 - 8, 127 + 7 - 8]]
    assert q.float()[0, 5] == 256 and q.float()[0, 40] == -256 and q.float()[0, 41] == 128
    assert q.float()[0].count_nonzero() == 3


def bracket(y: torch.Tensor, scale_bytes: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The dequantised values an f32 computation within relative eps of float64 y may give
    with the kernel's own scales: e4m3 rounding is monotone, so they lie between the
    quantisations of y (1 - eps) and y (1 + eps)."""
    M, I = y.shape
    X = torch.ldexp(torch.ones(M, I // 32, dtype=torch.float64), scale_bytes.long() - 127).repeat_interleave(32, 1)

    def deq(v):
        return (v / X).clamp(-448, 448).to(torch.float32).to(torch.float8_e4m3fn).double() * X
    a, b = deq(y * (1 - eps)), deq(y * (1 + eps))
    return torch.minimum(a, b), torch.maximum(a, b)


@pytest.mark.parametrize("M,I,alpha,beta,limit", [(37, 96, 1.702, 1.0, 7.0), (20, 768, 1.702, 1.0, 7.0),
                                                   (3, 64, 1.0, 0.5, 3.0)])
def test_swiglu_quant_activation(M, I, alpha, beta, limit):
    """The OAI activation against float64: each scale is the reference's unless the block's
    amax lies within relative EPS of a power of two (then one off is allowed), and every q,
    dequantised with the kernel's scale, lies in the bracket of y (1 +- EPS). EPS = 2^-16
    covers v_exp/v_rcp (~1 ulp each) and the f32 rounding of alpha * g * log2(e) (|.| < 18)."""
    EPS = 2.0 ** -16
    gen = torch.Generator().manual_seed(M + I)
    x = (torch.randn(M, 2 * I, generator=gen) * 4).to(torch.bfloat16)                 # crosses +-limit
    y = sq.activation_reference(x, alpha, beta, limit)
    q, s = sq.swiglu_mxfp8_quant(x, alpha=alpha, beta=beta, limit=limit)
    s_ref = sq.quantize_reference(y)[1].view(torch.uint8).long()
    s_got = s.view(torch.uint8).long()
    amax = y.view(M, I // 32, 32).abs().amax(-1)
    near = (torch.log2(amax * (1 + EPS)).floor() != torch.log2(amax * (1 - EPS)).floor())
    assert ((s_got == s_ref) | (near & ((s_got - s_ref).abs() == 1))).all()
    lo, hi = bracket(y, s_got, EPS)
    deq = q.double() * torch.ldexp(torch.ones_like(y), s_got.repeat_interleave(32, 1) - 127)
    assert ((deq >= lo) & (deq <= hi)).all()
    # and nearly everything lands exactly where float64 does
    deq_ref = sq.quantize_reference(y)[0].double() * torch.ldexp(torch.ones_like(y),
                                                                 s_ref.repeat_interleave(32, 1) - 127)
    assert (s_got == s_ref).float().mean() > 0.9 and (deq == deq_ref).float().mean() > 0.98


def test_swiglu_quant_empty():
    q, s = sq.swiglu_mxfp8_quant(torch.empty(0, 128, dtype=torch.bfloat16))
    assert q.shape == (0, 64) and s.shape == (0, 2)


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(x=torch.zeros(2, 64, dtype=torch.float32)), TypeError, "'x' dtype"),
    (dict(x=torch.zeros(2, 96, dtype=torch.bfloat16)), ValueError, "I % 32"),
    (dict(x=torch.zeros(2, 2, 64, dtype=torch.bfloat16)), ValueError, "'x' must be"),
    (dict(x=torch.zeros(128, 4, dtype=torch.bfloat16).t()), ValueError, "contiguous"),
    (dict(x=torch.zeros(2, 64, dtype=torch.bfloat16), limit=0.0), ValueError, "'limit'"),
    (dict(x=torch.zeros(2, 64, dtype=torch.bfloat16), alpha=float("nan")), ValueError, "'alpha'"),
    (dict(x=torch.zeros(2, 64, dtype=torch.bfloat16), beta="1"), TypeError, "'beta'"),
    (dict(x=torch.zeros(2, 64, dtype=torch.bfloat16), out=(torch.zeros(2, 32), torch.zeros(2, 1))),
     TypeError, "'q' \\(out\\) dtype"),
    (dict(x=torch.zeros(2, 64, dtype=torch.bfloat16),
          out=(torch.zeros(2, 32).to(torch.float8_e4m3fn), torch.zeros(2, 2).to(torch.float8_e8m0fnu))),
     ValueError, "'scale' \\(out\\) must be"),
    (dict(x=torch.zeros(2, 64, dtype=torch.bfloat16), out=torch.zeros(2)), TypeError, "'out'"),
])
def test_swiglu_quant_bad_input(kwargs, exc, match, no_launch):
    x = kwargs.pop("x")
    with pytest.raises(exc, match=match):
        sq.swiglu_mxfp8_quant(x, **kwargs)


def test_swiglu_quant_refuses_overlap_and_misalignment(no_launch):
    x = torch.randn(2, 128).to(torch.bfloat16)
    s = torch.empty(2, 2, dtype=torch.float8_e8m0fnu)
    with pytest.raises(ValueError, match="'q' overlaps"):
        sq.swiglu_mxfp8_quant(x, out=(x.view(-1).view(torch.float8_e4m3fn)[:128].view(2, 64), s))
    raw = torch.empty(2 * 64 + 1, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="'q' data must be 16-byte aligned"):
        sq.swiglu_mxfp8_quant(x, out=(raw[1:].view(2, 64), s))


# ------------------------------------------------------------------ mxfp8_moe (the layer)

BF16_U = 2.0 ** -8                  # bf16 rounding, relative (half an ulp is 2^-9: kept loose by 2)
F32_U = 2.0 ** -24
ACT_EPS = 2.0 ** -16                # the activation's f32 error, relative (see test_swiglu_quant_activation)


def e4m3_codes(shape, gen) -> torch.Tensor:
    c = torch.randint(0, 254, shape, generator=gen, dtype=torch.int32)
    return (c + (c >= 0x7F).int()).to(torch.uint8).view(torch.float8_e4m3fn)      # every finite code


def e8m0_scales(shape, center: int, gen, spread: int = 2) -> torch.Tensor:
    e = torch.randint(center - spread, center + spread + 1, shape, generator=gen, dtype=torch.int32)
    return e.to(torch.uint8).view(torch.float8_e8m0fnu)


def layer_operands(T, H, I, E, gen):
    """Random codes with NON-uniform scales per 32-block, centred so that h spans the SwiGLU's
    interesting range (|h| up to ~10, across the clamp at 7) and out stays well inside bf16."""
    return (e4m3_codes((T, H), gen), e8m0_scales((T, H // 32), 121, gen),
            e4m3_codes((E, 2 * I, H), gen), e8m0_scales((E, 2 * I, H // 32), 116, gen),
            e4m3_codes((E, H, I), gen), e8m0_scales((E, H, I // 32), 117, gen))


def deq(q, s) -> torch.Tensor:
    """q * 2^(s - 127) in float64, one scale per 32 along the last dim."""
    e = s.view(torch.uint8).long() - 127
    return q.double() * torch.ldexp(torch.ones_like(e, dtype=torch.float64), e).repeat_interleave(32, -1)


def to_bf16(v: torch.Tensor) -> torch.Tensor:
    return v.to(torch.float32).to(torch.bfloat16).double()


def requant_range(h_exact, h_err, alpha, beta, limit):
    """For one slot: the reference MX-FP8 activation (dequantised) and the interval every value
    the kernels may produce lies in. The gate-up GEMM's f32 sum is within h_err of h_exact, so
    its bf16 h is one of bf16(h_exact - h_err), bf16(h_exact), bf16(h_exact + h_err); the
    activation of each candidate pair is then within ACT_EPS; the block scale is any that an
    amax in the resulting range gives; e4m3 rounding is monotone for a given scale."""
    I = h_exact.shape[-1] // 2
    cands = [to_bf16(h_exact - h_err), to_bf16(h_exact), to_bf16(h_exact + h_err)]
    act = lambda g, u: sq.activation_reference(torch.cat([g, u], -1)[None], alpha, beta, limit)[0]  # noqa: E731
    ys = torch.stack([act(g[:I], u[I:]) for g in cands for u in cands])
    y_ref = act(cands[1][:I], cands[1][I:])
    y_lo = ys.min(0).values - ys.min(0).values.abs() * ACT_EPS
    y_hi = ys.max(0).values + ys.max(0).values.abs() * ACT_EPS
    q_ref, s_ref = sq.quantize_reference(y_ref[None])
    a_lo = torch.where((y_lo > 0) | (y_hi < 0), torch.minimum(y_lo.abs(), y_hi.abs()), torch.zeros_like(y_lo))
    a_hi = torch.maximum(y_lo.abs(), y_hi.abs())
    s_min = sq.quantize_reference(a_lo.view(1, -1, 32).amax(-1).repeat_interleave(32, -1))[1].view(torch.uint8)
    s_max = sq.quantize_reference(a_hi.view(1, -1, 32).amax(-1).repeat_interleave(32, -1))[1].view(torch.uint8)
    lo, hi = [], []
    for s in range(int(s_min.min()), int(s_max.max()) + 1):
        ok = ((s_min[0] <= s) & (s <= s_max[0])).repeat_interleave(32)
        scale = torch.full((1, I // 32), s, dtype=torch.uint8)
        for y in (y_lo, y_hi):
            v = deq((y / 2.0 ** (s - 127)).clamp(-448, 448).to(torch.float32).to(torch.float8_e4m3fn)[None], scale)[0]
            lo.append(torch.where(ok, v, torch.full_like(v, float("inf"))))
            hi.append(torch.where(ok, v, torch.full_like(v, -float("inf"))))
    return deq(q_ref, s_ref)[0], torch.stack(lo).min(0).values, torch.stack(hi).max(0).values


def gate_up_exact(W1e: torch.Tensor, Xt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, bound on |f32 GEMM sum - h|) of one slot, float64, from the dequantised operands."""
    h = W1e @ Xt
    return h, (Xt.numel() / 16 + 128) * F32_U * (W1e.abs() @ Xt.abs()) + h.abs() * F32_U


def layer_reference(x, xs, w1, w1s, w2, w2s, topk_weights, topk_ids, expert_map=None,
                    alpha=1.702, beta=1.0, limit=7.0):
    """A plain float64 MoE on the dequantised operands, the kernels' intermediate roundings
    (bf16 h, MX-FP8 activation, bf16 weighted rows, f32 sum, bf16 out) modelled, and a
    per-element bound on |kernel - reference| that those roundings and the requantisation's
    ambiguity (requant_range) justify. Returns (reference, bound), float64 [T, H]."""
    T, H = x.shape
    E, I = w1.shape[0], w1.shape[1] // 2
    X, W1, W2 = deq(x, xs), deq(w1, w1s), deq(w2, w2s)
    ref = torch.zeros(T, H, dtype=torch.float64)
    bound = torch.zeros(T, H, dtype=torch.float64)
    for t in range(T):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            n_global = E if expert_map is None else expert_map.numel()
            if not 0 <= e < n_global:
                continue
            le = e if expert_map is None else int(expert_map[e])
            if not 0 <= le < E:                  # absent (-1) or no such local expert: skipped
                continue
            q_ref, q_lo, q_hi = requant_range(*gate_up_exact(W1[le], X[t]), alpha, beta, limit)
            w = float(topk_weights[t, j])
            z = W2[le] @ q_ref
            dev = abs(w) * (W2[le].abs() @ torch.maximum(q_hi - q_ref, q_ref - q_lo)
                            + (I / 16 + 128) * F32_U * (W2[le].abs() @ torch.maximum(q_lo.abs(), q_hi.abs())))
            ref[t] += w * z
            bound[t] += dev + BF16_U * (abs(w) * z.abs() + dev) + 64 * F32_U * abs(w) * z.abs()
    bound += BF16_U * (ref.abs() + bound)
    return ref, bound


LAYER_CASES = [  # (T, top_k, E, H, I, block_m, routing kind)
    (1, 5, 16, 128, 64, None, "random"),
    (4, 4, 8, 64, 96, 16, "hot"),
    (9, 8, 16, 96, 32, 32, "random"),
    (5, 1, 12, 64, 64, 64, "spread"),
]


def check_layer(T, top_k, E, H, I, block_m, kind, expert_map=None, E_local=None, seed=0, ids=None):
    """The layer against layer_reference's bound; returns (out, its operands)."""
    gen = torch.Generator().manual_seed(seed + 100 * T + E + H + I)
    x, xs, w1, w1s, w2, w2s = layer_operands(T, H, I, E_local or E, gen)
    ids = routing(kind, T, top_k, E, gen) if ids is None else ids
    tw = torch.rand(T, top_k, generator=gen) + 0.1
    out, base = embedded(torch.empty(T, H, dtype=torch.bfloat16), 0xFF)           # NaN poison around and in out
    moe_layer.mxfp8_moe(x, xs, w1, w1s, w2, w2s, tw, ids, expert_map=expert_map, block_m=block_m, out=out)
    ref, bound = layer_reference(x, xs, w1, w1s, w2, w2s, tw, ids, expert_map)
    err = (out.double() - ref).abs()
    assert out.isfinite().all()
    assert (err <= bound).all(), f"max excess {float((err - bound).max())}"
    assert float(torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref)) < 2.0 ** -7
    # Typical elements agree to the bf16 rounding: the bound's worst cases (every f32 sum at
    # its error bound, every ambiguous requantisation one e4m3 step off) are rare in practice.
    assert float((err / ref.abs()).median()) <= 2.0 ** -8
    n = out.numel() * 2
    assert base[:64].eq(0xFF).all() and base[64 + n:].eq(0xFF).all()
    return out, dict(x=x, x_scale=xs, w1=w1, w1_scale=w1s, w2=w2, w2_scale=w2s, topk_weights=tw, topk_ids=ids,
                     expert_map=expert_map)


@pytest.mark.parametrize("T,top_k,E,H,I,block_m,kind", LAYER_CASES)
def test_layer_matches_pytorch_moe(T, top_k, E, H, I, block_m, kind):
    check_layer(T, top_k, E, H, I, block_m, kind)


def test_layer_expert_parallel():
    """16 global experts, this rank holds 8 (shuffled local ids): slots on the other 8 add
    nothing, nor do those of an expert mapped past the local ones (8: the GEMMs skip it too).
    The decode form (block_m None) equals the sorted form bit for bit."""
    E, gen = 16, torch.Generator().manual_seed(99)
    expert_map = torch.full((E,), -1, dtype=torch.int32)
    order = torch.randperm(E, generator=gen)
    expert_map[order[:8]] = torch.randperm(8, generator=gen).to(torch.int32)
    expert_map[order[8]] = 8
    out, args = check_layer(6, 5, E, 64, 64, None, "random", expert_map=expert_map, E_local=8)
    assert torch.equal(out, gfxasm.mxfp8_moe(**args, block_m=16))


def layer_reference_vectorised(x, xs, w1, w1s, w2, w2s, topk_weights, topk_ids, expert_map):
    """layer_reference's model of the layer (bf16 h, MX-FP8 activation, bf16 weighted rows, f32
    sum in slot order) for every token at once, grouped by expert, float64 GEMMs, no bound:
    for large T, where the per-token bound is checked on a sample only."""
    T, top_k = topk_ids.shape
    E, I = w1.shape[0], w1.shape[1] // 2
    X, W1, W2 = deq(x, xs), deq(w1, w1s), deq(w2, w2s)
    local = expert_map[topk_ids.reshape(-1).long()].long()         # every id of these tests is in range
    rows = torch.zeros(T * top_k, x.shape[1], dtype=torch.float32)
    for e in range(E):
        slots = (local == e).nonzero().flatten()
        if not slots.numel():
            continue
        h = to_bf16(X[slots // top_k] @ W1[e].T)
        q, s = sq.quantize_reference(sq.activation_reference(h))
        rows[slots] = (topk_weights.reshape(-1)[slots, None].double() * (deq(q, s) @ W2[e].T)).float()
    rows = rows.to(torch.bfloat16).float().view(T, top_k, -1)
    present = ((local >= 0) & (local < E)).view(T, top_k)
    acc = torch.zeros(T, x.shape[1], dtype=torch.float32)
    for j in range(top_k):                                        # f32 adds in slot order, as moe_sum
        acc = torch.where(present[:, j, None], acc + rows[:, j], acc)
    return acc.to(torch.bfloat16).double()


def test_layer_prefill_sixteen_thousand_tokens():
    """T = 16,384 tokens, top-2: 32,768 slots (moe_align past the old 16,384-slot limit) on 10
    global experts, 2 absent (expert_map -1) and 8 local with ragged loads: one empty, one with a
    single slot, 63, 65 and 64 slots, the rest shared by three experts; block_m 64 and the
    prefill tiles as the layer chooses them (the down GEMM's 32-column one at this N; the
    64-column tile is test_mxfp8_moe_gemm's); H = 64, I = 32 so that it emulates in about half
    a minute. Every token against the vectorised reference (norm and median error; tokens routed
    to absent experts only are +0); a sample of tokens against layer_reference's per-element
    bound: those of the first and last 4 slots of each ragged expert (the last is the 65-slot
    expert's lone row in its second block), 4 of each absent expert's, 16 at random."""
    T, top_k, H, I = 16384, 2, 64, 32
    gen = torch.Generator().manual_seed(16384)
    expert_map = torch.tensor([3, -1, 0, 5, 1, -1, 7, 2, 6, 4], dtype=torch.int32)   # global -> local
    counts = {2: 0, 4: 1, 7: 63, 0: 65, 3: 64, 1: 32, 5: 32}                      # global id: slots
    rest = (T - 8) * top_k - sum(counts.values())
    counts.update({6: rest // 3, 8: rest // 3, 9: rest - 2 * (rest // 3)})
    ids = torch.repeat_interleave(torch.arange(10), torch.tensor([counts[e] for e in range(10)]))
    ids = ids[torch.randperm((T - 8) * top_k, generator=gen)].view(T - 8, top_k)
    absent_pairs = torch.tensor([[1, 5], [5, 1], [1, 1], [5, 5]] * 2)           # 8 tokens on absent experts only
    ids = torch.cat([ids, absent_pairs])[torch.randperm(T, generator=gen)].to(torch.int32)
    assert moe_layer.choose_block_m(T, top_k, 10) == 64
    down = dict(blocks=moe_align.sizes(T * top_k, 64, 10, True)[1], valid=T * top_k, E=8, N=H, block_m=64)
    assert mxfp8_moe_gemm.choose_nt(down) == 2
    x, xs, w1, w1s, w2, w2s = layer_operands(T, H, I, 8, gen)
    tw = torch.rand(T, top_k, generator=gen) + 0.1
    out, base = embedded(torch.empty(T, H, dtype=torch.bfloat16), 0xFF)
    moe_layer.mxfp8_moe(x, xs, w1, w1s, w2, w2s, tw, ids, expert_map=expert_map, out=out)
    n = out.numel() * 2
    assert base[:64].eq(0xFF).all() and base[64 + n:].eq(0xFF).all()
    assert out.isfinite().all()
    ref = layer_reference_vectorised(x, xs, w1, w1s, w2, w2s, tw, ids, expert_map)
    assert float(torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref)) < 2.0 ** -7
    nonzero = ref != 0
    assert float(((out.double() - ref).abs()[nonzero] / ref.abs()[nonzero]).median()) <= 2.0 ** -8
    absent_only = (expert_map[ids.long()] < 0).all(1)
    assert int(absent_only.sum()) >= 8 and out[absent_only].double().eq(0).all()
    flat = ids.reshape(-1)
    picks = [torch.randperm(T, generator=gen)[:16]]
    for e in (4, 7, 0, 3):
        slots = (flat == e).nonzero().flatten()
        picks.append(torch.cat([slots[:4], slots[-4:]]) // top_k)
    for e in (1, 5):
        picks.append((flat == e).nonzero().flatten()[:4] // top_k)
    sample = torch.cat(picks).unique()
    ref_s, bound = layer_reference(x[sample], xs[sample], w1, w1s, w2, w2s, tw[sample], ids[sample], expert_map)
    assert ((out[sample].double() - ref_s).abs() <= bound).all()


DECODE_CASES = [  # (T, top_k, E, H, I, routing kind): the decode form; its K loop is 4 sets deep
    (5, 4, 16, 64, 96, "few"),        # 13 of 16 experts empty, the other 3 with up to 20 slots each
    (6, 8, 16, 96, 64, "hot"),        # every token's first choice on expert 3
    (2, 8, 16, 64, 32, "spread"),     # every slot on an expert of its own
    (8, 1, 12, 64, 64, "random"),     # top_k 1: one row per token
    (2, 16, 32, 64, 32, "random"),    # top_k 16: all 16 rows of the tile
    (3, 5, 16, 160, 320, "random"),   # 3 K steps per slot: the waves' shares differ from the sorted form's
    (2, 3, 16, 64, 512, "random"),    # 4 K steps per slot: 3 per wave (the K loop's exit after body 0)
    (2, 4, 16, 64, 640, "random"),    # 5 per wave (exit after body 2)
    (1, 4, 8, 1024, 768, "random"),   # 6 per wave (exit after body 3); gate_up 8 K steps, 2 per wave
]


@pytest.mark.parametrize("T,top_k,E,H,I,kind", DECODE_CASES)
def test_decode_form(T, top_k, E, H, I, kind):
    """The two-launch decode form (routing read from topk_ids; the down GEMM and the top-k sum
    in one launch) against the float64 MoE, and, where each slot's K steps fall on the waves as
    in the sorted form (cdiv(I, 128) = 1 or a multiple of 4), bit for bit against the sorted
    four-launch form (same q, same row roundings, same f32 sum order)."""
    assert moe_layer.choose_form(T, top_k, None) in ("direct", "fused")   # fused: in one launch (test_moe_fused)
    out, args = check_layer(T, top_k, E, H, I, None, kind)
    steps = -(-I // 128)
    if steps == 1 or steps % 4 == 0:
        assert torch.equal(out, gfxasm.mxfp8_moe(**args, block_m=16))


def test_decode_form_out_of_range_ids_and_schedules():
    """Ids outside [0, E) (the last and the first slot of a token, a huge one) add nothing; the
    decode form's cross-wave LDS traffic (tile copies, the row-weight table, the rows summed
    per column) gives the same bits under seeded adversarial schedules."""
    from gfxasm.emu import adversarial
    gen = torch.Generator().manual_seed(41)
    ids = routing("random", 3, 4, 8, gen)
    ids[0, 3], ids[2, 0], ids[1, 1] = 8, -1, 2**31 - 1
    _, args = check_layer(3, 4, 8, 64, 32, None, "random", ids=ids)
    found = adversarial.check(lambda: gfxasm.mxfp8_moe(**args), range(2))
    assert not found, "\n".join(map(str, found))


def test_decode_form_map_and_out_of_range_first_slots():
    """With an expert map, a token's first slot (row 0 of the sum form, whose expert the kernels
    look up by scalar loads for the first weight loads) out of range (-1, num_experts), mapped to
    -1 (an expert off this rank) or held here, and a later slot out of range (the rows' vector
    lookups, mapped inside the K loop): the float64 MoE, and the sorted form bit for bit."""
    E, gen = 16, torch.Generator().manual_seed(7)
    expert_map = torch.full((E,), -1, dtype=torch.int32)
    order = torch.randperm(E, generator=gen)
    expert_map[order[:8]] = torch.randperm(8, generator=gen).to(torch.int32)
    ids = routing("random", 4, 5, E, gen)
    ids[0, 0], ids[1, 0], ids[2, 0], ids[3, 0], ids[3, 2] = -1, E, order[12], order[3], 2**31 - 1
    _, args = check_layer(4, 5, E, 64, 64, None, "random", expert_map=expert_map, E_local=8, ids=ids)
    assert moe_layer.choose_form(4, 5, None) == "direct"
    out = gfxasm.mxfp8_moe(**args)
    assert torch.equal(out, gfxasm.mxfp8_moe(**args, block_m=16))


def test_form_choice():
    assert [moe_layer.choose_form(T, 5, None) for T in (1, 2, 8, 9)] == ["fused", "direct", "direct", "sorted"]
    assert moe_layer.choose_form(1, 5, 16) == "sorted"                         # block_m asks for the sorted form
    assert moe_layer.choose_form(1, 17, None) == "sorted"                      # more slots than tile rows


@pytest.mark.parametrize("block_m,T,top_k,I", [(16, 5, 4, 96), (32, 9, 3, 32), (64, 4, 5, 64)])
def test_gate_up_swiglu_fused(block_m, T, top_k, I):
    """The layer's fused step (mxfp8_moe_gemm.gate_up_swiglu) on its own: 16 experts, half
    absent (expert_map -1), non-uniform scales; q and scale poisoned with guard bytes around
    them. Each processed slot's dequantised row lies in the float64 model's range
    (requant_range of the exact gate_up product, as the layer test) and equals, bit for bit,
    the unfused path (gfxasm.mxfp8_moe_gemm to bf16, then gfxasm.swiglu_mxfp8_quant); rows of
    absent experts' slots and every guard byte keep their poison."""
    E, H, gen = 16, 96, torch.Generator().manual_seed(7 * block_m + T)
    x, xs, w1, w1s, _, _ = layer_operands(T, H, I, 8, gen)
    ids = routing("random", T, top_k, E, gen)
    expert_map = torch.full((E,), -1, dtype=torch.int32)
    expert_map[torch.randperm(E, generator=gen)[:8]] = torch.randperm(8, generator=gen).to(torch.int32)
    sorted_ids, expert_ids, post = moe_align.moe_align_block_size(ids, block_m, E, expert_map, pad_sorted_ids=True)
    S = T * top_k
    q, q_base = embedded(torch.empty(S, I, dtype=torch.float8_e4m3fn), 0x7F)       # e4m3 NaN code
    s, s_base = embedded(torch.empty(S, I // 32, dtype=torch.float8_e8m0fnu), 0xFF)
    mxfp8_moe_gemm.gate_up_swiglu(x, xs, w1, w1s, sorted_ids, expert_ids, post, top_k, q, s, 1.702, 1.0, 7.0)
    local = expert_map[ids.long()].view(-1)
    done = local >= 0
    assert 0 < int(done.sum()) < S
    X, W1 = deq(x, xs), deq(w1, w1s)
    for t in range(S):
        if not done[t]:
            assert q[t].view(torch.uint8).eq(0x7F).all() and s[t].view(torch.uint8).eq(0xFF).all(), t
            continue
        _, lo, hi = requant_range(*gate_up_exact(W1[int(local[t])], X[t // top_k]), 1.702, 1.0, 7.0)
        got = deq(q[t][None], s[t][None])[0]
        assert ((lo <= got) & (got <= hi)).all(), (t, float((got - got.clamp(lo, hi)).abs().max()))
    for base, n in ((q_base, q.numel()), (s_base, s.numel())):
        assert base[:64].eq(base[0]).all() and base[64 + n:].eq(base[0]).all()
    h = torch.full((S, 2 * I), float("nan"), dtype=torch.bfloat16)
    gfxasm.mxfp8_moe_gemm(x, xs, w1, w1s, sorted_ids, expert_ids, post, a_div=top_k, out=h)
    q2, s2 = sq.swiglu_mxfp8_quant(h[done].contiguous())
    assert torch.equal(q[done].view(torch.uint8), q2.view(torch.uint8))
    assert torch.equal(s[done].view(torch.uint8), s2.view(torch.uint8))


@pytest.mark.parametrize("T,top_k,H,has_map", [(1, 5, 6144, False), (7, 8, 136, True), (3, 1, 8, False),
                                                (2, 19, 64, True)])
def test_moe_sum_exact(T, top_k, H, has_map):
    """The sum kernel alone against its exact model (f32 in slot order, bf16 RNE): slots with
    out-of-range ids and, with a map, absent experts or local ids past the local experts add
    nothing; poison around out survives."""
    gen = torch.Generator().manual_seed(T * H)
    E = 8
    y = (torch.randn(T * top_k, H, generator=gen) * 100).to(torch.bfloat16)
    ids = torch.randint(-1, E + 1, (T, top_k), generator=gen, dtype=torch.int32)
    expert_map = torch.randint(-1, 4, (E,), generator=gen, dtype=torch.int32) if has_map else None
    local = 3 if has_map else E             # a map entry 3 names no local expert: skipped like -1
    out, base = embedded(torch.empty(T, H, dtype=torch.bfloat16), 0xFF)
    gfxasm.launch("moe_sum", y=y, topk_ids=ids.view(-1),
                  expert_map=expert_map if has_map else torch.empty(0, dtype=torch.int32), out=out, T=T, H=H,
                  top_k=top_k, num_experts=E, has_map=int(has_map), num_local=local)
    assert torch.equal(out, mxfp8_moe_gemm.sum_reference(y, ids, E, expert_map, local))
    assert base[:64].eq(0xFF).all() and base[64 + out.numel() * 2:].eq(0xFF).all()


def test_schedule_independent():
    """The sum and the quantiser have no cross-wave traffic (the sum's scalar loads may land
    in any order; moe_align's own check is in test_moe_align.py). Each result is
    bit-identical under seeded adversarial schedules (waves interleaved, loads landing late)."""
    from gfxasm.emu import adversarial
    gen = torch.Generator().manual_seed(17)
    x = (torch.randn(9, 2 * 288, generator=gen) * 4).to(torch.bfloat16)
    found = adversarial.check(lambda: [t.view(torch.uint8) for t in sq.swiglu_mxfp8_quant(x)], range(2))
    assert not found, "\n".join(map(str, found))
    y = torch.randn(3 * 11, 64, generator=gen).to(torch.bfloat16)                   # scalar loads land in any order
    ids = torch.randint(-1, 9, (3, 11), generator=gen, dtype=torch.int32)
    expert_map = torch.tensor([0, -1, 1, 2, -1, 0, 5, 1], dtype=torch.int32)

    def summed():
        out = torch.full((3, 64), float("nan"), dtype=torch.bfloat16)
        gfxasm.launch("moe_sum", y=y, topk_ids=ids.view(-1), expert_map=expert_map, out=out, T=3, H=64, top_k=11,
                      num_experts=8, has_map=1, num_local=3)
        return out
    found = adversarial.check(summed, range(2))
    assert not found, "\n".join(map(str, found))


def test_layer_out_of_range_ids_and_empty():
    """A slot whose id is outside [0, E_global) adds nothing to out (no step writes or reads
    its q, scale and y rows), with and without an expert_map. T = 0 launches nothing."""
    gen = torch.Generator().manual_seed(23)
    T, top_k, E, H, I = 4, 3, 8, 64, 32
    x, xs, w1, w1s, w2, w2s = layer_operands(T, H, I, E, gen)
    ids = routing("random", T, top_k, E, gen)
    ids[1, 2], ids[3, 0] = E, -5
    tw = torch.rand(T, top_k, generator=gen)
    identity = torch.arange(E, dtype=torch.int32)
    ref, bound = layer_reference(x, xs, w1, w1s, w2, w2s, tw, ids)
    for expert_map in (identity, None):
        out = gfxasm.mxfp8_moe(x, xs, w1, w1s, w2, w2s, tw, ids, expert_map=expert_map)
        assert ((out.double() - ref).abs() <= bound).all()
    empty = gfxasm.mxfp8_moe(x[:0], xs[:0], w1, w1s, w2, w2s, tw[:0], ids[:0])
    assert empty.shape == (0, H)


def test_block_m_choice():
    assert [moe_layer.choose_block_m(T, 5, 129) for T in (1, 4, 16, 64, 256, 512, 2048)] == [16] * 4 + [32, 64, 64]


def bad_layer_args():
    gen = torch.Generator().manual_seed(1)
    x, xs, w1, w1s, w2, w2s = layer_operands(2, 64, 32, 4, gen)
    ids = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    return dict(x=x, x_scale=xs, w1=w1, w1_scale=w1s, w2=w2, w2_scale=w2s, topk_weights=torch.rand(2, 2),
                topk_ids=ids)


@pytest.mark.parametrize("change,exc,match", [
    (dict(x=torch.zeros(2, 64)), TypeError, "'x' dtype"),
    (dict(w2="w2"), TypeError, "'w2' must be a torch.Tensor"),
    (dict(x=torch.zeros(2, 96).to(torch.float8_e4m3fn)), ValueError, "'w1' must be"),
    (dict(w2=torch.zeros(4, 64, 48).to(torch.float8_e4m3fn)), ValueError, "'w2' must be"),
    (dict(topk_ids=torch.zeros(3, 2, dtype=torch.int32)), ValueError, "'topk_ids' must be"),
    (dict(topk_weights=torch.rand(2, 3)), ValueError, "'topk_weights' must be"),
    (dict(topk_weights=torch.rand(2, 2).double()), TypeError, "'topk_weights' dtype"),
    (dict(topk_ids=torch.zeros(2, 2, dtype=torch.int64)), TypeError, "'topk_ids' dtype"),
    (dict(x_scale=torch.zeros(2, 3, dtype=torch.uint8)), ValueError, "'a_scale'"),
    (dict(block_m=24), ValueError, "'block_m'"),
    (dict(expert_map=torch.zeros(4, dtype=torch.int64)), TypeError, "'expert_map' dtype"),
    (dict(alpha=float("inf")), ValueError, "'alpha'"),
    (dict(out=torch.zeros(2, 64)), ValueError, "'out' must be bf16"),
])
def test_layer_bad_input(change, exc, match, no_launch):
    args = dict(bad_layer_args(), **change)
    with pytest.raises(exc, match=match):
        gfxasm.mxfp8_moe(**args)


def test_layer_refuses_intermediates_past_32_bit_offsets(no_launch):
    # y [T*top_k, H] bf16 reaches 2^31 bytes at T = 16,384, top-8, H = 8,192: refused by name
    # before any launch (the operands are never touched: empty, not initialised)
    T, top_k, H, I = 16384, 8, 8192, 32
    e4m3 = lambda *shape: torch.empty(shape, dtype=torch.uint8).view(torch.float8_e4m3fn)   # noqa: E731
    e8m0 = lambda *shape: torch.empty(shape, dtype=torch.uint8).view(torch.float8_e8m0fnu)  # noqa: E731
    with pytest.raises(ValueError, match=r"T \* top_k = 131072 slots .* at most 16383 tokens at top_k = 8"):
        gfxasm.mxfp8_moe(e4m3(T, H), e8m0(T, H // 32), e4m3(2, 2 * I, H), e8m0(2, 2 * I, H // 32), e4m3(2, H, I),
                         e8m0(2, H, I // 32), torch.rand(T, top_k), torch.zeros(T, top_k, dtype=torch.int32))


@pytest.mark.parametrize("name", ["x", "w1", "w2"])
def test_layer_refuses_misaligned_operands(name, no_launch):
    """Both forms load x, w1 and w2 16 bytes at a time: a view 1 byte into its storage is refused."""
    args = bad_layer_args()
    t = args[name]
    storage = torch.zeros(t.numel() + 16, dtype=torch.uint8)
    args[name] = storage[1:1 + t.numel()].view(t.dtype).view(t.shape)
    for block_m in (None, 16):
        with pytest.raises(ValueError, match=f"'{name}' data must be 16-byte aligned"):
            gfxasm.mxfp8_moe(**args, block_m=block_m)


@pytest.mark.parametrize("name", ["topk_ids", "topk_weights", "expert_map"])
def test_layer_refuses_a_tensor_on_another_device(name, no_launch):
    """Issue 26: topk_ids (or the weights, or the map) on another device than x (here meta, the
    rest on the CPU) is refused before launch, naming it, with and without out=, in the decode
    and in the sorted form (not accepted with an uninitialised result)."""
    args = dict(bad_layer_args(), expert_map=torch.arange(4, dtype=torch.int32))
    args[name] = args[name].to("meta")
    for out in (None, torch.empty(2, 64, dtype=torch.bfloat16)):
        for block_m in (None, 16):
            with pytest.raises(ValueError, match=f"'{name}' must be on x's device \\(cpu\\), got meta"):
                gfxasm.mxfp8_moe(**args, block_m=block_m, out=out)


def test_layer_refuses_out_overlapping_input(no_launch):
    args = bad_layer_args()
    w = torch.zeros(1024, dtype=torch.float32)
    args["topk_weights"] = w[:4].view(2, 2)
    with pytest.raises(ValueError, match="'out' overlaps"):
        gfxasm.mxfp8_moe(**args, out=w.view(torch.bfloat16)[:128].view(2, 64))


@pytest.mark.full
@pytest.mark.parametrize("T,top_k", [(1, 8), (16, 5), (64, 4), (33, 1)])
@pytest.mark.parametrize("block_m", [16, 32, 64])
def test_layer_cross_product(T, top_k, block_m):
    check_layer(T, top_k, 16, 128, 64, block_m, "random", seed=block_m)


@pytest.mark.full
@pytest.mark.parametrize("T", [1, 2, 5, 8])
@pytest.mark.parametrize("top_k", [1, 4, 5, 8, 16])
def test_decode_form_cross_product(T, top_k):
    """The decode form on random, hot-expert and few-expert routings: the float64 bound, and
    bit-equal to the sorted form (I = 64: one K step per slot)."""
    for kind in ("random", "hot", "few"):
        out, args = check_layer(T, top_k, 32, 128, 64, None, kind, seed=top_k)
        assert torch.equal(out, gfxasm.mxfp8_moe(**args, block_m=16)), kind


def test_layer_repeat_calls_with_other_routing_shapes():
    """Cached launches are per layout: T x top_k = 4 x 2 and 8 x 1 give y the same shape but
    need different sums (a plan keyed on y alone once summed the second with the first's)."""
    for T, top_k in ((4, 2), (8, 1), (4, 2)):
        check_layer(T, top_k, 8, 64, 32, 16, "random", seed=5)
