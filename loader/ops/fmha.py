"""FMHA forward, head dim 128: `gfxasm.fmha_fwd` on the `fmha_fwd_d128` kernel family.

    out = gfxasm.fmha_fwd(q, k, v, causal=True)                   # [B, Sq, Hq, 128]
    out, lse = gfxasm.fmha_fwd(q, k, v, return_lse=True)           # lse [B, Hq, Sq] f32

Conventions are flash-attention's: q `[batch, seq_q, heads_q, 128]`, k and v
`[batch, seq_k, heads_k, 128]` with heads_q % heads_k == 0 (MHA, GQA, MQA), bf16 or fp16,
any strides as long as the head dim is contiguous (views into a packed qkv tensor work);
softmax_scale defaults to 1/sqrt(128); causal masks are aligned to the bottom-right corner
when seq_q != seq_k (query i sees key j iff j <= i + seq_k - seq_q). A query that sees no
key (causal, seq_q > seq_k) gets O = 0 and LSE = -inf. LSE is the natural-log
log-sum-exp of the scaled scores, float32, dense `[batch, heads_q, seq_q]`.

The kernel reads 16-byte rows through buffer descriptors, so every tensor's data pointer
and its batch/seq/head strides must be 16-byte aligned (multiples of 8 elements), rows of
one head must not overlap (seq stride >= 128 elements), and one head's rows must span
less than 2 GiB. `out` may not share memory with q, k or v, nor between its own elements
(a stride 0), except `out=q` exactly (same address, shape and strides): each wave reads
its 32 Q rows into registers once, before it writes the O rows of those same queries.
Empty problems (batch, seq_q or heads 0) return empty outputs; seq_k = 0 with queries
gives what a query without visible keys gets: O = 0, LSE = -inf. Everything is checked
here, before launching; a violation is a ValueError/TypeError naming the argument, what
was expected and what was given.

torch ops (declared on loader/ops/framework.py): gfxasm::fmha_fwd(q, k, v, causal,
softmax_scale, return_lse) -> (out, lse), lse empty unless return_lse;
gfxasm::fmha_fwd_out(q, k, v, out!, lse!?, causal, softmax_scale). Both have fake kernels
(meta tensors, torch.compile). The validated launch is cached per tensor layout (shapes,
strides, dtypes, devices) and scalars, so a repeated call only checks pointers and launches.

`reference` computes the float32 answer; `reference_lowp` the same attention evaluated
with PyTorch in the inputs' precision, which sets the error budget (flash-attention's
rule: the kernel's error may be at most twice the error of that implementation).
"""
from __future__ import annotations

import math

import torch

from ..launcher import prepare
from ..manifest import Variant, default_manifest
from . import arguments, framework

HEAD_DIM = 128
Q_TILE = 256                       # rows of Q per workgroup (the grid's x: cdiv(seq_q, 256))
KERNEL = "fmha_fwd_d128"
DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}
LOG2E = 1.4426950408889634
_ALIGN_ELEMENTS = 8                # 16 bytes of bf16/fp16
_U32 = 2**32
_MAX_SPAN = 2**31                  # voffset + inst offset must stay positive in 32 bits
_MAX_HEADS = 2**16                 # kv head = h * magic >> 32 is exact below this


def variant(dtype: torch.dtype, causal: bool) -> Variant:
    """The kernel variant for a call, chosen by the source's defines."""
    return default_manifest().kernel(KERNEL).variant_with(F16=dtype == torch.float16, FMHA_CAUSAL=causal)


# ------------------------------------------------------------------ validation

def _tensor(name: str, value, rank: int) -> torch.Tensor:
    return arguments.tensor("fmha_fwd", name, value, rank, f"[batch, seq, heads, {HEAD_DIM}]")


