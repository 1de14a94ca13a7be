"""Fuzzing every op with hostile VALUES, devices and threads (issue 26): what
tests/test_fuzz.py's strategies (shapes, layouts, aliasing) never draw.

  * special values in every floating input, scales, descales and sinks included: NaN,
    +-inf, subnormals of the tensor's dtype, -0.0, the dtype's largest finite value, e4m3
    NaN codes (0x7F / 0xFF) in FP8 tensors, extreme legal E8M0 scale bytes (0, 1, 2, 253,
    254) and 0xFF (NaN), descales and block scales like 2^+-60, 2^+-63, 1e-45, 3.4e38, -0.0;
    hypothesis draws them (one class per call, in one element, row, column or all of a
    tensor), and every sink and descale value is also swept once (test_every_sink_and_descale_value);
    issue 26's reproducers stand as explicit examples;
  * every tensor of a call on one device: each tensor argument (index tensors, scales,
    outputs) alone on "meta" while the rest is on the CPU, and alone on the CPU while the
    rest is on "meta", for every op and form;
  * threads: three threads per op, all ops at once, first calls of a fresh process, give
    the serial calls' results bit for bit.

The verdict for every call, as in test_fuzz.py: a clear refusal before launch naming one of
the op's arguments, or agreement with a float64 reference written here from the ops'
documented semantics under IEEE arithmetic (`ieee_close`: NaN exactly where the reference
is NaN, +-inf exactly where it is +-inf, finite values within the op's tolerance). The rules
the ops document, or issue 26 accepts, are modelled where they apply, each at its use with
its source: a non-finite key or value a query may not see may leak NaN into that row (0 *
NaN; batch_prefill documents it for V only), bf16 queries or keys whose f32 dot product
overflows may give a non-finite row, f32 accumulations of sums of |products| past 2^127 may
overflow, swiglu_mxfp8_quant's block of a non-finite input is unspecified (and so is the
MoE layer's row of such a token), decode_attention promises its descales' answer only
"where the answer fits".

Deterministic (derandomize) and bounded: tiny shapes, a fixed number of examples per op.
Each test prints its counts (refused / matched, and by class). What the fuzzing found and
is not fixed is kept out of the strategies and pinned by a strict xfail test at the end."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import gfxasm
from tests.test_fuzz import FUZZ, built, call, empty_poisoned  # noqa: F401  (built: the module's build fixture)

NAN, INF = float("nan"), float("inf")
E4M3 = torch.float8_e4m3fn
KINDS = ("nan", "inf", "-inf", "subnormal", "-0.0", "max", "-max")
PLACES = ("one", "row", "column", "all")        # one element, one last-dim row, one last-dim index, everything


# ------------------------------------------------------------------ special values

def special(dtype: torch.dtype, kind: str) -> float:
    """The value of `kind` in `dtype` (subnormal: a fixed one, 3/8 of the smallest normal)."""
    f = torch.finfo(dtype)
    return {"nan": NAN, "inf": INF, "-inf": -INF, "-0.0": -0.0, "max": f.max, "-max": -f.max,
            "subnormal": f.smallest_normal * 0.375}[kind]


def placement(shape: tuple, place: str, g: torch.Generator) -> torch.Tensor:
    """A bool mask of `shape`: one element, one row (all of the last dim at one index of the
    others), one column (one index of the last dim everywhere) or all."""
    mask = torch.zeros(shape, dtype=torch.bool)
    if not mask.numel():
        return mask
    if place == "one":
        mask.view(-1)[int(torch.randint(0, mask.numel(), (1,), generator=g))] = True
    elif place == "row":
        mask.view(-1, shape[-1])[int(torch.randint(0, mask.numel() // shape[-1], (1,), generator=g))] = True
    elif place == "column":
        mask[..., int(torch.randint(0, shape[-1], (1,), generator=g))] = True
    else:
        mask[...] = True
    return mask


def inject(t: torch.Tensor, kind: str, place: str, g: torch.Generator) -> torch.Tensor:
    """A copy of `t` with the elements `place` picks set to `kind` (subnormal: random
    subnormals of t's dtype, both signs; e4m3 "nan": the codes 0x7F / 0xFF, either sign)."""
    t = t.clone()
    mask = placement(tuple(t.shape), place, g)
    if kind == "subnormal":
        tiny = torch.finfo(t.dtype).smallest_normal
        values = (torch.rand(t.shape, generator=g) * 2 - 1) * tiny
    else:
        values = torch.full(t.shape, special(t.dtype, kind))
    if t.dtype == E4M3 and kind == "nan":       # torch's float -> e4m3 gives 0x7F; 0xFF is NaN too
        codes = torch.where(torch.rand(t.shape, generator=g) < 0.5, 0x7F, 0xFF).to(torch.uint8)
        t.view(torch.uint8)[mask] = codes[mask]
        return t
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()]   # (no masked_fill for float8)
    t.view(bits)[mask] = values.to(t.dtype).view(bits)[mask]
    return t


def ieee_close(name: str, actual: torch.Tensor, expected: torch.Tensor, tolerance, may_nan=None,
               may_be_nonfinite=None) -> None:
    """Elementwise IEEE agreement of `actual` with the float64 `expected`: NaN exactly where
    `expected` is NaN, +-inf exactly where it is +-inf, finite where it is finite and within
    `tolerance` (a number or a tensor; an infinite tolerance still demands a finite value) —
    except that where `expected` is within `tolerance` of actual's dtype's overflow (or past
    it), the infinity of its sign is right too (rounding to that dtype overflows).
    `may_nan` (bool, broadcast): elements where NaN is also accepted (a documented leak);
    `may_be_nonfinite`: where NaN or +-inf is."""
    a, e = actual.double(), expected.double()
    tol = torch.as_tensor(tolerance, dtype=torch.float64)          # (a NaN tolerance accepts nothing)
    f = torch.finfo(actual.dtype)
    overflows = e.abs() + tol >= f.max * (1 + f.eps / 4)             # f.max + half an ulp
    ok = torch.where(e.isnan(), a.isnan(),
                     torch.where(e.isinf(), a == e, (a.isfinite() & ((a - e).abs() <= tol))
                                 | (overflows & (a == e.sign() * INF))))
    if may_nan is not None:
        ok = ok | (a.isnan() & torch.as_tensor(may_nan))
    if may_be_nonfinite is not None:
        ok = ok | (~a.isfinite() & torch.as_tensor(may_be_nonfinite))
    bad = (~ok).nonzero()
    if bad.numel():
        at = tuple(bad[0])
        raise AssertionError(f"{name}: {bad.shape[0]}/{ok.numel()} elements off, first at {bad[0].tolist()}: "
                             f"{a[at].item()} vs {e[at].item()} (tolerance "
                             f"{tol.expand(e.shape)[at].item() if tol.dim() else tol.item()})")


def half_subnormal_step(dtype: torch.dtype) -> float:
    """Half the spacing of dtype's subnormals: the rounding of a result in that range."""
    f = torch.finfo(dtype)
    return f.smallest_normal * f.eps / 2


# ------------------------------------------------------------------ attention, float64 under IEEE rules

def attention_ieee(q, k, v, visible, scale, sink=None):
    """O [Sq, H, D] and LSE [H, Sq] of float64 q [Sq, H, D], k, v [Sk, H, D] (heads already
    repeated), visible [Sq, Sk] (or [H, Sq, Sk]), the sink [H] (a logit in the denominator
    only) or None, every step IEEE: products summed elementwise (no BLAS), the stable
    softmax m + log(sum exp(s - m)) with m the row's largest visible score, so that a NaN
    score, or a +inf one (inf - inf), makes the row NaN. A key a query may not see is left
    out of its row entirely (its products are not formed: the documented semantics). A row
    that sees no key (and has no sink) gets O = 0, LSE = -inf; one whose visible scores (and
    sink) are all -inf gets O = NaN (0 / 0) and LSE = -inf (log 0); one with a +inf score
    gets O and LSE NaN (inf - inf), as the ops' docstrings have it."""
    visible = visible.expand(q.shape[1], q.shape[0], k.shape[0])                # [H, Sq, Sk]
    s = (q.permute(1, 0, 2)[:, :, None, :] * k.permute(1, 0, 2)[:, None, :, :]).sum(-1) * scale
    s = torch.where(visible, s, -INF)
    if sink is not None:
        s = torch.cat([s, sink.double()[:, None, None].expand(s.shape[0], s.shape[1], 1)], -1)
    m = s.amax(-1, keepdim=True) if s.shape[-1] else torch.full(s.shape[:-1] + (1,), -INF, dtype=s.dtype)
    none = ~visible.any(-1, keepdim=True) if sink is None else torch.zeros_like(m, dtype=torch.bool)
    m0 = torch.where(none, 0.0, m)
    e = torch.exp(s - m0)
    l = e.sum(-1, keepdim=True)
    lse = torch.where(m == -INF, -INF, m0 + torch.log(l))[..., 0]                # log(0) where all are -inf
    p = torch.where(none, 0.0, e / l)
    if sink is not None:
        p = p[..., :-1]
    products = p[..., None] * v.permute(1, 0, 2)[:, None, :, :]                # [H, Sq, Sk, D]
    o = torch.where(visible[..., None], products, 0.0).sum(2)
    return o.permute(1, 0, 2), lse


