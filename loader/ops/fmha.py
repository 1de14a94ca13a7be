"""FMHA forward, head dim 64 or 128: `gfxasm.fmha_fwd` on the `fmha_fwd_d128` kernel family
(`fmha_fwd_d64`: the same source with HEAD_DIM = 64).

    out = gfxasm.fmha_fwd(q, k, v, causal=True)                   # [B, Sq, Hq, D]
    out, lse = gfxasm.fmha_fwd(q, k, v, return_lse=True)           # lse [B, Hq, Sq] f32

Conventions are flash-attention's: q `[batch, seq_q, heads_q, D]`, k and v
`[batch, seq_k, heads_k, D]`, D = 64 or 128 (256 is refused: no kernel fits its registers),
with heads_q % heads_k == 0 (MHA, GQA, MQA), bf16 or fp16,
any strides as long as the head dim is contiguous (views into a packed qkv tensor work);
softmax_scale defaults to 1/sqrt(D); causal masks are aligned to the bottom-right corner
when seq_q != seq_k (query i sees key j iff j <= i + seq_k - seq_q). A query that sees no
key (causal, seq_q > seq_k) gets O = 0 and LSE = -inf. LSE is the natural-log
log-sum-exp of the scaled scores, float32, dense `[batch, heads_q, seq_q]`.

Features (issue 22; flash-attention's names and semantics):
- window_size=(left, right): query i, at key position pos = i + seq_k - seq_q, sees key j
  iff pos - left <= j <= pos + right; -1 leaves that side unbounded; causal=True means
  right = 0 (causal with right > 0 is an error). KV tiles outside every row's window are
  skipped (the `_window` variants, asm/include/fmha_window.inc); a row whose window holds
  no key gets O = 0, LSE = -inf.
- sinks: float32 [heads_q], finite (checked on CPU tensors): each row's softmax
  denominator gains exp(sink - m); the numerator is unchanged and LSE includes it (a row
  that sees no key gets O = 0, LSE = its sink). In every variant (the epilogue).
- softcap > 0: scores become softcap * tanh(softmax_scale * q.k / softcap) before masking
  (the `_softcap` variants; tanh from v_exp_f32 and v_rcp_f32, within 2^-21 softcap log2(e)
  of the exact capped score in log2 units: asm/include/fmha_softcap.inc).

The kernel reads 16-byte rows through buffer descriptors, so every tensor's data pointer
and its batch/seq/head strides must be 16-byte aligned (multiples of 8 elements), rows of
one head must not overlap (seq stride >= D elements), and one head's rows must span
less than 2 GiB. `out` may not share memory with q, k or v, nor between its own elements
(a stride 0), except `out=q` exactly (same address, shape and strides): each wave reads
its 32 Q rows into registers once, before it writes the O rows of those same queries.
Empty problems (batch, seq_q or heads 0) return empty outputs; seq_k = 0 with queries
gives what a query without visible keys gets: O = 0, LSE = -inf. Everything is checked
here, before launching; a violation is a ValueError/TypeError naming the argument, what
was expected and what was given.

torch ops (declared on loader/ops/framework.py): gfxasm::fmha_fwd(q, k, v, causal,
softmax_scale, window_left, window_right, sinks, softcap) -> out; gfxasm::fmha_fwd_with_lse
(the same) -> (out, lse); gfxasm::fmha_fwd_out(q, k, v, out!, lse!?, causal, softmax_scale,
window_left, window_right, sinks, softcap). (The window travels as two ints: a list
argument would make every call's plan-cache key unhashable.) Both have fake kernels
(meta tensors, torch.compile). The validated launch is cached per tensor layout (shapes,
strides, dtypes, devices) and scalars, so a repeated call only checks pointers and launches.

`reference` computes the float32 answer; `reference_lowp` the same attention evaluated
with PyTorch in the inputs' precision, which sets the error budget (flash-attention's
rule: the kernel's error may be at most twice the error of that implementation).
"""
from __future__ import annotations

import math

import torch

from ..gridexpr import magic_u32
from ..launcher import prepare
from ..manifest import Variant, default_manifest
from . import arguments, framework