def _check_layout(name: str, t: torch.Tensor) -> None:
    """Head dim contiguous, 16-byte aligned rows, non-overlapping rows, 32-bit offsets."""
    if t.shape[3] != HEAD_DIM:
        raise ValueError(f"fmha_fwd: '{name}' head dim must be {HEAD_DIM}, got {t.shape[3]} (shape {tuple(t.shape)})")
    if t.numel() == 0:
        return
    if t.stride(3) != 1:
        raise ValueError(f"fmha_fwd: '{name}' must be contiguous in the head dim (stride 1), got strides {t.stride()}")
    element = t.element_size()
    for axis, what in ((0, "batch"), (1, "seq"), (2, "head")):
        stride = _stride(t, axis)
        if stride % _ALIGN_ELEMENTS:
            raise ValueError(f"fmha_fwd: '{name}' {what} stride must be a multiple of {_ALIGN_ELEMENTS} elements "
                             f"(16 bytes), got {stride} (strides {t.stride()})")
        if stride * element >= _U32:
            raise ValueError(f"fmha_fwd: '{name}' {what} stride must be below 2^32 bytes, got {stride * element}")
    if _stride(t, 1) < HEAD_DIM:
        raise ValueError(f"fmha_fwd: '{name}' seq stride must be >= {HEAD_DIM} elements (rows of one head may not "
                         f"overlap), got {t.stride(1)} (strides {t.stride()})")
    span = (t.shape[1] - 1) * _stride(t, 1) * element + HEAD_DIM * element
    if span >= _MAX_SPAN:
        raise ValueError(f"fmha_fwd: '{name}' one head's rows span {span} bytes; the kernel needs < 2^31 "
                         f"(seq {t.shape[1]}, seq stride {t.stride(1)})")


def _stride(t: torch.Tensor, axis: int) -> int:
    """The stride of a dim, taken as the natural one when the dim has size 1 (torch leaves
    such strides arbitrary, and the kernel never steps along them)."""
    if t.shape[axis] != 1:
        return t.stride(axis)
    return HEAD_DIM if axis == 1 else 0


def _validate(q, k, v, out, softmax_scale) -> float:
    q, k, v = _tensor("q", q, 4), _tensor("k", k, 4), _tensor("v", v, 4)
    if q.dtype not in DTYPES:
        raise TypeError(f"fmha_fwd: 'q' dtype must be torch.bfloat16 or torch.float16, got {q.dtype}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"fmha_fwd: '{name}' dtype must equal q's ({q.dtype}), got {t.dtype}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_layout(name, t)
    batch, seq_q, heads_q, _ = q.shape
    if k.shape != v.shape:
        raise ValueError(f"fmha_fwd: 'v' shape must equal k's {tuple(k.shape)}, got {tuple(v.shape)}")
    if k.shape[0] != batch:
        raise ValueError(f"fmha_fwd: 'k' batch must equal q's ({batch}), got {k.shape[0]}")
    seq_k, heads_k = k.shape[1], k.shape[2]
    if heads_k < 1 or heads_q % heads_k:
        raise ValueError(f"fmha_fwd: heads of q must be a multiple of heads of k/v (Hq % Hk == 0), "
                         f"got Hq={heads_q}, Hk={heads_k}")
    if heads_q >= _MAX_HEADS:
        raise ValueError(f"fmha_fwd: heads_q must be below {_MAX_HEADS}, got {heads_q}")
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"fmha_fwd: 'out' must be a torch.Tensor, got {type(out).__name__}")
        if out.shape != q.shape:
            raise ValueError(f"fmha_fwd: 'out' shape must equal q's {tuple(q.shape)}, got {tuple(out.shape)}")
        if out.dtype != q.dtype:
            raise TypeError(f"fmha_fwd: 'out' dtype must equal q's ({q.dtype}), got {out.dtype}")
        _check_layout("out", out)
    if softmax_scale is None:
        return 1.0 / math.sqrt(HEAD_DIM)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"fmha_fwd: 'softmax_scale' must be a float, got {type(softmax_scale).__name__}")
    if not math.isfinite(softmax_scale):
        raise ValueError(f"fmha_fwd: 'softmax_scale' must be finite, got {softmax_scale}")
    return float(softmax_scale)