def hidden_nonfinite(k, v, visible) -> torch.Tensor:
    """[H, Sq]: rows with a key they may not see holding a non-finite value in K or V — the
    rows issue 26's accepted rule lets NaN reach (causally masked keys leak through 0 * NaN)."""
    bad = ~(k.isfinite().all(-1) & v.isfinite().all(-1))                        # [Sk, H]
    visible = visible.expand(k.shape[1], visible.shape[-2], k.shape[0])
    return (~visible & bad.t()[:, None, :]).any(-1)


def attention_tolerance(q, k, v, visible, scale, dtype):
    """Per-element O tolerance [Sq, H, D] and per-row LSE tolerance [H, Sq], test_fuzz.py's
    fmha model over the keys a row sees (its shift: the kernel rounds Q * scale * log2(e) to
    q's dtype, moving every score of the row by up to u * scale * max_j sum_d |q_d k_jd|; P
    and O rounded to q's dtype), per column of V, plus half a subnormal step of q's dtype."""
    u = torch.finfo(dtype).eps / 2
    visible = visible.expand(q.shape[1], q.shape[0], k.shape[0])
    products = (q.abs().permute(1, 0, 2)[:, :, None, :] * k.abs().permute(1, 0, 2)[:, None, :, :]).sum(-1)
    products = torch.where(visible & products.isfinite(), products, 0.0)
    shift = u * scale * (products.amax(-1) if products.shape[-1] else products.sum(-1))     # [H, Sq]
    vabs = v.abs().permute(1, 0, 2)[:, None, :, :].expand(-1, q.shape[0], -1, -1)           # [H, Sq, Sk, D]
    vmax = torch.where(visible[..., None] & vabs.isfinite(), vabs, 0.0)
    vmax = vmax.amax(2) if vmax.shape[2] else vmax.sum(2)                                  # [H, Sq, D]
    grow = torch.where(vmax > 0, vmax * ((2 * shift).exp()[..., None] - 1 + 4 * u), 0.0)
    o_tol = grow.permute(1, 0, 2) + half_subnormal_step(dtype)
    return o_tol, shift, products.amax(-1) if products.shape[-1] else products.sum(-1)


def fp_tensor(shape, dtype, g, scale=1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def count(counts: Counter, *keys: str) -> None:
    for key in keys:
        counts[key] += 1


def report(op: str, counts: Counter, capsys, need_refused: bool = False) -> None:
    """Print the counts (uncaptured, so CI logs show them); both kinds explored where asked."""
    classes = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if k not in ("refused", "matched"))
    with capsys.disabled():
        print(f"\nfuzz values {op}: {counts['refused']} calls refused, {counts['matched']} matched the reference"
              f"{'; ' + classes if classes else ''}")
    assert counts["matched"] > 0, counts
    assert counts["refused"] > 0 or not need_refused, counts


def one_bf16_max_value(dtype, target: str, kind: str, place: str) -> str:
    """The placement to use: V near the bf16 maximum in several keys overflows the attention
    kernels' f32 P.V sum (a finding: test_attention_bf16_max_values_sum), so such a V is one
    element."""
    return "one" if dtype == torch.bfloat16 and target == "v" and kind in ("max", "-max") else place


# ------------------------------------------------------------------ fmha_fwd

FMHA_ARGS = ("q", "k", "v", "out", "lse", "causal", "softmax_scale", "return_lse", "heads_q")
FMHA_COUNTS: Counter = Counter()


@st.composite
def fmha_value_calls(draw):
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16]))
    target = draw(st.sampled_from(["q", "k", "v"]))
    kind = draw(st.sampled_from(KINDS))
    place = draw(st.sampled_from(PLACES))
    place = one_bf16_max_value(dtype, target, kind, place)
    return dict(dtype=dtype, target=target, kind=kind, place=place,
                seq_q=draw(st.sampled_from([1, 3, 17])), seq_k=draw(st.sampled_from([1, 5, 33])),
                heads_k=draw(st.sampled_from([1, 2])), group=draw(st.sampled_from([1, 2])),
                causal=draw(st.booleans()), return_lse=draw(st.booleans()), seed=draw(st.integers(0, 2**16)))


@settings(FUZZ, max_examples=40)
@given(fmha_value_calls())
def fuzz_fmha_values(c):
    g = torch.Generator().manual_seed(c["seed"])
    hk, hq = c["heads_k"], c["heads_k"] * c["group"]
    t = dict(q=fp_tensor((1, c["seq_q"], hq, 128), c["dtype"], g, 0.25),
             k=fp_tensor((1, c["seq_k"], hk, 128), c["dtype"], g),
             v=fp_tensor((1, c["seq_k"], hk, 128), c["dtype"], g))
    t[c["target"]] = inject(t[c["target"]], c["kind"], c["place"], g)
    result = call(FMHA_COUNTS, FMHA_ARGS, lambda: gfxasm.fmha_fwd(t["q"], t["k"], t["v"], causal=c["causal"],
                                                                  return_lse=c["return_lse"]))
    if result is None:
        count(FMHA_COUNTS, f"refused {c['target']} {c['kind']}")
        return
    o, lse = result if c["return_lse"] else (result, None)
    scale = 1 / math.sqrt(128)
    sq, sk = c["seq_q"], c["seq_k"]
    visible = torch.ones(sq, sk, dtype=torch.bool)
    if c["causal"]:
        visible = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + (sk - sq)
    q, k, v = (t[n][0].double() for n in ("q", "k", "v"))
    k, v = k.repeat_interleave(c["group"], 1), v.repeat_interleave(c["group"], 1)
    o_ref, lse_ref = attention_ieee(q, k, v, visible, scale)
    o_tol, shift, magnitude = attention_tolerance(q, k, v, visible, scale, c["dtype"])
    leak = hidden_nonfinite(k, v, visible)                                      # [H, Sq]: accepted, issue 26
    # accepted, issue 26: keys (or queries) near the bf16 maximum overflow the f32 dot
    # product of Q * scale * log2(e) and K, so such a row may be non-finite
    overflow = magnitude * scale * math.log2(math.e) >= 2.0**127                       # [H, Sq]
    ieee_close("out", o[0], o_ref, o_tol, may_nan=leak.t()[..., None], may_be_nonfinite=overflow.t()[..., None])
    if lse is not None:
        ieee_close("lse", lse[0], lse_ref, shift + 1e-5 * (1 + lse_ref.abs().nan_to_num(posinf=0, neginf=0)),
                   may_nan=leak, may_be_nonfinite=overflow)
    count(FMHA_COUNTS, "matched", f"{c['target']} {c['kind']}")


def test_fuzz_fmha_values(capsys):
    FMHA_COUNTS.clear()
    fuzz_fmha_values()
    report("fmha_fwd", FMHA_COUNTS, capsys)


# ------------------------------------------------------------------ mxfp8_gemm

GEMM_ARGS = ("a", "b", "a_scale", "b_scale", "out", "out_dtype", "kernel", "splits", "K")
GEMM_COUNTS: Counter = Counter()
FP8_KINDS = ("nan", "max", "-max", "subnormal", "-0.0")       # e4m3fn has no inf
SCALE_BYTES = (0, 1, 2, 253, 254, 255)                        # E8M0: 2^-127, 2^-126, 2^-125, 2^126, 2^127, NaN


def scale_bytes(shape, g: torch.Generator, low: int = 120, high: int = 134) -> torch.Tensor:
    return torch.randint(low, high, shape, generator=g, dtype=torch.uint8)


def inject_scale(s: torch.Tensor, byte: int, place: str, g: torch.Generator) -> torch.Tensor:
    """A copy of the uint8 scale bytes `s` with `byte` where `place` picks."""
    s = s.clone()
    s[placement(tuple(s.shape), place, g)] = byte
    return s