HEAD_DIM = 128                     # KERNEL's head dim (the default of the tests and benches)
Q_TILE = 256                       # rows of Q per workgroup (the grid's x: cdiv(seq_q, 256))
KERNEL = "fmha_fwd_d128"
# The kernel of each supported head dim: one source, HEAD_DIM defined per kernel in kernels.yaml.
# Head dim 256 is not built: its Q (64 VGPRs) and O^T (128) beside the 160 the rest of the
# pipeline needs make 352 per wave, over the 256 (AGPRs included) of two waves per SIMD, which
# the 8-wave two-group schedule needs (docs/fmha_fwd_d128.md).
KERNELS = {64: "fmha_fwd_d64", HEAD_DIM: KERNEL}
DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}
LOG2E = 1.4426950408889634
_ALIGN_ELEMENTS = 8                # 16 bytes of bf16/fp16
_U32 = 2**32
_MAX_SPAN = 2**31                  # voffset + inst offset must stay positive in 32 bits
_MAX_HEADS = 2**16                 # kv head = h * magic >> 32 is exact below this
WINDOW_NONE = 2**30                # an unbounded window side (the kernel's sums stay below 2^31)


def variant(dtype: torch.dtype, causal: bool, window: bool = False, softcap: bool = False,
            head_dim: int = HEAD_DIM) -> Variant:
    """The kernel variant for a call, chosen by the source's defines (the kernel by head dim)."""
    return default_manifest().kernel(KERNELS[head_dim]).variant_with(F16=dtype == torch.float16, FMHA_CAUSAL=causal,
                                                           WINDOW=window, SOFTCAP=softcap)


# ------------------------------------------------------------------ validation

def _tensor(name: str, value, rank: int) -> torch.Tensor:
    return arguments.tensor("fmha_fwd", name, value, rank, "[batch, seq, heads, head_dim]")


def _check_head_dim(q: torch.Tensor) -> int:
    """q's head dim, one a kernel is built for."""
    if q.shape[3] not in tuple(KERNELS):          # (a tuple: a traced SymInt compares, it does not hash)
        supported = " or ".join(map(str, sorted(KERNELS)))
        raise ValueError(f"fmha_fwd: 'q' head dim must be {supported}, got {q.shape[3]} (shape {tuple(q.shape)})")
    return q.shape[3]


def _check_layout(name: str, t: torch.Tensor, head_dim: int) -> None:
    """Head dim q's, contiguous, 16-byte aligned rows, non-overlapping rows, 32-bit offsets."""
    if t.shape[3] != head_dim:
        raise ValueError(f"fmha_fwd: '{name}' head dim must equal q's ({head_dim}), got {t.shape[3]} "
                         f"(shape {tuple(t.shape)})")
    if t.numel() == 0:
        return
    if t.stride(3) != 1:
        raise ValueError(f"fmha_fwd: '{name}' must be contiguous in the head dim (stride 1), got strides {t.stride()}")
    element = t.element_size()
    for axis, what in _DIMS:
        stride = kernel_stride(t, axis, what)
        if stride % _ALIGN_ELEMENTS:
            raise ValueError(f"fmha_fwd: '{name}' {what} stride must be a multiple of {_ALIGN_ELEMENTS} elements "
                             f"(16 bytes), got {stride} (strides {t.stride()})")
        if stride * element >= _U32:
            raise ValueError(f"fmha_fwd: '{name}' {what} stride must be below 2^32 bytes, got {stride * element}")
    row_stride = kernel_stride(t, 1, "seq")
    if row_stride < head_dim:
        raise ValueError(f"fmha_fwd: '{name}' seq stride must be >= {head_dim} elements (rows of one head may not "
                         f"overlap), got {t.stride(1)} (strides {t.stride()})")
    span = (t.shape[1] - 1) * row_stride * element + head_dim * element
    if span >= _MAX_SPAN:
        raise ValueError(f"fmha_fwd: '{name}' one head's rows span {span} bytes; the kernel needs < 2^31 "
                         f"(seq {t.shape[1]}, seq stride {t.stride(1)})")