def _check_lse(lse, q: torch.Tensor) -> None:
    """The out= op's lse: f32, contiguous [batch, heads_q, seq_q]."""
    batch, seq_q, heads_q, _ = q.shape
    if not isinstance(lse, torch.Tensor):
        raise TypeError(f"fmha_fwd: 'lse' must be a torch.Tensor or None, got {type(lse).__name__}")
    if lse.dtype != torch.float32 or tuple(lse.shape) != (batch, heads_q, seq_q) or not lse.is_contiguous():
        raise ValueError(f"fmha_fwd: 'lse' must be a contiguous float32 [batch, heads_q, seq_q] = "
                         f"[{batch}, {heads_q}, {seq_q}], got {lse.dtype} shape {tuple(lse.shape)} "
                         f"strides {lse.stride()}")


def _check(call) -> float:
    """Everything the tensors' metadata can tell; returns the softmax scale."""
    scale = _validate(call.q, call.k, call.v, call.out, call.softmax_scale)
    if not isinstance(call.causal, bool):
        raise TypeError(f"fmha_fwd: 'causal' must be a bool, got {type(call.causal).__name__}")
    if call.lse is not None:
        _check_lse(call.lse, call.q)
    return scale


# ------------------------------------------------------------------ kernel arguments

def kernel_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor | None,
                scale: float) -> dict:
    """The manifest arguments of fmha_fwd_d128 (byte strides, kv head divisor, log2 scale).
    Without lse the kernel never touches it: an empty placeholder stands in (a null
    pointer at launch)."""
    e = q.element_size()
    ratio = q.shape[2] // k.shape[2]
    args = dict(q=q, k=k, v=v, o=o, seq_q=q.shape[1], seq_k=k.shape[1],
                kv_head_magic=0 if ratio == 1 else -(-_U32 // ratio),
                scale_log2=scale * LOG2E, store_lse=int(lse is not None))
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o)):
        args[f"{name}_seq_stride"] = _stride(t, 1) * e
        args[f"{name}_head_stride"] = _stride(t, 2) * e
        args[f"{name}_batch_stride"] = _stride(t, 0) * e
    if lse is None:
        lse = torch.empty((0, 0, 0), dtype=torch.float32, device=q.device)
        args.update(lse_head_stride=0, lse_batch_stride=0)
    else:
        args.update(lse_head_stride=lse.stride(1) * 4, lse_batch_stride=lse.stride(0) * 4)
    args["lse"] = lse
    return args


# ------------------------------------------------------------------ the op

def new_outputs(q: torch.Tensor, names: frozenset) -> dict:
    """Fresh attention outputs of a [batch, seq_q, heads_q, D] query, those of `names`: out
    like q, lse float32 [batch, heads_q, seq_q] (decode_attention's are the same)."""
    outs = {}
    if "out" in names:
        outs["out"] = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if "lse" in names:
        outs["lse"] = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
    return outs


def _allocate(call, names: frozenset) -> dict:
    return new_outputs(call.tensor("q", 4, f"[batch, seq, heads, {HEAD_DIM}]"), names)


def _plan(scale: float, call) -> framework.Plan:
    q, k, out, lse = call.q, call.k, call.out, call.lse
    if not q.numel():
        return framework.Plan()
    if k.shape[1] == 0:                       # no keys: what a query without visible keys gets
        def no_keys(c) -> None:
            c.out.zero_()
            if c.lse is not None:
                c.lse.fill_(float("-inf"))
        return framework.Plan(empty=no_keys)
    args = kernel_args(q, k, call.v, out, lse, scale)
    placeholder = args["lse"]                 # the kernel never touches lse without store_lse

    def bind(c) -> dict:
        return dict(q=c.q, k=c.k, v=c.v, o=c.out, lse=placeholder if c.lse is None else c.lse)
    return framework.Plan((prepare(variant(q.dtype, call.causal), args),), bind=bind)