def product_ieee(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x @ y^T, |x| @ |y|^T) in float64, elementwise (IEEE: 0 * inf and NaN propagate)."""
    p = x[:, None, :] * y[None, :, :]
    return p.sum(-1), p.abs().sum(-1)


@st.composite
def gemm_value_calls(draw):
    target = draw(st.sampled_from(["a", "b", "a_scale", "b_scale"]))
    kind = draw(st.sampled_from(FP8_KINDS if target in ("a", "b") else SCALE_BYTES))
    m = draw(st.sampled_from([1, 2, 5, 17]))
    return dict(target=target, kind=kind, place=draw(st.sampled_from(PLACES)),
                kernel=draw(st.sampled_from(["auto", "gemv", "mfma"] if m <= 16 else ["auto", "mfma"])), m=m,
                n=draw(st.sampled_from([1, 3, 37])), k=draw(st.sampled_from([32, 96])),
                out_dtype=draw(st.sampled_from([torch.bfloat16, torch.float16])),
                scale_dtype=draw(st.sampled_from([torch.uint8, torch.float8_e8m0fnu])),
                splits=draw(st.sampled_from([None, 1, 2])), seed=draw(st.integers(0, 2**16)))


GEMM_BASE = dict(place="one", m=1, n=3, k=64, out_dtype=torch.bfloat16, scale_dtype=torch.uint8, splits=None,
                 seed=9)


@settings(FUZZ, max_examples=50)      # issue 26's reproducers: E8M0 bytes 254 and 0xFF with the GEMV
@example(dict(GEMM_BASE, target="b_scale", kind=254, kernel="gemv"))
@example(dict(GEMM_BASE, target="a_scale", kind=255, kernel="gemv"))
@given(gemm_value_calls())
def fuzz_mxfp8_gemm_values(c):
    from gfxasm.ops import mxfp8_gemm as op
    g = torch.Generator().manual_seed(c["seed"])
    m, n, k = c["m"], c["n"], c["k"]
    t = dict(a=fp_tensor((m, k), E4M3, g, 4), b=fp_tensor((n, k), E4M3, g, 4),
             a_scale=scale_bytes((m, k // 32), g), b_scale=scale_bytes((n, k // 32), g))
    if c["target"] in ("a", "b"):
        t[c["target"]] = inject(t[c["target"]], c["kind"], c["place"], g)
    else:
        t[c["target"]] = inject_scale(t[c["target"]], c["kind"], c["place"], g)
    a_scale, b_scale = (t[n_].view(c["scale_dtype"]) for n_ in ("a_scale", "b_scale"))
    result = call(GEMM_COUNTS, GEMM_ARGS, lambda: gfxasm.mxfp8_gemm(
        t["a"], a_scale, t["b"], b_scale, out_dtype=c["out_dtype"], kernel=c["kernel"], splits=c["splits"]))
    what = f"{c['target']} {c['kind']}"
    if result is None:
        count(GEMM_COUNTS, f"refused {what}")
        return
    exact, magnitude = product_ieee(op.dequantize(t["a"], t["a_scale"]), op.dequantize(t["b"], t["b_scale"]))
    # the kernels accumulate in f32 (module docstring; error_bound counts sum |a' b'| in f32): where
    # that sum reaches 2^128 a partial sum may overflow even if the exact sum cancels to a finite value
    overflow = magnitude >= 2.0**127
    ieee_close("out", result, exact, op.error_bound(t["a"], t["a_scale"], t["b"], t["b_scale"],
                                                                      c["out_dtype"]), may_be_nonfinite=overflow)
    count(GEMM_COUNTS, "matched", what)


def test_fuzz_mxfp8_gemm_values(capsys):
    GEMM_COUNTS.clear()
    fuzz_mxfp8_gemm_values()
    report("mxfp8_gemm", GEMM_COUNTS, capsys)


# ------------------------------------------------------------------ swiglu_mxfp8_quant

SWIGLU_ARGS = ("x", "alpha", "beta", "limit", "q", "scale", "out")
SWIGLU_COUNTS: Counter = Counter()


@st.composite
def swiglu_value_calls(draw):
    return dict(dtype=draw(st.sampled_from([torch.bfloat16, torch.float16])), kind=draw(st.sampled_from(KINDS)),
                place=draw(st.sampled_from(PLACES)), M=draw(st.sampled_from([1, 3])),
                I=draw(st.sampled_from([32, 64])), alpha=draw(st.sampled_from([0.0, 1.702])),
                beta=draw(st.sampled_from([0.0, 1.0])), limit=draw(st.sampled_from([7.0, INF])),
                seed=draw(st.integers(0, 2**16)))


@settings(FUZZ, max_examples=60)
@given(swiglu_value_calls())
def fuzz_swiglu_values(c):
    from gfxasm.ops.swiglu_quant import activation_reference, quantize_reference
    g = torch.Generator().manual_seed(c["seed"])
    M, I = c["M"], c["I"]
    x = inject(fp_tensor((M, 2 * I), c["dtype"], g, 4), c["kind"], c["place"], g)
    result = call(SWIGLU_COUNTS, SWIGLU_ARGS, lambda: gfxasm.swiglu_mxfp8_quant(x, alpha=c["alpha"], beta=c["beta"],
                                                                                limit=c["limit"]))
    what = c["kind"]
    if result is None:
        count(SWIGLU_COUNTS, f"refused {what}")
        return
    q, s = result
    # documented (module docstring): an input holding Inf or NaN gives an unspecified block;
    # every other block must be right
    blocks = (~(x[:, :I].isfinite() & x[:, I:].isfinite())).view(M, I // 32, 32).any(-1)      # [M, I/32]
    y = activation_reference(x, c["alpha"], c["beta"], c["limit"])
    # a finite bf16 input whose activation passes f32's range (gate or up near the bf16 max)
    # gives a wrong block, NaN codes: a finding, pinned by test_swiglu_activation_past_f32_range
    past_f32 = (y.abs() >= 2.0**128).view(M, I // 32, 32).any(-1) & ~blocks
    if past_f32.any():
        count(SWIGLU_COUNTS, "blocks past f32 (xfail)")
        blocks = blocks | past_f32
    q_ref, s_ref = quantize_reference(y.nan_to_num(0.0, 0.0, 0.0))                           # (unspecified blocks)
    keep = ~blocks
    s_k = s.view(torch.uint8).long()
    if c["alpha"] == 0.0:            # sigmoid exactly 1/2: exact (test_fuzz.py's rule), zeros of either sign
        assert torch.equal(s_k[keep], s_ref.view(torch.uint8).long()[keep]), "scale"
        ieee_close("q", q.double().view(M, -1, 32)[keep], q_ref.double().view(M, -1, 32)[keep], 0.0)
    else:                            # f32 sigmoid: a scale may move by one near a power of two, a code by one step
        assert ((s_k - s_ref.view(torch.uint8).long()).abs()[keep] <= 1).all(), "scale"
        X = torch.ldexp(torch.ones(M, I // 32, dtype=torch.float64), s_k - 127).repeat_interleave(32, 1)
        tol = 2.0 ** -3 * y.abs() + 2.0 ** -8 * X
        ieee_close("q", (q.double() * X).view(M, -1, 32)[keep], y.view(M, -1, 32)[keep], tol.view(M, -1, 32)[keep])
    count(SWIGLU_COUNTS, "matched", what)


def test_fuzz_swiglu_values(capsys):
    SWIGLU_COUNTS.clear()
    fuzz_swiglu_values()
    report("swiglu_mxfp8_quant", SWIGLU_COUNTS, capsys)



# ------------------------------------------------------------------ batch_prefill

PREFILL_ARGS = ("q", "k_cache", "v_cache", "qo_indptr", "kv_indptr", "kv_page_indices", "kv_last_page_len",
                "block_table", "seqlens_k", "causal", "softmax_scale", "q_descale", "k_descale", "v_descale",
                "kv_block_descale", "out", "return_lse", "page_size", "heads", "q's")
PREFILL_COUNTS: Counter = Counter()
# descales and block scales: NaN, infinities, zeros, subnormal, below, at and above the documented
# 2^-62 .. 2^62, negative, f32's largest
DESCALES = (NAN, INF, -INF, 0.0, -0.0, 1e-45, 2.0**-63, 2.0**-60, 2.0**60, 2.0**63, -1.0, 3.4e38)


@st.composite
def prefill_value_calls(draw):
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16, E4M3, E4M3]))
    scales = draw(st.sampled_from(["tensor", "block"])) if dtype == E4M3 else "none"
    targets = ["q", "k", "v"] + (["q_descale", "k_descale", "v_descale"] if scales == "tensor" else []) + \
        (["kv_block_descale", "unused_block_descale"] if scales == "block" else [])
    target = draw(st.sampled_from(targets))
    kinds = DESCALES if "descale" in target else FP8_KINDS if dtype == E4M3 else KINDS
    n = draw(st.integers(1, 2))
    kind = draw(st.sampled_from(kinds))
    return dict(dtype=dtype, scales=scales, target=target, kind=kind,
                place=one_bf16_max_value(dtype, target, kind, draw(st.sampled_from(PLACES))),
                seq_q=[draw(st.sampled_from([1, 5, 17])) for _ in range(n)],
                seq_k=[draw(st.sampled_from([1, 9, 33])) for _ in range(n)],
                page=draw(st.sampled_from([1, 16, 64])), heads=draw(st.sampled_from([(1, 1), (2, 1), (2, 2)])),
                table=draw(st.sampled_from(["sglang", "vllm"])), causal=draw(st.booleans()),
                return_lse=draw(st.booleans()), seed=draw(st.integers(0, 2**16)))


def inject_keys(cache: torch.Tensor, lists, seq_k, page: int, kind: str, place: str, g) -> torch.Tensor:
    """`inject` over the keys the sequences use ([keys, Hkv, 128] gathered through the page
    lists), written back into a copy of the pool."""
    pages = torch.cat([lst[torch.arange(n) // page].long() for lst, n in zip(lists, seq_k)])
    slots = torch.cat([torch.arange(n) % page for n in seq_k])
    cache = cache.clone()
    bits = cache.view(torch.uint8)
    bits[pages, slots] = inject(cache[pages, slots], kind, place, g).view(torch.uint8)
    return cache


PREFILL_BASE = dict(dtype=E4M3, scales="tensor", seq_q=[5, 1], seq_k=[9, 33], page=16, heads=(2, 1), table="sglang",
                   causal=False, return_lse=True, seed=3)


def check_batch_prefill(c: dict) -> None:
    """One call as `c` says (prefill_value_calls' fields), refused or checked against the
    float64 IEEE reference."""
    from gfxasm.ops import batch_prefill as bp
    from tests.test_fuzz import HEAD_DIM, prefill_inputs
    g = torch.Generator().manual_seed(c["seed"])
    a = prefill_inputs(dict(c, corrupt="none", q_layout="contiguous", head_dim=HEAD_DIM, cache_dtype=c["dtype"],
                            q_exponents=(0, 0)), g)
    q, k, v, scales, target = a["q"], a["k"], a["v"], a["scales"], c["target"]
    page, fp8 = c["page"], c["dtype"] == E4M3
    if target == "q":
        q = inject(q, c["kind"], c["place"], g)
    elif target in ("k", "v"):
        cache = inject_keys(a[target], a["lists"], c["seq_k"], page, c["kind"], c["place"], g)
        k, v = (cache, v) if target == "k" else (k, cache)
    elif target == "kv_block_descale":          # the pages the tables use
        used = torch.cat(a["lists"]).long().unique()
        block = scales["kv_block_descale"].clone()
        chosen = block[used]
        chosen[placement(tuple(chosen.shape), c["place"], g)] = c["kind"]
        block[used] = chosen
        scales["kv_block_descale"] = block
    elif target == "unused_block_descale":      # pool pages no table names: never read, may hold anything
        block = scales["kv_block_descale"].clone()
        unused = torch.ones(block.shape[0], dtype=torch.bool)
        unused[torch.cat(a["lists"]).long()] = False
        block[unused] = c["kind"]
        scales["kv_block_descale"] = block
    else:
        scales[target] = torch.tensor([c["kind"]], dtype=torch.float32)
    result = call(PREFILL_COUNTS, PREFILL_ARGS, lambda: gfxasm.batch_prefill(
        q, k, v, a["qo"], **a["tables"], causal=c["causal"], return_lse=c["return_lse"], **scales))
    what = f"{target} {c['kind']}"
    if result is None:
        count(PREFILL_COUNTS, f"refused {what}")
        return
    o, lse = result if c["return_lse"] else (result, None)
    scale = 1 / math.sqrt(128)
    qd, kd, vd = (float(scales.get(n, torch.ones(1))) for n in ("q_descale", "k_descale", "v_descale"))
    block = scales.get("kv_block_descale")
    group = q.shape[1] // k.shape[2]
    for b, (sq, sk) in enumerate(zip(c["seq_q"], c["seq_k"])):
        q0 = int(a["qo"][b])
        rows = torch.arange(sk)
        pages = a["lists"][b][rows // page].long()
        kb, vb = k[pages, rows % page].double() * kd, v[pages, rows % page].double() * vd
        if block is not None:
            kb, vb = kb * block[pages][..., :1].double(), vb * block[pages][..., 1:].double()
        qb = q[q0:q0 + sq].double() * qd
        kb, vb = kb.repeat_interleave(group, 1), vb.repeat_interleave(group, 1)
        visible = torch.ones(sq, sk, dtype=torch.bool)
        if c["causal"]:
            visible = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + (sk - sq)
        o_ref, lse_ref = attention_ieee(qb, kb, vb, visible, scale)
        # documented: a NaN in K the causal mask hides from a row does not reach it, one in V
        # can (0 * NaN); so can an infinite V (0 * inf)
        leak = hidden_nonfinite(torch.zeros_like(vb), vb, visible)[..., None]              # [H, Sq, 1]
        o_tol, shift, magnitude = attention_tolerance(qb, kb, vb, visible, scale, torch.bfloat16 if fp8 else q.dtype)
        if fp8:                 # scores exact; P rounded to e4m3 (bp.fp8_p_bound), O to bf16
            shift = torch.zeros_like(shift)
            s = (qb.permute(1, 0, 2)[:, :, None, :] * kb.permute(1, 0, 2)[:, None, :, :]).sum(-1) * scale
            s = torch.where(visible & ~s.isnan(), s, -INF)
            lse_row = torch.where(lse_ref.isfinite(), lse_ref, 0.0)[..., None]
            p = torch.where(s.isfinite() & lse_ref.isfinite()[..., None], torch.exp(s - lse_row), 0.0)
            ratio = None if block is None or page >= bp.BLOCK_SCALE_MIN_PAGE else \
                bp.tile_v_ratio(block[pages][..., 1].double()).repeat_interleave(group, 1)
            v_clean = torch.where(vb.isfinite(), vb, 0.0)
            o_tol = bp.fp8_p_bound(p, s, v_clean, ratio) + 2.0**-8 * o_ref.abs().nan_to_num(0, 0, 0) + \
                half_subnormal_step(torch.bfloat16)
        overflow = magnitude * scale * math.log2(math.e) >= 2.0**127      # issue 26's accepted f32 overflow
        ieee_close(f"out[seq {b}]", o[q0:q0 + sq], o_ref, o_tol, may_nan=leak.transpose(0, 1),
                   may_be_nonfinite=overflow.t()[..., None])
        if lse is not None:
            ieee_close(f"lse[seq {b}]", lse[:, q0:q0 + sq], lse_ref,
                       shift + 1e-5 * (1 + lse_ref.abs().nan_to_num(posinf=0, neginf=0)),
                       may_nan=hidden_nonfinite(torch.zeros_like(vb), vb, visible), may_be_nonfinite=overflow)
    count(PREFILL_COUNTS, "matched", what)


# issue 26's reproducers stand as explicit examples: an e4m3 NaN code in K (and in V) of FP8 inputs
PREFILL_EXAMPLES = [dict(PREFILL_BASE, target=t, kind="nan", place="one") for t in ("k", "v")]
fuzz_batch_prefill_values = settings(FUZZ, max_examples=40)(
    example(PREFILL_EXAMPLES[0])(example(PREFILL_EXAMPLES[1])(given(prefill_value_calls())(check_batch_prefill))))


def test_fuzz_batch_prefill_values(capsys):
    PREFILL_COUNTS.clear()
    fuzz_batch_prefill_values()
    report("batch_prefill", PREFILL_COUNTS, capsys, need_refused=True)


# ------------------------------------------------------------------ decode_attention

DECODE_ARGS = ("q", "k_cache", "v_cache", "cache_seqlens", "block_table", "k_descale", "v_descale", "k_scale_shift",
               "v_scale_shift", "softmax_scale", "causal", "window_size", "sinks", "num_splits", "out", "return_lse")
DECODE_COUNTS: Counter = Counter()
SINKS = (NAN, INF, -INF, 1e30, -1e30, -0.0, 1e-45, 3.4e38)


@st.composite
def decode_value_calls(draw):
    fp8 = draw(st.sampled_from(["no", "no", "descale", "pairs"]))
    sinks = draw(st.booleans())
    targets = ["q", "k", "v"] + (["k_descale", "v_descale"] if fp8 == "descale" else []) + \
        (["k_scale_shift", "v_scale_shift"] if fp8 == "pairs" else []) + (["sinks"] if sinks else [])
    target = draw(st.sampled_from(targets))
    kinds = {"k_descale": DESCALES, "v_descale": DESCALES, "sinks": SINKS}.get(target, KINDS)
    if target in ("k", "v") and fp8 != "no":
        kinds = FP8_KINDS
    heads_kv, kind = draw(st.sampled_from([1, 2])), draw(st.sampled_from(kinds))
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16]))
    return dict(fp8=fp8, sinks=sinks, target=target, kind=kind, dtype=dtype,
                place=one_bf16_max_value(E4M3 if fp8 != "no" else dtype, target, kind, draw(st.sampled_from(PLACES))),
                dim=draw(st.sampled_from([64, 128])), batch=draw(st.sampled_from([1, 2])),
                seq_q=draw(st.sampled_from([1, 2, 5])), heads_kv=heads_kv,
                heads_q=heads_kv * draw(st.sampled_from([1, 2])), page_size=draw(st.sampled_from([None, 16])),
                capacity=draw(st.sampled_from([16, 40])), overfull=False, causal=draw(st.booleans()),
                window_left=draw(st.sampled_from([-1, -1, 3])), num_splits=draw(st.sampled_from([None, 2])),
                return_lse=draw(st.booleans()), seed=draw(st.integers(0, 2**16)))


def decode_tokens(t: torch.Tensor, a: dict, b: int, n: int) -> torch.Tensor:
    """Rows 0..n-1 of batch entry b's keys (paged through the block table or contiguous)."""
    if a["block_table"] is not None:
        t = t[a["block_table"][b].long()].flatten(0, 1)
    else:
        t = t[b]
    return t[:n]


def check_decode_attention(c: dict) -> None:
    """One call as `c` says (decode_value_calls' fields; "seqlens" overrides the drawn ones),
    refused or checked against the float64 IEEE reference."""
    from tests.test_fuzz import decode_inputs
    g = torch.Generator().manual_seed(c["seed"])
    a = decode_inputs(c, g)
    if "seqlens" in c:
        a["cache_seqlens"] = torch.tensor(c["seqlens"], dtype=torch.int32)
    target, kind = c["target"], c["kind"]
    if target == "q":
        a["q"] = inject(a["q"], kind, c["place"], g)
    elif target in ("k", "v", "k_scale_shift", "v_scale_shift"):     # the slots the sequences read
        name = {"k": "k_cache", "v": "v_cache"}.get(target, target)
        t = a[name].clone()
        for b in range(c["batch"]):
            n = int(a["cache_seqlens"][b])
            if a["block_table"] is None:
                t[b, :n] = inject(t[b, :n], kind, c["place"], g)
            else:
                slots = (a["block_table"][b].long()[:, None] * t.shape[1] + torch.arange(t.shape[1])).view(-1)[:n]
                flat = t.view(-1, *t.shape[2:])
                flat.view(torch.uint8)[slots] = inject(flat[slots], kind, c["place"], g).view(torch.uint8)
        a[name] = t
    elif target == "sinks":
        a["sinks"] = a["sinks"].clone()
        a["sinks"][placement(tuple(a["sinks"].shape), c["place"], g)] = kind
    else:
        a[target] = torch.tensor([kind], dtype=torch.float32)
    result = call(DECODE_COUNTS, DECODE_ARGS, lambda: gfxasm.decode_attention(
        **a, causal=c["causal"], window_size=(c["window_left"], -1), num_splits=c["num_splits"],
        return_lse=c["return_lse"]))
    what = f"{target} {kind}"
    if result is None:
        count(DECODE_COUNTS, f"refused {what}")
        return
    o, lse = result if c["return_lse"] else (result, None)
    scale = 1 / math.sqrt(c["dim"])
    group = c["heads_q"] // c["heads_kv"]
    u = torch.finfo(c["dtype"]).eps / 2
    for b in range(c["batch"]):
        n, seq_q = int(a["cache_seqlens"][b]), c["seq_q"]
        k_raw, v_raw = (decode_tokens(a[x], a, b, n).double() for x in ("k_cache", "v_cache"))
        k, v, v_mag = k_raw, v_raw, v_raw
        if a["k_descale"] is not None:
            k, v = k_raw * a["k_descale"].double(), v_raw * a["v_descale"].double()
            v_mag = v
        if a["k_scale_shift"] is not None:
            kp, vp = (decode_tokens(a[x], a, b, n).double() for x in ("k_scale_shift", "v_scale_shift"))
            k, v = k_raw * kp[..., :1] + kp[..., 1:], v_raw * vp[..., :1] + vp[..., 1:]
            v_mag = v_raw * vp[..., :1]      # the shifts are added after P.V, unrounded (documented)
        k, v, v_mag = (x.repeat_interleave(group, 1) for x in (k, v, v_mag))
        q = a["q"][b].double()
        j, last = torch.arange(n)[None, :], torch.arange(seq_q)[:, None] + n - seq_q
        visible = (j <= last) if c["causal"] else torch.ones(seq_q, n, dtype=torch.bool)
        if c["window_left"] >= 0:
            visible = visible & (j >= last - c["window_left"])
        o_ref, lse_ref = attention_ieee(q, k, v, visible, scale, a["sinks"])
        # tolerance (test_fuzz.py's): P rounded to q's dtype before P.V, O rounded once: 2u (P|V| + |O|)
        p_abs = attention_ieee(q, k, torch.where(v_mag.isfinite(), v_mag.abs(), 0.0), visible, scale, a["sinks"])[0]
        o_tol = 2 * u * (p_abs.nan_to_num(0, 0, 0) + o_ref.abs().nan_to_num(0, 0, 0)) + 1e-5
        leak = hidden_nonfinite(k, v, visible)                              # accepted, issue 26
        # accepted, issue 26: q.k overflowing f32 (bf16 values near the maximum; FP8 codes before
        # their descale) may make the row non-finite; the raw dot may be formed before the scale
        products = (q.abs().permute(1, 0, 2)[:, :, None, :] *
                    torch.maximum(k.abs(), k_raw.repeat_interleave(group, 1).abs()).permute(1, 0, 2)[:, None]).sum(-1)
        overflow = (products.nan_to_num(0, 0, 0) * max(scale, 1) * math.log2(math.e) >= 2.0**127).any(-1)
        # documented (module docstring): descales give the reference's answer "where the answer
        # fits"; where O overflows the output dtype the kernel gives NaN, not +-inf
        f = torch.finfo(c["dtype"])
        beyond = o_ref.abs() + o_tol >= f.max * (1 + f.eps / 4)
        ieee_close(f"out[{b}]", o[b], o_ref, o_tol, may_nan=leak.t()[..., None] | beyond,
                   may_be_nonfinite=overflow.t()[..., None])
        if lse is not None:
            ieee_close(f"lse[{b}]", lse[b], lse_ref, 1e-4 * (1 + lse_ref.abs().nan_to_num(posinf=0, neginf=0)),
                       may_nan=leak, may_be_nonfinite=overflow)
    count(DECODE_COUNTS, "matched", what)


# issue 26's reproducers stand as explicit examples: an fp16 q holding +inf (non-causal, contiguous
# cache), an e4m3 NaN code in an FP8 cache
DECODE_BASE = dict(fp8="no", sinks=False, place="one", dtype=torch.float16, dim=64, batch=1, seq_q=1, heads_kv=1,
                   heads_q=1, page_size=None, capacity=16, overfull=False, causal=False, window_left=-1,
                   num_splits=None, return_lse=True, seed=5)
DECODE_EXAMPLES = [dict(DECODE_BASE, target="q", kind="inf"),
                   dict(DECODE_BASE, fp8="descale", target="k", kind="nan", dtype=torch.bfloat16)]
fuzz_decode_attention_values = settings(FUZZ, max_examples=60)(
    example(DECODE_EXAMPLES[0])(example(DECODE_EXAMPLES[1])(given(decode_value_calls())(check_decode_attention))))


def test_fuzz_decode_attention_values(capsys):
    DECODE_COUNTS.clear()
    fuzz_decode_attention_values()
    report("decode_attention", DECODE_COUNTS, capsys)


# ------------------------------------------------------------------ mxfp8_moe_gemm

MOE_ARGS = ("a", "a_scale", "w", "w_scale", "sorted_token_ids", "expert_ids", "num_tokens_post_padded", "a_div",
            "topk_weights", "out", "out_dtype", "K", "block_m")
MOE_COUNTS: Counter = Counter()
F32_KINDS = KINDS                                   # for float32 tensors: topk_weights


def routing(t: int, top_k: int, e: int, block_m: int, g: torch.Generator):
    """(topk_ids [t, top_k], sorted_token_ids, expert_ids, num_tokens_post_padded): distinct
    experts per token, vLLM's layout from moe_align's reference."""
    from gfxasm.ops import moe_align
    ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(t)]).to(torch.int32)
    sorted_ids, expert_ids, post = moe_align.reference(ids.flatten().tolist(), block_m, e, None, True)
    I = lambda x: torch.tensor(x, dtype=torch.int32)        # noqa: E731
    return ids, I(sorted_ids), I(expert_ids), I([post])