_DIMS = ((0, "batch"), (1, "seq"), (2, "head"))     # q, k, v and out: [batch, seq, heads, D]


def kernel_stride(t: torch.Tensor, axis: int, what: str) -> int:
    """The stride (elements) the attention kernels take for dim `axis` of `t`, a "batch",
    "seq" or "head" dim: torch's, but for a dim of size 1, whose torch stride is arbitrary
    (a view's, an expand's, 0) and which the kernel never steps along: one row (head dim
    elements) for a seq dim, so the buffer range (seq - 1) x stride + one row ends at that
    row and the rows past seq_q, which that range drops, lie past it (offsets below 2^32 for
    every row of a tile), and 0 for a batch or head dim."""
    if t.shape[axis] != 1:
        return t.stride(axis)
    return t.shape[-1] if what == "seq" else 0


def _validate(q, k, v, out, softmax_scale) -> float:
    q, k, v = _tensor("q", q, 4), _tensor("k", k, 4), _tensor("v", v, 4)
    if q.dtype not in DTYPES:
        raise TypeError(f"fmha_fwd: 'q' dtype must be torch.bfloat16 or torch.float16, got {q.dtype}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"fmha_fwd: '{name}' dtype must equal q's ({q.dtype}), got {t.dtype}")
    head_dim = _check_head_dim(q)
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_layout(name, t, head_dim)
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
        _check_layout("out", out, head_dim)
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
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


def check_sinks(call, heads_q: int) -> None:
    """sinks (None, or one finite float32 logit per query head, contiguous [heads_q]); its
    values (`sink_values`) are read where the call's tensors are readable CPU tensors."""
    sinks = call.sinks
    if sinks is None:
        return
    t = call.tensor("sinks", 1, "[heads_q] float32")
    if t.dtype != torch.float32:
        call.fail(TypeError, f"'sinks' dtype must be torch.float32, got {t.dtype}")
    if t.shape[0] != heads_q:
        call.fail(ValueError, f"'sinks' must be [heads_q] = [{heads_q}], got {tuple(t.shape)}")
    if not t.is_contiguous():
        call.fail(ValueError, f"'sinks' must be contiguous, got strides {t.stride()}")
    sink_values(call)


def readable(call) -> bool:
    """Whether an attention call's tensor contents may be read on the host: a real call (not
    a fake) on CPU tensors (the framework holds a call's tensors to one device; on a GPU a
    read would synchronise). The attention ops' data checks run only where this holds."""
    return call.data and call.q.device.type == "cpu"


def sink_values(call) -> None:
    """The sinks finite, where they are given and readable and their metadata passed
    `check_sinks`: what a repeated call still checks."""
    t = call.sinks
    if t is not None and readable(call):
        bad = (~torch.isfinite(t)).nonzero()
        if len(bad):
            head = int(bad[0, 0])
            call.fail(ValueError, f"'sinks' must be finite, got {float(t[head])} for query head {head}")


def window_pair(op: str, value) -> tuple[int, int]:
    """The Python API's window_size: a pair of ints, each -1 (unbounded) or >= 0 (checked
    again by the op as window_left, window_right)."""
    if type(value) is tuple and len(value) == 2 and type(value[0]) is int and type(value[1]) is int:
        return value                # (the usual call, answered without the general test below: every call pays it)
    if not isinstance(value, (tuple, list)) or len(value) != 2 or \
            any(isinstance(x, bool) or not isinstance(x, int) for x in value):
        arguments.fail(op, TypeError, f"'window_size' must be a pair of ints (left, right), got {value!r}")
    return int(value[0]), int(value[1])


def check_window(call) -> tuple[int, int]:
    """(left, right) of the sliding window, -1 unbounded, after causal (right = 0): flash-
    attention's rule, causal with right > 0 is an error."""
    left, right = call.window_left, call.window_right
    for x in (left, right):
        if isinstance(x, bool) or not isinstance(x, int):
            call.fail(TypeError, f"'window_size' must be a pair of ints, got ({left!r}, {right!r})")
        if x < -1:
            call.fail(ValueError, f"'window_size' entries must be -1 (unbounded) or >= 0, got ({left}, {right})")
    if call.causal:
        if right > 0:
            call.fail(ValueError, f"causal=True means window_size right = 0; got window_size ({left}, {right}) "
                                  f"(pass causal=False with a right window instead)")
        right = 0
    return left, right


def windowed(causal: bool, window: tuple[int, int]) -> bool:
    """Whether a call needs the WINDOW variant: a bound other than plain causal's."""
    return window != ((-1, 0) if causal else (-1, -1))


def window_args(window: tuple[int, int]) -> dict:
    """The kernels' window_left, window_right: -1 (and anything past any sequence) as 2^30."""
    return {name: WINDOW_NONE if x < 0 else min(x, WINDOW_NONE) for name, x in zip(("window_left", "window_right"),
                                                                                  window)}


def check_softcap(call) -> float:
    """softcap: a float >= 0 (0: none)."""
    value = call.softcap
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        call.fail(TypeError, f"'softcap' must be a float, got {type(value).__name__}")
    if not (math.isfinite(value) and value >= 0):
        call.fail(ValueError, f"'softcap' must be finite and >= 0 (0: no soft-capping), got {value}")
    return float(value)


def score_args(scale: float, softcap: float) -> dict:
    """scale_log2 and softcap_log2: with softcap > 0 the kernels pre-scale Q by
    2 softmax_scale log2(e) / softcap, so that GEMM0 gives the exponent of e^(2x / softcap)
    in tanh (asm/include/fmha_softcap.inc)."""
    if not softcap:
        return dict(scale_log2=scale * LOG2E, softcap_log2=0.0)
    return dict(scale_log2=2 * scale * LOG2E / softcap, softcap_log2=softcap * LOG2E)


def _check(call) -> tuple[float, tuple[int, int], float]:
    """Everything the tensors' metadata can tell (and the sinks' values on the CPU); returns
    the softmax scale, the window (after causal) and softcap."""
    scale = _validate(call.q, call.k, call.v, call.out, call.softmax_scale)
    if not isinstance(call.causal, bool):
        raise TypeError(f"fmha_fwd: 'causal' must be a bool, got {type(call.causal).__name__}")
    window = check_window(call)
    softcap = check_softcap(call)
    check_sinks(call, call.q.shape[2])
    if call.lse is not None:
        _check_lse(call.lse, call.q)
    return scale, window, softcap


# ------------------------------------------------------------------ kernel arguments

def sinks_args(sinks: torch.Tensor | None, device) -> dict:
    """The kernels' sinks arguments: the tensor and has_sinks = 1, or an empty placeholder the
    kernel never reads (a null pointer at launch) and 0."""
    if sinks is None:
        return dict(sinks=torch.empty(0, dtype=torch.float32, device=device), has_sinks=0)
    return dict(sinks=sinks, has_sinks=1)


def kernel_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor | None,
                scale: float, sinks: torch.Tensor | None = None, window: tuple[int, int] = (-1, -1),
                softcap: float = 0.0) -> dict:
    """The manifest arguments of fmha_fwd_d128 (kv head divisor, log2 scale, the byte
    strides of size-1 dims: the launcher fills the others). Without lse (or sinks) the
    kernel never touches it: an empty placeholder stands in (a null pointer at launch)."""
    ratio = q.shape[2] // k.shape[2]
    args = dict(q=q, k=k, v=v, o=o, seq_q=q.shape[1], seq_k=k.shape[1],
                kv_head_magic=magic_u32(ratio), store_lse=int(lse is not None),
                **score_args(scale, softcap), **sinks_args(sinks, q.device), **window_args(window))
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o)):
        args.update(unstepped_strides(name, t, _DIMS))
    args["lse"] = torch.empty((0, 0, 0), dtype=torch.float32, device=q.device) if lse is None else lse
    return args