_ALIGNED = dict(align=16)
FMHA_FWD = framework.define(framework.Spec(
    "fmha_fwd",
    params=(framework.Param("q", "Tensor", **_ALIGNED), framework.Param("k", "Tensor", **_ALIGNED),
            framework.Param("v", "Tensor", **_ALIGNED), framework.Param("causal", "bool"),
            framework.Param("softmax_scale", "float?")),
    outputs=(framework.Output("out", may_alias="q", **_ALIGNED), framework.Output("lse", optional=True)),
    check=_check, allocate=_allocate, plan=_plan, out_after="v"))


def fmha_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
             softmax_scale: float | None = None, out: torch.Tensor | None = None, return_lse: bool = False):
    """Attention forward (flash-attention conventions); returns out, or (out, lse) with
    return_lse. See the module docstring for the layout rules; runs torch.ops.gfxasm.fmha_fwd
    (or fmha_fwd_out when `out` is given)."""
    return FMHA_FWD(q, k, v, causal, softmax_scale, out=out, return_lse=return_lse)


# ------------------------------------------------------------------ references

def _visible(seq_q: int, seq_k: int, causal: bool, device) -> torch.Tensor | None:
    if not causal:
        return None
    i = torch.arange(seq_q, device=device)[:, None]
    j = torch.arange(seq_k, device=device)[None, :]
    return j <= i + (seq_k - seq_q)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              softmax_scale: float | None = None, dtype: torch.dtype = torch.float32
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, LSE) in `dtype` (float32, or float64 for inputs at the edges of f32) from the same
    inputs: O [B, Sq, Hq, 128], LSE [B, Hq, Sq]. Rows that see no key (causal, seq_q >
    seq_k; or seq_k = 0): O = 0, LSE = -inf. Elsewhere IEEE arithmetic stands, as in the
    kernel: a row whose visible scores are all -inf (+-inf in q or k) gets O = NaN (0 / 0)
    and LSE -inf; a +inf or NaN score makes O NaN (LSE +inf or NaN). Computed one batch
    entry at a time."""
    scale = 1.0 / math.sqrt(HEAD_DIM) if softmax_scale is None else softmax_scale
    ratio = q.shape[2] // k.shape[2]
    visible = _visible(q.shape[1], k.shape[1], causal, q.device)
    outs, lses = [], []
    for b in range(q.shape[0]):
        qb = q[b].to(dtype).transpose(0, 1)                                # [H, Sq, D]
        kb = k[b].to(dtype).repeat_interleave(ratio, 1).transpose(0, 1)
        vb = v[b].to(dtype).repeat_interleave(ratio, 1).transpose(0, 1)
        s = torch.matmul(qb, kb.transpose(1, 2)) * scale                   # [H, Sq, Sk]
        if visible is not None:
            s = s.masked_fill(~visible, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        p = torch.softmax(s, dim=-1)                # (exp(s - max) / sum: exact 1 for the best key at any |s|)
        if visible is not None:                                            # rows that see no key -> 0
            p = p.masked_fill(~visible.any(-1)[:, None], 0.0)
        outs.append(torch.matmul(p, vb).transpose(0, 1))
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def reference_lowp(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                   softmax_scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, LSE) computed by PyTorch in the inputs' precision (flash-attention's
    `attention_ref` with upcast=False, reorder_ops=True): scores from q and pre-scaled k
    rounded to the input dtype, softmax output and P.V rounded to it; LSE from those
    rounded scores. Its error against `reference` sets the tolerance."""
    scale = 1.0 / math.sqrt(HEAD_DIM) if softmax_scale is None else softmax_scale
    ratio = q.shape[2] // k.shape[2]
    visible = _visible(q.shape[1], k.shape[1], causal, q.device)
    outs, lses = [], []
    for b in range(q.shape[0]):
        qb = q[b].transpose(0, 1)
        kb = (k[b] * scale).repeat_interleave(ratio, 1).transpose(0, 1)
        vb = v[b].repeat_interleave(ratio, 1).transpose(0, 1)
        s = torch.matmul(qb, kb.transpose(1, 2)).float()
        if visible is not None:
            s = s.masked_fill(~visible, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0).to(q.dtype)
        outs.append(torch.matmul(p, vb).transpose(0, 1))
        lses.append(torch.logsumexp(s, dim=-1))
    return torch.stack(outs), torch.stack(lses)