@st.composite
def moe_gemm_value_calls(draw):
    target = draw(st.sampled_from(["a", "w", "a_scale", "w_scale", "topk_weights"]))
    kind = draw(st.sampled_from({"a": FP8_KINDS, "w": FP8_KINDS, "topk_weights": F32_KINDS}.get(target, SCALE_BYTES)))
    return dict(target=target, kind=kind, place=draw(st.sampled_from(PLACES)), t=draw(st.sampled_from([1, 3])),
                top_k=draw(st.sampled_from([1, 2])), e=draw(st.sampled_from([2, 4])), n=draw(st.sampled_from([17, 40])),
                k=draw(st.sampled_from([32, 96])), block_m=draw(st.sampled_from([16, 32])),
                down=draw(st.booleans()), out_dtype=draw(st.sampled_from([torch.bfloat16, torch.float16])),
                seed=draw(st.integers(0, 2**16)))


@settings(FUZZ, max_examples=40)
@given(moe_gemm_value_calls())
def fuzz_mxfp8_moe_gemm_values(c):
    from gfxasm.ops import mxfp8_gemm as gemm_op
    g = torch.Generator().manual_seed(c["seed"])
    t_, top_k, e, n, k = c["t"], c["top_k"], c["e"], c["n"], c["k"]
    a_div = 1 if c["down"] else top_k                       # down: a row per slot; gate_up: per token
    m = t_ * top_k if c["down"] else t_
    x = dict(a=fp_tensor((m, k), E4M3, g, 4), w=fp_tensor((e, n, k), E4M3, g, 4),
             a_scale=scale_bytes((m, k // 32), g), w_scale=scale_bytes((e, n, k // 32), g),
             topk_weights=torch.rand(t_, top_k, generator=g) + 0.1)
    target = c["target"]
    if target in ("a_scale", "w_scale"):
        x[target] = inject_scale(x[target], c["kind"], c["place"], g)
    else:
        x[target] = inject(x[target], c["kind"], c["place"], g)
    _, sorted_ids, expert_ids, post = routing(t_, top_k, e, c["block_m"], g)
    result = call(MOE_COUNTS, MOE_ARGS, lambda: gfxasm.mxfp8_moe_gemm(
        x["a"], x["a_scale"], x["w"], x["w_scale"], sorted_ids, expert_ids, post, a_div=a_div,
        topk_weights=x["topk_weights"], out_dtype=c["out_dtype"]))
    what = f"{target} {c['kind']}"
    if result is None:
        count(MOE_COUNTS, f"refused {what}")
        return
    A = gemm_op.dequantize(x["a"], x["a_scale"])
    block_m = c["block_m"]
    for b in range(-(-int(post[0]) // block_m)):
        ex = int(expert_ids[b])
        W = gemm_op.dequantize(x["w"][ex], x["w_scale"][ex])
        for slot in sorted_ids[b * block_m:(b + 1) * block_m].tolist():
            if slot >= t_ * top_k:
                continue
            exact, magnitude = product_ieee(A[slot // a_div][None], W)
            weight = x["topk_weights"].reshape(-1)[slot].double()
            # f32 accumulation (as mxfp8_gemm's): partial sums may overflow where sum |a' w'| reaches 2^127
            tol = torch.finfo(c["out_dtype"]).eps * (exact * weight).abs() + 2**-20 * magnitude * weight.abs() + 2**-24
            ieee_close(f"out[{slot}]", result[slot], (exact * weight)[0], tol[0],
                       may_be_nonfinite=(magnitude >= 2.0**127)[0])
    count(MOE_COUNTS, "matched", what)


def test_fuzz_mxfp8_moe_gemm_values(capsys):
    MOE_COUNTS.clear()
    fuzz_mxfp8_moe_gemm_values()
    report("mxfp8_moe_gemm", MOE_COUNTS, capsys)


# ------------------------------------------------------------------ mxfp8_moe

LAYER_ARGS = ("x", "x_scale", "w1", "w1_scale", "w2", "w2_scale", "topk_weights", "topk_ids", "expert_map", "alpha",
              "beta", "limit", "block_m", "out", "a", "a_scale", "w", "w_scale")
LAYER_COUNTS: Counter = Counter()


@st.composite
def layer_value_calls(draw):
    target = draw(st.sampled_from(["x", "w1", "w2", "x_scale", "w1_scale", "w2_scale", "topk_weights"]))
    kind = draw(st.sampled_from({"topk_weights": F32_KINDS}.get(target, SCALE_BYTES if "scale" in target
                                                                   else FP8_KINDS)))
    return dict(target=target, kind=kind, place=draw(st.sampled_from(PLACES)), T=draw(st.sampled_from([1, 3])),
                top_k=draw(st.sampled_from([1, 2])), block_m=draw(st.sampled_from([None, 16])),
                seed=draw(st.integers(0, 2**16)))


@settings(FUZZ, max_examples=20)
@given(layer_value_calls())
def fuzz_mxfp8_moe_values(c):
    """The layer (tests/test_moe.py's float64 reference and bound) on operands with special
    values. Documented (swiglu_mxfp8_quant, whose arithmetic the fused gate_up step repeats
    bit for bit): a non-finite activation input gives an unspecified block, so a token with
    a non-finite gate_up sum (or one past bf16, where h is rounded) has an unspecified output
    row; every other token's row must agree, NaN and infinities included."""
    from gfxasm.ops import mxfp8_gemm as gemm_op
    from tests.test_moe import layer_operands, layer_reference
    g = torch.Generator().manual_seed(c["seed"])
    T, top_k, E, H, I_ = c["T"], c["top_k"], 4, 64, 32
    x = dict(zip(("x", "x_scale", "w1", "w1_scale", "w2", "w2_scale"), layer_operands(T, H, I_, E, g)))
    x = {n: t.view(torch.uint8) if "scale" in n else t for n, t in x.items()}
    x["topk_weights"] = torch.rand(T, top_k, generator=g) + 0.1
    target = c["target"]
    if "scale" in target:
        x[target] = inject_scale(x[target], c["kind"], c["place"], g)
    else:
        x[target] = inject(x[target], c["kind"], c["place"], g)
    ids = torch.stack([torch.randperm(E, generator=g)[:top_k] for _ in range(T)]).to(torch.int32)
    result = call(LAYER_COUNTS, LAYER_ARGS, lambda: gfxasm.mxfp8_moe(**x, topk_ids=ids, block_m=c["block_m"]))
    what = f"{target} {c['kind']}"
    if result is None:
        count(LAYER_COUNTS, f"refused {what}")
        return
    X = gemm_op.dequantize(x["x"], x["x_scale"])
    unspecified = torch.zeros(T, dtype=torch.bool)
    for t_ in range(T):
        for e in ids[t_].tolist():
            h = product_ieee(gemm_op.dequantize(x["w1"][e], x["w1_scale"][e]), X[t_][None])[0]
            unspecified[t_] |= bool((~h.isfinite() | (h.abs() >= torch.finfo(torch.bfloat16).max)).any())
    if unspecified.any():
        count(LAYER_COUNTS, "tokens unspecified (documented)")
    ids_ref = torch.where(unspecified[:, None], -1, ids)             # the reference skips those tokens
    ref, bound = layer_reference(x["x"], x["x_scale"], x["w1"], x["w1_scale"], x["w2"], x["w2_scale"],
                                 x["topk_weights"], ids_ref)
    keep = ~unspecified
    # layer_reference's bound is relative; in bf16's subnormal range each of the top_k weighted
    # rows and the sum is rounded by up to half a subnormal step absolute
    subnormal = (top_k + 1) * half_subnormal_step(torch.bfloat16)
    # the down GEMM accumulates in f32 (as mxfp8_gemm's): where sum |w2' q| may reach 2^127 a partial
    # sum may overflow; |q| <= 64 (|SwiGLU| <= 7 * 1 * (7 + 1) with the default limit, then MX-FP8)
    overflow = torch.zeros(T, H, dtype=torch.bool)
    for t_ in range(T):
        for j, e in enumerate(ids[t_].tolist()):
            w2_sum = gemm_op.dequantize(x["w2"][e], x["w2_scale"][e]).abs().sum(-1).nan_to_num(0.0)
            overflow[t_] |= 64 * w2_sum * float(x["topk_weights"][t_, j].abs().nan_to_num(0.0)) >= 2.0**127
    ieee_close("out", result[keep], ref[keep], bound[keep] + subnormal,
               may_be_nonfinite=overflow[keep])
    count(LAYER_COUNTS, "matched", what)


def test_fuzz_mxfp8_moe_values(capsys):
    LAYER_COUNTS.clear()
    fuzz_mxfp8_moe_values()
    report("mxfp8_moe", LAYER_COUNTS, capsys)


# ------------------------------------------------------------------ every scalar-like class, exhaustively

SWEEP_COUNTS: Counter = Counter()
DECODE_SWEEP = dict(fp8="no", sinks=True, place="one", dtype=torch.bfloat16, dim=64, batch=2, seq_q=2, heads_kv=1,
                    heads_q=2, page_size=16, capacity=40, overfull=False, causal=True, window_left=-1,
                    num_splits=None, return_lse=True, seed=7, seqlens=[0, 9])     # entry 0 sees no key
PREFILL_SWEEP = dict(dtype=E4M3, place="one", seq_q=[5, 1], seq_k=[9, 33], page=16, heads=(2, 1), table="sglang",
                     causal=True, return_lse=True, seed=7)


def sweep_cases() -> list[tuple[str, dict]]:
    """Every sink and descale value of the classes for every argument that takes one: each is
    refused on the host (outside the documented range) or launched and checked."""
    cases = [("decode_attention", dict(DECODE_SWEEP, target="sinks", kind=v)) for v in SINKS]
    cases += [("decode_attention", dict(DECODE_SWEEP, fp8="descale", target=n, kind=v))
              for n in ("k_descale", "v_descale") for v in DESCALES]
    cases += [("batch_prefill", dict(PREFILL_SWEEP, scales="tensor", target=n, kind=v))
              for n in ("q_descale", "k_descale", "v_descale") for v in DESCALES]
    cases += [("batch_prefill", dict(PREFILL_SWEEP, scales="block", target=n, kind=v))
              for n in ("kv_block_descale", "unused_block_descale") for v in DESCALES]
    return cases


def test_every_sink_and_descale_value(capsys):
    """decode_attention's sinks (a row without keys included: its LSE is the sink's) and
    k/v descales, batch_prefill's q/k/v descales and block scales (on pages the tables use
    and on pages they do not), each value of SINKS / DESCALES once."""
    checks = {"decode_attention": (check_decode_attention, DECODE_COUNTS),
              "batch_prefill": (check_batch_prefill, PREFILL_COUNTS)}
    totals = Counter()
    for op, c in sweep_cases():
        check, counts = checks[op]
        before = counts["refused"]
        try:
            check(c)
        except AssertionError as error:
            raise AssertionError(f"{op} {c['target']} = {c['kind']}: {error}") from None
        totals[f"{op} refused" if counts["refused"] > before else f"{op} matched"] += 1
    with capsys.disabled():
        print(f"\nfuzz values sinks and descales: {dict(sorted(totals.items()))}")
    assert totals["decode_attention matched"] and totals["batch_prefill matched"], totals

# ------------------------------------------------------------------ every tensor of a call on one device

def device_cases(seed: int = 26) -> dict:
    """Per op (and form): (the call, its tensor arguments, all on the CPU, a valid call);
    the data drawn from `seed`, outputs poisoned."""
    from gfxasm.ops import moe_align
    g = torch.Generator().manual_seed(seed)
    bf, u8, i32 = torch.bfloat16, torch.uint8, torch.int32
    I = lambda x: torch.tensor(x, dtype=i32)                # noqa: E731
    e4 = lambda *s: fp_tensor(s, E4M3, g)                   # noqa: E731
    sc = lambda *s: scale_bytes(s, g)                       # noqa: E731
    fmha = dict(q=fp_tensor((1, 2, 2, 128), bf, g), k=fp_tensor((1, 3, 1, 128), bf, g),
                v=fp_tensor((1, 3, 1, 128), bf, g))
    prefill = dict(q=fp_tensor((3, 2, 128), bf, g), k_cache=fp_tensor((4, 16, 1, 128), bf, g),
                   v_cache=fp_tensor((4, 16, 1, 128), bf, g), qo_indptr=I([0, 3]))
    sglang = dict(kv_indptr=I([0, 1]), kv_page_indices=I([2]), kv_last_page_len=I([5]))
    vllm = dict(block_table=I([[2]]), seqlens_k=I([5]))
    prefill_fp8 = dict(q=e4(3, 2, 128), k_cache=e4(4, 16, 1, 128), v_cache=e4(4, 16, 1, 128), qo_indptr=I([0, 3]),
                       **sglang)
    descales = dict(q_descale=torch.tensor([0.5]), k_descale=torch.tensor([1.5]), v_descale=torch.tensor([0.75]))
    decode = dict(q=fp_tensor((1, 1, 2, 64), bf, g), k_cache=fp_tensor((3, 16, 1, 64), bf, g),
                  v_cache=fp_tensor((3, 16, 1, 64), bf, g), cache_seqlens=I([20]), block_table=I([[1, 2]]))
    decode_fp8 = dict(decode, k_cache=e4(3, 16, 1, 64), v_cache=e4(3, 16, 1, 64))
    pairs = dict(k_scale_shift=torch.rand(3, 16, 1, 2, generator=g).half() + 0.5,
                 v_scale_shift=torch.rand(3, 16, 1, 2, generator=g).half() + 0.5)
    gemm = dict(a=e4(2, 32), a_scale=sc(2, 1), b=e4(3, 32), b_scale=sc(3, 1))
    ids = [0, 1, 1, 3]
    sorted_ids, expert_ids, post = moe_align.reference(ids, 16, 4, None, True)
    moe_gemm = dict(a=e4(2, 32), a_scale=sc(2, 1), w=e4(4, 16, 32), w_scale=sc(4, 16, 1),
                    sorted_token_ids=I(sorted_ids), expert_ids=I(expert_ids), num_tokens_post_padded=I([post]),
                    topk_weights=torch.rand(2, 2, generator=g))
    layer = dict(x=e4(2, 64), x_scale=sc(2, 2), w1=e4(4, 64, 64), w1_scale=sc(4, 64, 2), w2=e4(4, 64, 32),
                 w2_scale=sc(4, 64, 1), topk_weights=torch.rand(2, 2, generator=g), topk_ids=I([ids[:2], ids[2:]]),
                 expert_map=I([0, 1, 2, 3]))
    empty = lambda *shape, dtype=torch.float32: empty_poisoned(shape, dtype)     # noqa: E731
    return {
        "fmha_fwd": (lambda **a: gfxasm.fmha_fwd(**a, return_lse=True), fmha),
        "fmha_fwd out": (lambda **a: gfxasm.fmha_fwd(**a, return_lse=True),
                         dict(fmha, out=empty(1, 2, 2, 128, dtype=bf))),
        "fmha_fwd_out lse": (lambda **a: torch.ops.gfxasm.fmha_fwd_out(**a, causal=False, softmax_scale=None,
                                                                     window_left=-1, window_right=-1, sinks=None,
                                                                     softcap=0.0),
                             dict(fmha, out=empty(1, 2, 2, 128, dtype=bf), lse=empty(1, 2, 2))),
        "batch_prefill sglang": (lambda **a: gfxasm.batch_prefill(**a, return_lse=True), dict(prefill, **sglang)),
        "batch_prefill vllm out": (lambda **a: gfxasm.batch_prefill(**a),
                                   dict(prefill, **vllm, out=empty(3, 2, 128, dtype=bf))),
        "batch_prefill fp8 descales": (lambda **a: gfxasm.batch_prefill(**a), dict(prefill_fp8, **descales)),
        "batch_prefill fp8 block scales": (lambda **a: gfxasm.batch_prefill(**a),
                                           dict(prefill_fp8, kv_block_descale=torch.rand(4, 1, 2, generator=g) + 0.5)),
        "batch_prefill_out lse": (lambda **a: torch.ops.gfxasm.batch_prefill_out(
            **a, block_table=None, seqlens_k=None, causal=False, softmax_scale=None, window_left=-1, window_right=-1,
            sinks=None, softcap=0.0, q_descale=None, k_descale=None,
            v_descale=None, kv_block_descale=None), dict(prefill, **sglang, out=empty(3, 2, 128, dtype=bf),
                                                         lse=empty(2, 3))),
        "decode_attention": (lambda **a: gfxasm.decode_attention(**a, return_lse=True),
                             dict(decode, sinks=torch.zeros(2))),
        "decode_attention contiguous out": (lambda **a: gfxasm.decode_attention(**a, return_lse=True), dict(
            decode, k_cache=fp_tensor((1, 32, 1, 64), bf, g), v_cache=fp_tensor((1, 32, 1, 64), bf, g),
            block_table=None, out=empty(1, 1, 2, 64, dtype=bf))),
        "decode_attention fp8 descales": (lambda **a: gfxasm.decode_attention(**a),
                                          dict(decode_fp8, k_descale=torch.tensor([0.5]),
                                               v_descale=torch.tensor([2.0]))),
        "decode_attention fp8 pairs": (lambda **a: gfxasm.decode_attention(**a), dict(decode_fp8, **pairs)),
        "mxfp8_gemm gemv": (lambda **a: gfxasm.mxfp8_gemm(**a, kernel="gemv"), gemm),
        "mxfp8_gemm mfma out": (lambda **a: gfxasm.mxfp8_gemm(**a, kernel="mfma"),
                                dict(gemm, out=empty(2, 3, dtype=bf))),
        "mxfp8_moe_gemm": (lambda **a: gfxasm.mxfp8_moe_gemm(**a, a_div=2), moe_gemm),
        "mxfp8_moe_gemm out": (lambda **a: gfxasm.mxfp8_moe_gemm(**a, a_div=2),
                               dict(moe_gemm, out=empty(4, 16, dtype=bf))),
        "mxfp8_moe decode form": (lambda **a: gfxasm.mxfp8_moe(**a), layer),
        "mxfp8_moe sorted form out": (lambda **a: gfxasm.mxfp8_moe(**a, block_m=16),
                                      dict(layer, out=empty(2, 64, dtype=bf))),
        "swiglu_mxfp8_quant out": (lambda x, q, scale: gfxasm.swiglu_mxfp8_quant(x, out=(q, scale)),
                                   dict(x=fp_tensor((2, 64), bf, g), q=empty(2, 32, dtype=E4M3),
                                        scale=empty(2, 1, dtype=torch.float8_e8m0fnu))),
        "moe_align_block_size": (lambda **a: gfxasm.moe_align_block_size(a["topk_ids"], 16, 4, a["expert_map"]),
                                 dict(topk_ids=I([ids[:2], ids[2:]]), expert_map=I([0, 1, 2, 3]))),
    }


DEVICE_CASES = device_cases()
DEVICE_COUNTS: Counter = Counter()


@pytest.mark.parametrize("case", sorted(DEVICE_CASES))
def test_one_tensor_on_another_device_is_refused(case, no_launch, capsys):
    """Each tensor of a valid call alone on "meta" with the rest on the CPU, and alone on the
    CPU with the rest on "meta": refused before launch (no_launch), naming that tensor (its
    name, or for the first tensor of the call the one it is compared with), never an
    uninitialised result. The call itself is valid: all on meta it passes every check."""
    fn, tensors = DEVICE_CASES[case]
    tensors = {n: t for n, t in tensors.items() if t is not None}
    counts, failures = Counter(), []
    fn(**{n: t.to("meta") for n, t in tensors.items()})         # valid: all on meta, a shape query, passes
    first = next(iter(tensors))
    for name in tensors:
        for moved, rest in (("meta", "cpu"), ("cpu", "meta")):
            args = {n: t.to(moved if n == name else rest) for n, t in tensors.items()}
            # the first tensor may be named as "q's device" by what it is compared with
            names = tuple(tensors) if name == first else (name,)
            try:
                result = call(counts, names, lambda: fn(**args))
            except AssertionError as error:     # a refusal naming no argument, or a launch
                failures.append(f"'{name}' on {moved}, the rest on {rest}: {str(error).splitlines()[0]}")
                continue
            if result is not None:
                failures.append(f"'{name}' on {moved}, the rest on {rest}: accepted")
    with capsys.disabled():
        print(f"\nfuzz values devices {case}: {counts['refused']} calls refused ({len(tensors)} tensors x 2)")
    assert not failures, f"{case}:\n" + "\n".join(failures)



# ------------------------------------------------------------------ threads

REPO = Path(__file__).resolve().parents[1]
THREAD_CASES = ("fmha_fwd", "batch_prefill sglang", "decode_attention", "mxfp8_gemm gemv", "mxfp8_gemm mfma out",
                "mxfp8_moe_gemm", "mxfp8_moe decode form", "swiglu_mxfp8_quant out", "moe_align_block_size")
THREADS = 3                         # per op, each with its own data (same layouts: the plan cache is shared)

# A fresh interpreter (nothing planned, cached or set up yet): every thread waits at one
# barrier, then makes its op's first call of the process; afterwards the same calls run
# serially on fresh copies of the same inputs. Both results go back through torch.save.
THREAD_CHILD = r"""
import sys, threading, torch
sys.path.insert(0, sys.argv[1])
from tests.test_fuzz_values import THREAD_CASES, THREADS, device_cases
def run(case, seed):
    fn, tensors = device_cases(seed)[case]
    result = fn(**{n: t for n, t in tensors.items() if t is not None})
    return [t.clone() for t in (result if isinstance(result, tuple) else (result,))]
calls = [(case, seed) for case in THREAD_CASES for seed in range(THREADS)]
barrier = threading.Barrier(len(calls))
threaded, errors = {}, []
def work(key):
    barrier.wait()
    try:
        threaded[key] = run(*key)
    except BaseException:
        import traceback
        errors.append(traceback.format_exc())
threads = [threading.Thread(target=work, args=(key,)) for key in calls]
for t in threads: t.start()
for t in threads: t.join()
if errors:
    sys.exit("".join(errors))
torch.save({"threaded": threaded, "serial": {key: run(*key) for key in calls}}, sys.argv[2])
"""


def test_threads_match_serial_calls(tmp_path, capsys):
    """THREADS threads per op, all ops at once, first calls of a fresh process: every output
    equals, bit for bit, the same call made serially afterwards."""
    env = {k: v for k, v in os.environ.items() if k != "GFXASM_BACKEND"}
    result = tmp_path / "outs.pt"
    proc = subprocess.run([sys.executable, "-c", THREAD_CHILD, str(REPO), str(result)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"threaded calls failed:\n{proc.stderr[-4000:]}"
    got = torch.load(result)
    for key, serial in got["serial"].items():
        threaded = got["threaded"][key]
        assert len(threaded) == len(serial), key
        for i, (a, b) in enumerate(zip(threaded, serial)):
            assert a.dtype == b.dtype and a.shape == b.shape, key
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f"{key} output {i}: threaded != serial"
    with capsys.disabled():
        print(f"\nfuzz values threads: {len(got['serial'])} calls ({len(THREAD_CASES)} ops x {THREADS} threads, "
              f"first calls of a fresh process) matched their serial results bit for bit")

# ------------------------------------------------------------------ what this fuzzing found, not fixed yet

@pytest.mark.xfail(strict=True, reason="found by fuzzing values (issue 26): the attention kernels sum P.V in f32 "
                   "with P unnormalised (up to 1 per key), so V near the bf16 maximum in several keys overflows to "
                   "inf where the answer, a weighted mean of V, is finite")
@pytest.mark.parametrize("op", ["fmha_fwd", "batch_prefill", "decode_attention"])
def test_attention_bf16_max_values_sum(op):
    """Five keys, every V element at the bf16 maximum: O = that maximum."""
    g = torch.Generator().manual_seed(1)
    I = lambda x: torch.tensor(x, dtype=torch.int32)        # noqa: E731
    mx = torch.finfo(torch.bfloat16).max
    q, k = fp_tensor((1, 1, 1, 128), torch.bfloat16, g, 0.25), fp_tensor((1, 5, 1, 128), torch.bfloat16, g)
    v = torch.full((1, 5, 1, 128), mx, dtype=torch.bfloat16)
    if op == "fmha_fwd":
        out = gfxasm.fmha_fwd(q, k, v)[0, 0]
    elif op == "batch_prefill":
        out = gfxasm.batch_prefill(q[0], k[0, :, None], v[0, :, None], I([0, 1]), block_table=I([[0, 1, 2, 3, 4]]),
                                   seqlens_k=I([5]))[0]
    else:
        out = gfxasm.decode_attention(q, k, v, I([5]))[0, 0]
    ieee_close("out", out, torch.full_like(out, mx), 0.0)


@pytest.mark.xfail(strict=True, reason="found by fuzzing values (issue 26): swiglu_mxfp8_quant computes the "
                   "activation in f32, so a finite bf16 gate or up whose activation passes f32's range gives NaN "
                   "codes (the docstring leaves only Inf/NaN inputs unspecified)")
def test_swiglu_activation_past_f32_range():
    """gate = -bf16 max, up = 4, alpha 0 (sigmoid 1/2), beta 1: y = -8.5e38, finite in float64:
    the OCP rule gives scale 248 and code -320 (test_fuzz_values' reference)."""
    from gfxasm.ops.swiglu_quant import activation_reference, quantize_reference
    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    x[0, 0], x[0, 32] = -torch.finfo(torch.bfloat16).max, 4.0
    q, s = gfxasm.swiglu_mxfp8_quant(x, alpha=0.0, beta=1.0, limit=7.0)
    q_ref, s_ref = quantize_reference(activation_reference(x, 0.0, 1.0, 7.0))
    assert torch.equal(s.view(torch.uint8), s_ref.view(torch.uint8))
    ieee_close("q", q.double(), q_ref.double(), 0.0)


def test_batch_prefill_inf_in_the_last_value():
    """One key (seqlen_k 2, not a multiple of 64) holds +inf in V column 5: O there is +inf."""
    g = torch.Generator().manual_seed(0)
    q, k = fp_tensor((1, 1, 128), torch.bfloat16, g), fp_tensor((2, 1, 1, 128), torch.bfloat16, g, 0.1)
    v = fp_tensor((2, 1, 1, 128), torch.bfloat16, g)
    v[1, 0, 0, 5] = INF
    table = dict(block_table=torch.tensor([[0, 1]], dtype=torch.int32), seqlens_k=torch.tensor([2], dtype=torch.int32))
    o = gfxasm.batch_prefill(q, k, v, torch.tensor([0, 1], dtype=torch.int32), **table)
    assert o[0, 0, 5].item() == INF