def unstepped_strides(name: str, t: torch.Tensor, dims: tuple[tuple[int, str], ...]) -> dict:
    """The byte strides of `t`'s size-1 dims among `dims` ((axis, "batch" | "seq" | "head")),
    by `kernel_stride`'s convention. The launcher fills every other byte stride from the
    tensor (kernels.yaml `strides:`); its own size-1 value, the bytes of the slice after the
    dim, can pass 2^32 for a large batch of one."""
    e = t.element_size()
    return {f"{name}_{what}_stride": kernel_stride(t, axis, what) * e for axis, what in dims if t.shape[axis] == 1}


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
    return new_outputs(call.tensor("q", 4, "[batch, seq, heads, head_dim]"), names)


def _plan(checked: tuple[float, tuple[int, int], float], call) -> framework.Plan:
    scale, window, softcap = checked
    q, k, out, lse = call.q, call.k, call.out, call.lse
    if not q.numel():
        return framework.Plan()
    if k.shape[1] == 0:                       # no keys: what a query without visible keys gets
        def no_keys(c) -> None:
            c.out.zero_()
            if c.lse is not None:
                no_key_lse(c.lse, c.sinks, 1)
        return framework.Plan(empty=no_keys)
    args = kernel_args(q, k, call.v, out, lse, scale, call.sinks, window, softcap)
    placeholders = {name: args[name] for name in ("lse", "sinks")}   # never touched without store_lse, has_sinks
    recheck = sink_values if call.sinks is not None and readable(call) else None
    launch = prepare(variant(q.dtype, call.causal, windowed(call.causal, window), softcap > 0, q.shape[3]), args)
    return framework.Plan((launch,), fixed=placeholders, rename={"o": "out"}, recheck=recheck)