def max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest |actual - expected|; equal infinities (LSE of a row with no key) count as 0,
    NaN anywhere as inf."""
    a, e = actual.double(), expected.double()
    if not a.numel():
        return 0.0
    same_inf = torch.isinf(a) & torch.isinf(e) & (a == e)
    diff = torch.where(same_inf, torch.zeros_like(a), (a - e).abs())
    return diff.nan_to_num(nan=float("inf")).max().item()


def tolerances(q, k, v, o_ref: torch.Tensor, lse_ref: torch.Tensor, *, causal: bool,
               softmax_scale: float | None = None) -> tuple[float, float]:
    """(O, LSE) bounds on the largest absolute error: 2 x the error of `reference_lowp`
    against the float32 reference (flash-attention's rule), plus a floor.
    O's floor: 4 ulp at 1.0 of the dtype (one rounding of O itself must always pass).
    LSE's floor: the dtype's unit roundoff times max(1, max |LSE|). The kernel scores Q
    pre-scaled by scale*log2(e) and rounded back to the dtype (the seed's design), so every
    score of a row moves by up to that relative rounding together; PyTorch's low-precision
    scores round independently and their errors average out in the log-sum-exp, so 2 x its
    error alone can be smaller than one rounding of a correlated shift."""
    o_low, lse_low = reference_lowp(q, k, v, causal=causal, softmax_scale=softmax_scale)
    o_err = max_error(o_low.float(), o_ref)
    lse_err = max_error(lse_low, lse_ref)
    finite = lse_ref[torch.isfinite(lse_ref)]
    magnitude = max(1.0, finite.abs().max().item()) if finite.numel() else 1.0
    unit_roundoff = torch.finfo(q.dtype).eps / 2
    return 2 * o_err + 4 * torch.finfo(q.dtype).eps, 2 * lse_err + unit_roundoff * magnitude


# ------------------------------------------------------------------ `gfxasm run fmha_fwd_d128`

def _register_run_case() -> None:
    from ..runcases import RunCase, run_case

    @run_case(KERNEL)
    def fmha_case(variant, gen: torch.Generator, batch: int = 1, seq_q: int = 300, seq_k: int = 300,
                  heads_q: int = 4, heads_k: int = 2) -> RunCase:
        dtype = torch.float16 if variant.defines["F16"] else torch.bfloat16
        causal = bool(variant.defines["FMHA_CAUSAL"])
        q = torch.randn(batch, seq_q, heads_q, HEAD_DIM, generator=gen).to(dtype)
        k = torch.randn(batch, seq_k, heads_k, HEAD_DIM, generator=gen).to(dtype)
        v = torch.randn(batch, seq_k, heads_k, HEAD_DIM, generator=gen).to(dtype)
        o = torch.full(q.shape, float("nan"), dtype=dtype)
        lse = torch.full((batch, heads_q, seq_q), float("nan"))
        o_ref, lse_ref = reference(q, k, v, causal=causal)
        o_tol, lse_tol = tolerances(q, k, v, o_ref, lse_ref, causal=causal)
        args = kernel_args(q, k, v, o, lse, 1.0 / math.sqrt(HEAD_DIM))
        # RunCase has one atol for both outputs: the larger budget (tests check each apart).
        return RunCase(args=args, expected={"o": o_ref, "lse": lse_ref}, atol=max(o_tol, lse_tol), rtol=0.0,
                       note=f"B={batch} Sq={seq_q} Sk={seq_k} Hq={heads_q} Hk={heads_k}")


_register_run_case()