def no_key_lse(lse: torch.Tensor, sinks: torch.Tensor | None, head_dim: int) -> None:
    """The LSE of rows that see no key: -inf, or the head's sink (its weight alone);
    `head_dim` is lse's heads axis."""
    if sinks is None:
        lse.fill_(float("-inf"))
    else:
        shape = [1] * lse.dim()
        shape[head_dim] = -1
        lse.copy_(sinks.reshape(shape).expand(lse.shape))


# The attention features' parameters (batch_prefill declares the same): the window as two ints
# (a list would make every call's plan-cache key unhashable), the Python API's window_size.
WINDOW_SINKS_SOFTCAP = (framework.Param("window_left", "int"), framework.Param("window_right", "int"),
                        framework.Param("sinks", "Tensor?", align=4), framework.Param("softcap", "float"))
_ALIGNED = dict(align=16)
FMHA_FWD = framework.define(framework.Spec(
    "fmha_fwd",
    params=(framework.Param("q", "Tensor", **_ALIGNED), framework.Param("k", "Tensor", **_ALIGNED),
            framework.Param("v", "Tensor", **_ALIGNED), framework.Param("causal", "bool"),
            framework.Param("softmax_scale", "float?"), *WINDOW_SINKS_SOFTCAP),
    outputs=(framework.Output("out", may_alias="q", **_ALIGNED), framework.Output("lse", optional=True)),
    check=_check, allocate=_allocate, plan=_plan, out_after="v"))


def fmha_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
             softmax_scale: float | None = None, window_size: tuple[int, int] = (-1, -1),
             sinks: torch.Tensor | None = None, softcap: float = 0.0, out: torch.Tensor | None = None,
             return_lse: bool = False):
    """Attention forward (flash-attention conventions); returns out, or (out, lse) with
    return_lse. See the module docstring for the layout rules; runs torch.ops.gfxasm.fmha_fwd
    (fmha_fwd_with_lse with return_lse, fmha_fwd_out when `out` is given)."""
    return FMHA_FWD(q, k, v, causal, softmax_scale, *window_pair("fmha_fwd", window_size), sinks, softcap,
                    out=out, return_lse=return_lse)


# ------------------------------------------------------------------ references

def visible_keys(seq_q: int, seq_k: int, causal: bool, window: tuple[int, int] = (-1, -1),
                 device=None) -> torch.Tensor | None:
    """[seq_q, seq_k] bool, query i (at key position pos = i + seq_k - seq_q) sees key j iff
    pos - left <= j <= pos + right (-1: unbounded; causal: right = 0); None when it sees all."""
    left, right = window
    if causal:
        right = 0
    if left < 0 and right < 0:
        return None
    pos = torch.arange(seq_q, device=device)[:, None] + (seq_k - seq_q)
    j = torch.arange(seq_k, device=device)[None, :]
    visible = torch.ones(seq_q, seq_k, dtype=torch.bool, device=device)
    if right >= 0:
        visible &= j <= pos + right
    if left >= 0:
        visible &= j >= pos - left
    return visible


def capped(s: torch.Tensor, softcap: float) -> torch.Tensor:
    """Scores soft-capped: softcap tanh(s / softcap) (softcap 0: as they are)."""
    return softcap * torch.tanh(s / softcap) if softcap else s


def with_sinks(s: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """Scores [H, Sq, Sk] with each head's sink logit appended as one more key (it joins the
    softmax's denominator; callers drop its column of P)."""
    if sinks is None:
        return s
    return torch.cat([s, sinks.to(s.dtype)[:, None, None].expand(s.shape[0], s.shape[1], 1)], dim=-1)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              softmax_scale: float | None = None, window: tuple[int, int] = (-1, -1), sinks: torch.Tensor | None = None,
              softcap: float = 0.0, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, LSE) in `dtype` (float32, or float64 for inputs at the edges of f32) from the same
    inputs: O [B, Sq, Hq, 128], LSE [B, Hq, Sq]. Rows that see no key (causal, seq_q >
    seq_k; or seq_k = 0): O = 0, LSE = -inf (with sinks: the sink). Elsewhere IEEE arithmetic
    stands, as in the kernel: a row whose visible scores are all -inf (+-inf in q or k) gets
    O = NaN (0 / 0) and LSE -inf (with sinks: O = 0, LSE the sink); a +inf or NaN score makes
    O NaN (LSE +inf or NaN). Computed one batch entry at a time."""
    scale = 1.0 / math.sqrt(q.shape[3]) if softmax_scale is None else softmax_scale
    ratio = q.shape[2] // k.shape[2]
    visible = visible_keys(q.shape[1], k.shape[1], causal, window, q.device)
    outs, lses = [], []
    for b in range(q.shape[0]):
        qb = q[b].to(dtype).transpose(0, 1)                                # [H, Sq, D]
        kb = k[b].to(dtype).repeat_interleave(ratio, 1).transpose(0, 1)
        vb = v[b].to(dtype).repeat_interleave(ratio, 1).transpose(0, 1)
        s = capped(torch.matmul(qb, kb.transpose(1, 2)) * scale, softcap)  # [H, Sq, Sk]
        if visible is not None:
            s = s.masked_fill(~visible, float("-inf"))
        s = with_sinks(s, sinks)
        lse = torch.logsumexp(s, dim=-1)
        p = torch.softmax(s, dim=-1)[..., :k.shape[1]]   # (exp(s - max) / sum: exact 1 for the best key at any |s|)
        if visible is not None and sinks is None:                         # rows that see no key -> 0
            p = p.masked_fill(~visible.any(-1)[:, None], 0.0)
        outs.append(torch.matmul(p, vb).transpose(0, 1))
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def reference_lowp(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                   softmax_scale: float | None = None, window: tuple[int, int] = (-1, -1),
                   sinks: torch.Tensor | None = None, softcap: float = 0.0
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, LSE) computed by PyTorch in the inputs' precision (flash-attention's
    `attention_ref` with upcast=False, reorder_ops=True): scores from q and pre-scaled k
    rounded to the input dtype, softmax output and P.V rounded to it; LSE from those
    rounded scores. Its error against `reference` sets the tolerance."""
    scale = 1.0 / math.sqrt(q.shape[3]) if softmax_scale is None else softmax_scale
    ratio = q.shape[2] // k.shape[2]
    visible = visible_keys(q.shape[1], k.shape[1], causal, window, q.device)
    outs, lses = [], []
    for b in range(q.shape[0]):
        qb = q[b].transpose(0, 1)
        kb = (k[b] * scale).repeat_interleave(ratio, 1).transpose(0, 1)
        vb = v[b].repeat_interleave(ratio, 1).transpose(0, 1)
        s = capped(torch.matmul(qb, kb.transpose(1, 2)).float(), softcap)
        if visible is not None:
            s = s.masked_fill(~visible, float("-inf"))
        s = with_sinks(s, sinks)
        p = torch.softmax(s, dim=-1)[..., :k.shape[1]].nan_to_num(0.0).to(q.dtype)
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
               softmax_scale: float | None = None, window: tuple[int, int] = (-1, -1),
               sinks: torch.Tensor | None = None, softcap: float = 0.0) -> tuple[float, float]:
    """(O, LSE) bounds on the largest absolute error: 2 x the error of `reference_lowp`
    against the float32 reference (flash-attention's rule), plus a floor.
    O's floor: 4 ulp at 1.0 of the dtype (one rounding of O itself must always pass).
    LSE's floor: the dtype's unit roundoff times max(1, max |LSE|). The kernel scores Q
    pre-scaled by scale*log2(e) and rounded back to the dtype (the seed's design), so every
    score of a row moves by up to that relative rounding together; PyTorch's low-precision
    scores round independently and their errors average out in the log-sum-exp, so 2 x its
    error alone can be smaller than one rounding of a correlated shift."""
    o_low, lse_low = reference_lowp(q, k, v, causal=causal, softmax_scale=softmax_scale, window=window, sinks=sinks,
                                    softcap=softcap)
    o_err = max_error(o_low.float(), o_ref)
    lse_err = max_error(lse_low, lse_ref)
    finite = lse_ref[torch.isfinite(lse_ref)]
    magnitude = max(1.0, finite.abs().max().item()) if finite.numel() else 1.0
    unit_roundoff = torch.finfo(q.dtype).eps / 2
    return 2 * o_err + 4 * torch.finfo(q.dtype).eps, 2 * lse_err + unit_roundoff * magnitude


# ------------------------------------------------------------------ `gfxasm run fmha_fwd_d128` / `fmha_fwd_d64`

def _register_run_case() -> None:
    from ..runcases import RunCase, run_case

    def fmha_case(variant, gen: torch.Generator, batch: int = 1, seq_q: int = 300, seq_k: int = 300,
                  heads_q: int = 4, heads_k: int = 2) -> RunCase:
        dtype = torch.float16 if variant.defines["F16"] else torch.bfloat16
        causal = bool(variant.defines["FMHA_CAUSAL"])
        head_dim = variant.defines.get("HEAD_DIM", HEAD_DIM)
        q = torch.randn(batch, seq_q, heads_q, head_dim, generator=gen).to(dtype)
        k = torch.randn(batch, seq_k, heads_k, head_dim, generator=gen).to(dtype)
        v = torch.randn(batch, seq_k, heads_k, head_dim, generator=gen).to(dtype)
        o = torch.full(q.shape, float("nan"), dtype=dtype)
        lse = torch.full((batch, heads_q, seq_q), float("nan"))
        # each variant with what the op would give it: a window for WINDOW (the op picks it only
        # for a bounded one), a softcap the scores reach for SOFTCAP
        window = ((37, 0) if causal else (37, 11)) if variant.defines.get("WINDOW") else (-1, -1)
        softcap = 2.0 if variant.defines.get("SOFTCAP") else 0.0
        features = dict(causal=causal, window=window, softcap=softcap)
        o_ref, lse_ref = reference(q, k, v, **features)
        o_tol, lse_tol = tolerances(q, k, v, o_ref, lse_ref, **features)
        args = kernel_args(q, k, v, o, lse, 1.0 / math.sqrt(head_dim), window=window, softcap=softcap)
        # RunCase has one atol for both outputs: the larger budget (tests check each apart).
        return RunCase(args=args, expected={"o": o_ref, "lse": lse_ref}, atol=max(o_tol, lse_tol), rtol=0.0,
                       note=f"B={batch} Sq={seq_q} Sk={seq_k} Hq={heads_q} Hk={heads_k} D={head_dim} window {window} "
                            f"softcap {softcap}")

    for kernel in KERNELS.values():
        run_case(kernel)(fmha_case)


_register_run_case()
