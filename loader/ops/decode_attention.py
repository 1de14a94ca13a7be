"""Decode attention over a KV cache: `gfxasm.decode_attention` on decode_attn (+ decode_attn_merge).

    out = gfxasm.decode_attention(q, k_cache, v_cache, cache_seqlens)                 # contiguous cache
    out, lse = gfxasm.decode_attention(q, k_cache, v_cache, cache_seqlens,
                                       block_table=block_table, return_lse=True)       # paged cache

flash-attention's `flash_attn_with_kvcache` conventions:
  * q [B, Sq, Hq, D], bf16 or fp16, 1 <= Sq <= 16, D in {64, 128}, Hq % Hkv == 0 (GQA/MQA).
  * k_cache / v_cache in q's dtype: contiguous [B, S_max, Hkv, D], or paged
    [num_pages, page_size, Hkv, D] with block_table [B, max_pages] int32 (page_size a power
    of two >= 16). Key j of batch b sits in page block_table[b, j // page_size].
  * cache_seqlens [B] int32: the end of the batch entry's keys, the Sq new tokens included
    (they are its last Sq keys). 0 gives O = 0 and LSE = -inf.
  * cache_leftpad [B] int32 (optional, flash-attention's): the batch entry's keys start at
    cache_leftpad[b] (transformers' left-padded batches); keys before it are never read.
    Positions count from it, which leaves the bounds below unchanged in cache indices.
  * Query token s sits at key position pos = seqlen - Sq + s (bottom-right aligned) and sees
    key j iff leftpad <= j < seqlen and pos - left <= j <= pos + right, where
    window_size = (left, right), -1 unbounded. causal=True means right = 0 (a right > 0 with
    causal is an error; right -1 or 0 are accepted).
  * softcap > 0 (Gemma-2): each score becomes softcap * tanh(softmax_scale * q.k / softcap)
    before the mask, computed in the kernel (variant SOFTCAP) from v_exp_f32 and v_rcp_f32:
    within SOFTCAP_ERROR * softcap of the exact value (tests/test_decode_attention.py
    measures it).
  * sinks [Hq] float32, finite: one attention-sink logit per query head (gpt-oss), added to
    each row's softmax denominator only; the LSE returned includes it.
  * softmax_scale defaults to 1/sqrt(D). O [B, Sq, Hq, D] in q's dtype (written into `out`
    when given); LSE [B, Hq, Sq] float32, natural log.
  * Non-finite scores follow the float64 softmax: a row whose visible scores are all -inf
    gets O = NaN (LSE -inf; with a sink, O = 0 and LSE = the sink); a row with a +inf
    score gets O and LSE NaN.

Split-K, two levels: the keys of each (batch, KV head) are cut into `num_splits` chunks of
`chunk` keys (a multiple of 32), one 8-wave workgroup each; its waves take the chunk's
32-key tiles round robin and combine their results through LDS. With more than one split
(or with sinks) each workgroup writes an f32 partial (O normalised, log2-sum-exp) and
decode_attn_merge combines them in split order — deterministic, no atomics. `plan`
documents how num_splits is chosen.

Page ids are not validated on the host (that would need a device sync): the kernel clamps
each id to [0, num_pages - 1] (a negative id, read as unsigned, becomes num_pages - 1), so
a bad id reads a wrong page of the pool, never memory outside it. Page-table entries past a
sequence's end (and pages wholly before cache_leftpad or a sliding window) are never read,
nor are cache rows at or past cache_seqlens, nor rows before cache_leftpad or before the
first query's window (those in a 16-key block the kernel reads load as zeros). A
cache_leftpad outside [0, cache_seqlens] on a GPU (not checked there) acts as the nearer
bound (negative: 0; past cache_seqlens: no key); nothing outside the pool or table is read.

FP8 caches: k_cache and v_cache torch.float8_e4m3fn (OCP e4m3) with either per-tensor
float32 k_descale and v_descale (one element each, read on the device: the keys are
k * k_descale), or per-token per-KV-head float16 (scale, shift) pairs k_scale_shift /
v_scale_shift shaped like the cache's token dims plus 2 — [B, S_max, Hkv, 2] or
[num_pages, page_size, Hkv, 2], read through the same block table (key = fp8 * scale +
shift, xformers' row-wise asymmetric FP8). One kind (`Fp8`), for both K and V.
Descales must be finite and > 0, and need no narrower range: the kernel folds k_descale
into the score scale and v_descale into O's final 1 / l, which gives the reference's
answer for any such value where the answer fits (a subnormal and 2^124 included). The
pairs of every key a query sees (below cache_seqlens, from cache_leftpad and the first
query's window start on) must be finite: the kernel computes a score as scale (q.k) + shift sum(q), so a K pair
holding +-inf gives a finite score where the float64 reference gives NaN.

Everything checkable on the host is checked before any launch: a violation is a
ValueError/TypeError naming the argument. The data checks (cache_seqlens within the cache,
cache_leftpad within [0, cache_seqlens], finite sinks, descales finite and > 0, finite pairs) read CPU tensors only: on a GPU the
data is not read (that would synchronise), and such inputs are the caller's to avoid.

torch ops (declared on loader/ops/framework.py): gfxasm::decode_attention(q, k_cache,
v_cache, cache_seqlens, block_table, cache_leftpad, k_descale, v_descale, k_scale_shift,
v_scale_shift, softmax_scale, causal, window_left, window_right, sinks, softcap, num_splits)
(the Python call's window_size is (window_left, window_right)) -> out;
gfxasm::decode_attention_with_lse(the same) -> (out, lse); gfxasm::decode_attention_out(the
same, out!, lse!?). Their fake kernels check what metadata tells (meta tensors throughout give the
output shapes; torch.compile traces them). The checked, prepared launches are cached per
tensor layout and scalars, so a repeated call checks only what its data can change
(pointers, and on the CPU the data checks above), allocates and launches.
"""
from __future__ import annotations

import enum
import inspect
import math
from dataclasses import dataclass

import torch

from ..gridexpr import cdiv
from ..launcher import prepare
from ..manifest import Variant, default_manifest
from . import fmha, framework

NAME = "decode_attention"
KERNEL = "decode_attn"
MERGE = "decode_attn_merge"
DTYPES = (torch.bfloat16, torch.float16)
HEAD_DIMS = (64, 128)
MAX_SEQ_Q = 16
ROW_TILE = 16                      # query rows (token, head of the group) per wave
TILE = 32                          # keys per kernel iteration; a split's chunk is a multiple
MIN_PAGE = 16                      # a 16-key block never crosses a page
NUM_CUS = 256
WAVES_PER_GROUP = 8                # kernels.yaml decode_attn workgroup / 64 (a test checks)
WAVES_PER_CU = 4                   # target resident waves per CU for the split model
MIN_SPLIT_KEYS = 512               # a split should give each of its 8 waves >= 2 tiles
MAX_SPLITS = 64
CONTIGUOUS_SHIFT = 31              # page_shift of a contiguous cache: one page per batch entry
LOG2E = 1.4426950408889634
SOFTCAP_ERROR = 2.0**-20           # |kernel score - softcap tanh(.)| <= SOFTCAP_ERROR softcap (asm header: ~2^-21)
_F32_NORMAL = (2.0**-126, 2.0**127)
_U32 = 2**32
_MAX_OFFSET = 2**31                # the kernels' descriptors hold offsets below 2^31
_ALIGN = 16
E4M3 = torch.float8_e4m3fn
_FP8 = (E4M3, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
_DESCALES = ("k_descale", "v_descale")
_PAIRS = ("k_scale_shift", "v_scale_shift")


class Fp8(enum.IntEnum):
    """How the cache is stored; the value is decode_attn's FP8 define."""
    NONE = 0                       # in q's dtype
    PER_TENSOR = 1                 # e4m3 with k_descale, v_descale
    PER_TOKEN = 2                  # e4m3 with (scale, shift) pairs k_scale_shift, v_scale_shift


@dataclass(frozen=True)
class Plan:
    """How one call is launched."""
    num_splits: int
    chunk: int                     # keys per split (multiple of TILE)
    row_tiles: int                 # 16-row query tiles per KV head
    partial: bool                  # splits (or sinks): f32 partials + decode_attn_merge


def plan(batch: int, heads_kv: int, rows: int, capacity: int, num_splits: int | None = None) -> Plan:
    """The split model. An 8-wave workgroup per (batch, KV head, 16-row query tile, split);
    the grid without splits has batch * heads_kv * row_tiles * 8 waves. Splits multiply it
    up to about NUM_CUS * WAVES_PER_CU waves (256 CUs x 4), but each split keeps at least
    MIN_SPLIT_KEYS keys of `capacity`, the most keys one sequence's queries can see: the
    cache's capacity (contiguous: S_max; paged: max_pages * page_size — the longest sequence
    the call can hold, known without a device sync), or less with a sliding window (left +
    seq_q: the kernel's splits start at the first query's window start), and
    at most MAX_SPLITS. The chunk is rounded up to TILE keys and splits that would be empty
    for every sequence are dropped. `num_splits` overrides the model (then only the chunk
    rounding applies). Target: bench/decode.py's modelled sweeps put the one-wave-per-split
    kernel at or near its best with 4 waves per CU on every issue shape; with 8 waves per
    workgroup those shapes (128 (batch, KV head) pairs) need no second pass at all."""
    row_tiles = cdiv(rows, ROW_TILE)
    waves = max(1, batch * heads_kv * row_tiles * WAVES_PER_GROUP)
    capacity = max(1, capacity)
    if num_splits is None:
        wanted = cdiv(NUM_CUS * WAVES_PER_CU, waves)
        num_splits = max(1, min(wanted, capacity // MIN_SPLIT_KEYS, MAX_SPLITS))
    chunk = cdiv(cdiv(capacity, num_splits), TILE) * TILE
    splits = cdiv(capacity, chunk)
    return Plan(splits, chunk, row_tiles, splits > 1)


# ------------------------------------------------------------------ checks

@dataclass(frozen=True)
class _Checked:
    """What the checks derive from a call; the rest the plan reads off the call itself."""
    fp8: Fp8
    scale: float                   # softmax_scale
    left: int                      # window_size: -1 unbounded
    right: int                     # 0 for causal
    softcap: float                 # 0: none
    capacity: int                  # keys one sequence can hold (contiguous: S_max)


def _stride(t: torch.Tensor, axis: int) -> int:
    """A dim's stride, taken as 0 when the dim has size 1 (never stepped along)."""
    return 0 if t.shape[axis] == 1 else t.stride(axis)


def _byte_strides(t: torch.Tensor) -> list[int]:
    """The byte strides of every dim but the last (0 for a dim of size 1)."""
    return [_stride(t, a) * t.element_size() for a in range(t.dim() - 1)]


def _span(t: torch.Tensor, axes) -> int:
    """Bytes from a slice's first element to past its last over the given axes."""
    e = t.element_size()
    return sum((t.shape[a] - 1) * _stride(t, a) * e for a in axes) + t.shape[-1] * e


def _vector(call, name: str, dtype: torch.dtype, length: int, what: str) -> None:
    """A contiguous rank-1 tensor of `length` elements of `dtype`."""
    t = call.tensor(name, 1, what)
    if t.dtype != dtype:
        call.fail(TypeError, f"'{name}' dtype must be {dtype}, got {t.dtype}")
    if t.shape[0] != length:
        call.fail(ValueError, f"'{name}' must be [{length}], got {tuple(t.shape)}")
    if not t.is_contiguous():
        call.fail(ValueError, f"'{name}' must be contiguous")


def _check_rows(call, name: str, t: torch.Tensor) -> None:
    """Head dim contiguous; strides multiples of 16 bytes below 2^32; rows (dim 1) apart."""
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        call.fail(ValueError, f"'{name}' must be contiguous in the head dim (stride 1), got strides {t.stride()}")
    strides = _byte_strides(t)
    for axis, s in enumerate(strides):
        if s % _ALIGN or s < 0:
            call.fail(ValueError, f"'{name}' strides must be non-negative multiples of 16 bytes, got {t.stride()}")
        if s >= _U32:
            call.fail(ValueError, f"'{name}' stride {t.stride(axis)} (axis {axis}) must be below 2^32 bytes")
    if t.shape[1] > 1 and strides[1] < t.shape[-1] * t.element_size():
        call.fail(ValueError, f"'{name}' rows may not overlap (seq stride >= head dim), got strides {t.stride()}")


def _check_q(call) -> torch.Tensor:
    q = call.tensor("q", 4, "[batch, seq_q, heads_q, head_dim]")
    if q.dtype not in DTYPES:
        call.fail(TypeError, f"'q' dtype must be torch.bfloat16 or torch.float16, got {q.dtype}")
    dim, seq_q = q.shape[3], q.shape[1]
    if dim not in HEAD_DIMS:
        call.fail(ValueError, f"'q' head dim must be 64 or 128, got {dim}")
    if not 1 <= seq_q <= MAX_SEQ_Q:
        call.fail(ValueError, f"'q' seq_q must be in 1..{MAX_SEQ_Q}, got {seq_q}")
    return q


def _check_caches(call, q: torch.Tensor) -> Fp8:
    """k_cache and v_cache against q (dtypes, shapes, heads, pages) and their scales."""
    paged = call.block_table is not None
    what = "[num_pages, page_size, heads_kv, head_dim]" if paged else "[batch, seq_max, heads_kv, head_dim]"
    k_cache = call.tensor("k_cache", 4, what)
    v_cache = call.tensor("v_cache", 4, what)
    fp8 = k_cache.dtype in _FP8
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != (E4M3 if fp8 else q.dtype):
            call.fail(TypeError, f"'{name}' dtype must be q's ({q.dtype}) or torch.float8_e4m3fn (both caches "
                                 f"alike), got {t.dtype}")
    kind = _check_scales(call, fp8)
    if v_cache.shape != k_cache.shape:
        call.fail(ValueError, f"'v_cache' shape must equal k_cache's {tuple(k_cache.shape)}, got "
                              f"{tuple(v_cache.shape)}")
    batch, _, heads_q, dim = q.shape
    pages, page_size, heads_kv, kdim = k_cache.shape
    if kdim != dim:
        call.fail(ValueError, f"'k_cache' head dim must equal q's ({dim}), got {kdim}")
    if heads_kv < 1 or heads_q % heads_kv:
        call.fail(ValueError, f"heads of q must be a multiple of the cache's KV heads (Hq % Hkv == 0), "
                              f"got Hq={heads_q}, Hkv={heads_kv}")
    if not paged and pages != batch:
        call.fail(ValueError, f"'k_cache' batch must equal q's ({batch}) for a contiguous cache, got {pages}")
    if paged:
        if page_size < MIN_PAGE or page_size & (page_size - 1):
            call.fail(ValueError, f"'k_cache' page_size must be a power of two >= {MIN_PAGE}, got {page_size}")
        if pages < 1:
            call.fail(ValueError, "'k_cache' must have at least one page")
    return kind


def _check_scales(call, fp8: bool) -> Fp8:
    """The cache's kind from its scale arguments: both K and V of one kind (FP8 only), checked."""
    given = [n for n in _DESCALES + _PAIRS if call.values[n] is not None]
    if not fp8:
        for name in given:
            call.fail(ValueError, f"'{name}' is only for an FP8 (float8_e4m3fn) cache; this cache is "
                                  f"{call.k_cache.dtype}")
        return Fp8.NONE
    if set(given) & set(_DESCALES) and set(given) & set(_PAIRS):
        call.fail(ValueError, "give per-tensor descales (k_descale, v_descale) or per-token pairs "
                              "(k_scale_shift, v_scale_shift), not both")
    kind = Fp8.PER_TOKEN if set(given) & set(_PAIRS) else Fp8.PER_TENSOR
    for name in _PAIRS if kind is Fp8.PER_TOKEN else _DESCALES:
        t = call.values[name]
        if t is None:
            call.fail(ValueError, f"'{name}' is required for a float8_e4m3fn cache (k_descale and v_descale, or "
                                  f"k_scale_shift and v_scale_shift)")
        if not isinstance(t, torch.Tensor):
            call.fail(TypeError, f"'{name}' must be a torch.Tensor, got {type(t).__name__}")
        if kind is Fp8.PER_TENSOR:
            if t.dtype != torch.float32 or t.numel() != 1:
                call.fail(TypeError, f"'{name}' must be one float32 element, got {t.dtype} of shape {tuple(t.shape)}")
        else:
            _check_pairs_layout(call, name, t)
    return kind


def _check_pairs_layout(call, name: str, t: torch.Tensor) -> None:
    """(scale, shift) fp16 pairs shaped like the cache's token dims, one dword per pair."""
    token_dims = tuple(call.k_cache.shape[:3])
    if t.dtype != torch.float16:
        call.fail(TypeError, f"'{name}' dtype must be torch.float16 (scale, shift) pairs, got {t.dtype}")
    if tuple(t.shape) != token_dims + (2,):
        call.fail(ValueError, f"'{name}' must be shaped like the cache's token dims plus 2: {token_dims + (2,)}, got "
                              f"{tuple(t.shape)}")
    if t.stride(3) != 1 or any(_stride(t, i) % 2 for i in range(3)):
        call.fail(ValueError, f"'{name}' pairs must be contiguous and 4-byte aligned (even strides), got strides "
                              f"{t.stride()}")
    if any(_stride(t, i) * 2 >= _U32 for i in range(3)):
        call.fail(ValueError, f"'{name}' strides must be below 2^32 bytes, got {t.stride()}")


def _check_block_table(call, batch: int) -> None:
    block_table = call.tensor("block_table", 2, "[batch, max_pages] int32")
    if block_table.dtype != torch.int32:
        call.fail(TypeError, f"'block_table' dtype must be torch.int32, got {block_table.dtype}")
    if block_table.shape[0] != batch or block_table.shape[1] < 1:
        call.fail(ValueError, f"'block_table' must be [{batch}, max_pages >= 1], got {tuple(block_table.shape)}")
    if not block_table.is_contiguous():
        call.fail(ValueError, f"'block_table' must be contiguous, got strides {block_table.stride()}")


def _check_cache_layout(call) -> None:
    """q's and the caches' strides: 16-byte rows, pages apart, 32-bit descriptor offsets."""
    q, k_cache, v_cache = call.q, call.k_cache, call.v_cache
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _check_rows(call, name, t)
    if _span(q, (1, 2)) >= _MAX_OFFSET:
        call.fail(ValueError, "'q' is too large: offsets within one batch entry must stay below 2^31 bytes")
    pages, page_size, heads_kv, _ = k_cache.shape
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        page_stride, seq_stride, head_stride = _byte_strides(t)
        if call.block_table is not None and page_size * seq_stride > page_stride and pages > 1:
            call.fail(ValueError, f"'{name}' pages may not overlap (page stride >= page_size x seq stride)")
        if page_size * seq_stride >= _U32:
            call.fail(ValueError, f"'{name}' one page (contiguous: one batch entry) must span < 2^32 bytes of rows")
        if (heads_kv - 1) * head_stride + 16 * seq_stride >= _U32:
            call.fail(ValueError, f"'{name}' head or seq strides too large (need < 2^32 bytes per 16 keys of all "
                                  f"heads)")


def _check_softcap(call, scale: float) -> float:
    """softcap as fmha's (a finite float >= 0, 0: none), whose kernel constants
    (fmha.score_args) must also be normal f32."""
    softcap = fmha.check_softcap(call)
    lo, hi = _F32_NORMAL
    if softcap and not (lo <= softcap * LOG2E <= hi and lo <= 2 * scale * LOG2E / softcap <= hi):
        call.fail(ValueError, f"'softcap' {softcap!r} with softmax_scale {scale!r}: softcap log2(e) and "
                              f"2 softmax_scale log2(e) / softcap must be normal float32 values")
    return float(softcap)


def _check_options(call, heads_q: int, dim: int) -> tuple[float, int, int, float]:
    """causal, window_size, sinks, softcap, num_splits, softmax_scale; returns (softmax scale,
    left, right, softcap)."""
    if not isinstance(call.causal, bool):
        call.fail(TypeError, f"'causal' must be a bool, got {type(call.causal).__name__}")
    left, right = fmha.check_window(call)
    if call.sinks is not None:
        _vector(call, "sinks", torch.float32, heads_q, "[heads_q] float32")
    num_splits = call.num_splits
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int)
                                   or not 1 <= num_splits <= MAX_SPLITS):
        call.fail(ValueError, f"'num_splits' must be an int in [1, {MAX_SPLITS}] or None, got {num_splits!r}")
    scale = call.softmax_scale
    if scale is None:
        scale = 1.0 / math.sqrt(dim)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        call.fail(ValueError, f"'softmax_scale' must be a finite float > 0, got {scale!r}")
    return float(scale), left, right, _check_softcap(call, float(scale))


def _check_outputs(call, q: torch.Tensor) -> None:
    """The out form's out (q's shape and dtype, 16-byte rows) and lse (contiguous float32)."""
    out, lse = call.out, call.lse
    if out is not None:
        if not isinstance(out, torch.Tensor):
            call.fail(TypeError, f"'out' must be a torch.Tensor, got {type(out).__name__}")
        if out.shape != q.shape:
            call.fail(ValueError, f"'out' shape must equal q's {tuple(q.shape)}, got {tuple(out.shape)}")
        if out.dtype != q.dtype:
            call.fail(TypeError, f"'out' dtype must equal q's ({q.dtype}), got {out.dtype}")
        _check_rows(call, "out", out)
        if _span(out, (1, 2)) >= _MAX_OFFSET:
            call.fail(ValueError, "'out' is too large: offsets within one batch entry must stay below 2^31 bytes")
    if lse is not None:
        batch, seq_q, heads_q, _ = q.shape
        if not isinstance(lse, torch.Tensor):
            call.fail(TypeError, f"'lse' must be a torch.Tensor or None, got {type(lse).__name__}")
        if lse.dtype != torch.float32 or tuple(lse.shape) != (batch, heads_q, seq_q) or not lse.is_contiguous():
            call.fail(ValueError, f"'lse' must be a contiguous float32 [batch, heads_q, seq_q] = [{batch}, {heads_q}, "
                                  f"{seq_q}], got {lse.dtype} shape {tuple(lse.shape)} strides {lse.stride()}")


def _check(call) -> _Checked:
    """Every check of a call the framework does not make: metadata always, and the data of
    CPU tensors where `call.data` (`_check_data`)."""
    q = _check_q(call)
    fp8 = _check_caches(call, q)
    batch, _, heads_q, dim = q.shape
    page_size = call.k_cache.shape[1]
    if call.block_table is not None:
        _check_block_table(call, batch)
    _vector(call, "cache_seqlens", torch.int32, batch, "[batch] int32")
    if call.cache_leftpad is not None:
        _vector(call, "cache_leftpad", torch.int32, batch, "[batch] int32")
    capacity = call.block_table.shape[1] * page_size if call.block_table is not None else page_size
    _check_cache_layout(call)
    scale, left, right, softcap = _check_options(call, heads_q, dim)
    _check_outputs(call, q)
    checked = _Checked(fp8, scale, left, right, softcap, capacity)
    if fmha.readable(call):
        _check_data(call, checked)
    return checked


# ------------------------------------------------------------------ data checks (CPU tensors)

def _check_data(call, checked: _Checked) -> None:
    """What CPU tensors' data must satisfy (module docstring); a repeated call of a cached
    layout runs this again."""
    _check_seqlens(call, checked.capacity)
    if call.sinks is not None:
        bad = (~torch.isfinite(call.sinks)).nonzero()
        if len(bad):
            head = int(bad[0, 0])
            call.fail(ValueError, f"'sinks' must be finite, got {float(call.sinks[head])} for query head {head}")
    if checked.fp8 is Fp8.PER_TENSOR:
        for name in _DESCALES:
            value = float(call.values[name])
            if not (math.isfinite(value) and value > 0):
                call.fail(ValueError, f"'{name}' must be finite and > 0, got {value}")
    elif checked.fp8 is Fp8.PER_TOKEN:
        _check_pairs_finite(call, checked.left)


def _check_seqlens(call, capacity: int) -> None:
    """cache_seqlens within [0, capacity], cache_leftpad within [0, cache_seqlens] (CPU
    tensors: read without a device sync)."""
    seqlens = call.cache_seqlens
    if not seqlens.numel():
        return
    lo, hi = map(int, torch.aminmax(seqlens))
    if lo < 0:
        call.fail(ValueError, f"'cache_seqlens' must be >= 0, got {lo}")
    leftpad = call.cache_leftpad
    if leftpad is not None:
        bad = ((leftpad < 0) | (leftpad > seqlens)).nonzero()
        if len(bad):
            b = int(bad[0, 0])
            call.fail(ValueError, f"'cache_leftpad' must be within [0, cache_seqlens], got {int(leftpad[b])} for "
                                  f"batch entry {b} (cache_seqlens {int(seqlens[b])})")
    if hi > capacity:
        table, page_size = call.block_table, call.k_cache.shape[1]
        where = f"block_table holds {table.shape[1]} pages x {page_size}" if table is not None else \
            f"the cache holds {page_size} keys"
        call.fail(ValueError, f"max(cache_seqlens) = {hi} exceeds the cache: {where}")


def _check_pairs_finite(call, left: int) -> None:
    """The (scale, shift) pairs of every key some query sees finite: keys below the batch
    entry's cache_seqlens, from cache_leftpad and the first query's window start
    (seqlen - Sq - left) on, through the page ids as the kernel clamps them. Keys no query
    sees are not checked: the kernel reads none past cache_seqlens nor before that start."""
    seq_q = call.q.shape[1]
    table = call.block_table
    if table is not None:
        last = call.k_cache.shape[0] - 1
        table = torch.where((table < 0) | (table > last), last, table)
    leftpad = call.cache_leftpad.tolist() if call.cache_leftpad is not None else [0] * len(call.cache_seqlens)
    for b, seqlen in enumerate(call.cache_seqlens.tolist()):
        first = max(leftpad[b], seqlen - seq_q - left if left >= 0 else 0)
        for name in _PAIRS:
            pairs = _tokens(call.values[name], b, seqlen, table)[first:]
            bad = (~torch.isfinite(pairs)).nonzero()
            if len(bad):
                key, head = int(bad[0, 0]), int(bad[0, 1])
                call.fail(ValueError, f"'{name}' must be finite for every key a query sees, got "
                                      f"{tuple(pairs[key, head].tolist())} for batch entry {b}, key {first + key}, "
                                      f"KV head {head}")


# ------------------------------------------------------------------ launch

def _magic(divisor: int) -> int:
    return -(-2**31 // divisor)


def _runs(checked: _Checked, call) -> list[tuple[Variant, dict]]:
    """The launches of a checked call on its outputs, in order: decode_attn, then
    decode_attn_merge where there are splits or sinks (with fresh split-K workspaces)."""
    q = call.q
    if not q.numel():
        return []
    batch, seq_q, heads_q, dim = q.shape
    heads_kv = call.k_cache.shape[2]
    # the splits cut the keys some query may see: from the first query's window start (the
    # kernel's split 0 starts there, or at cache_leftpad) to cache_seqlens
    keys = checked.capacity if checked.left < 0 else min(checked.capacity, checked.left + seq_q)
    split = plan(batch, heads_kv, seq_q * (heads_q // heads_kv), keys, call.num_splits)
    partial = split.partial or call.sinks is not None
    outputs = _output_args(call, split.num_splits, partial)
    kernel = default_manifest().kernel(KERNEL).variant_with(D=dim, F16=q.dtype == torch.float16, FP8=checked.fp8,
                                                            SOFTCAP=checked.softcap > 0)
    runs = [(kernel, dict(**outputs, **_attention_args(checked, call, split, partial)))]
    if partial:
        merge = default_manifest().kernel(MERGE).variant_with(D=dim, F16=q.dtype == torch.float16)
        sinks = call.sinks if call.sinks is not None else _placeholder(q.device)
        runs.append((merge, dict(**outputs, sinks=sinks, splits=split.num_splits,
                                 has_sinks=int(call.sinks is not None))))
    return runs


def _placeholder(device) -> torch.Tensor:
    """A buffer the kernel never touches with these arguments."""
    return torch.empty(4, dtype=torch.float32, device=device)


def _output_args(call, num_splits: int, partial: bool) -> dict:
    """The arguments both kernels take: O, LSE (a placeholder without store_lse) and the
    split-K workspaces (placeholders unless `partial`), with their strides."""
    q, out, lse = call.q, call.out, call.lse
    batch, seq_q, heads_q, dim = q.shape
    rows = batch * seq_q * heads_q
    ws_stride = rows * dim * 4
    if num_splits * ws_stride >= _MAX_OFFSET:
        call.fail(ValueError, f"the split-K workspace ({num_splits} x {ws_stride} bytes) must stay below 2^31 bytes; "
                              f"pass a smaller num_splits")
    dummy = _placeholder(q.device)
    ws_o, ws_lse = dummy, dummy
    if partial:
        ws_o = torch.empty(num_splits * rows * dim, dtype=torch.float32, device=q.device)
        ws_lse = torch.empty(num_splits * rows, dtype=torch.float32, device=q.device)
    return dict(o=out, lse=lse if lse is not None else dummy.view(1, 1, 4), ws_o=ws_o, ws_lse=ws_lse, seq_q=seq_q,
                heads_q=heads_q, ws_stride=ws_stride, wsl_stride=rows * 4, store_lse=int(lse is not None))


def _attention_args(checked: _Checked, call, split: Plan, partial: bool) -> dict:
    """decode_attn's own arguments: q, the caches through their page table, the FP8 scales,
    the shape and split scalars."""
    q, k, v = call.q, call.k_cache, call.v_cache
    batch, seq_q, heads_q, dim = q.shape
    heads_kv = k.shape[2]
    group = heads_q // heads_kv
    if call.block_table is not None:
        table, shift, pages = call.block_table, int(math.log2(k.shape[1])), k.shape[0]
    else:
        table = torch.arange(batch, dtype=torch.int32, device=q.device).view(batch, 1)
        shift, pages = CONTIGUOUS_SHIFT, batch
    leftpad = call.cache_leftpad
    if leftpad is None:
        leftpad = torch.zeros(batch, dtype=torch.int32, device=q.device)
    window = fmha.window_args((checked.left, checked.right))
    return dict(q=q, k_cache=k, v_cache=v, cache_seqlens=call.cache_seqlens, block_table=table, cache_leftpad=leftpad,
                **_scale_args(checked.fp8, call), num_splits=split.num_splits, heads_kv=heads_kv,
                row_tiles=split.row_tiles, group=group, group_magic=_magic(group),
                tiles_magic=_magic(split.row_tiles), rows=seq_q * group, max_pages=table.shape[1],
                pages_m1=pages - 1, page_shift=shift, chunk=split.chunk,
                window=window["window_left"], future=window["window_right"],
                **fmha.score_args(checked.scale, checked.softcap), partial=int(partial))


def _scale_args(fp8: Fp8, call) -> dict:
    """The FP8 scale arguments, placeholders where the kind has none."""
    device = call.q.device
    dummy = _placeholder(device)
    args = dict(k_descale=dummy, v_descale=dummy)
    if fp8 is Fp8.PER_TENSOR:
        args.update(k_descale=call.k_descale.reshape(1), v_descale=call.v_descale.reshape(1))
    no_pairs = torch.empty(1, 1, 1, 2, dtype=torch.float16, device=device)
    for name in _PAIRS:
        args[name] = call.values[name] if fp8 is Fp8.PER_TOKEN else no_pairs
    return args


# kernel argument <- the call's tensor of that name (where they differ), and back
_KERNEL_ARG = {"o": "out"}
_CALL_ARG = {call: kernel for kernel, call in _KERNEL_ARG.items()}


def _plan(checked: _Checked, call) -> framework.Plan:
    """The call's runs prepared. A later call of the layout binds its own tensors (those it
    passes; the plan holds the placeholders and a contiguous cache's page table) and fresh
    split-K workspaces: concurrent calls of one layout must not share one."""
    runs = _runs(checked, call)
    if not runs:
        return framework.Plan()
    passed = {_CALL_ARG.get(name, name) for name, t in call.values.items() if isinstance(t, torch.Tensor)}
    made = {name: t for _, args in runs for name, t in args.items() if isinstance(t, torch.Tensor)}
    workspaces = {name: ((made[name].numel(),), torch.float32) for name in ("ws_o", "ws_lse")} \
        if len(runs) > 1 else {}
    fixed = {name: t for name, t in made.items() if name not in passed and name not in workspaces}
    recheck = (lambda c: _check_data(c, checked)) if fmha.readable(call) else None
    return framework.Plan(tuple(prepare(variant, args) for variant, args in runs), fixed=fixed,
                          rename=_KERNEL_ARG, scratch=workspaces, recheck=recheck)


def _allocate(call, names: frozenset) -> dict:
    return fmha.new_outputs(call.tensor("q", 4, "[batch, seq_q, heads_q, head_dim]"), names)


_ALIGNED = dict(align=16)          # 16-byte loads and stores
_PAIRED = dict(align=4)            # one dword per (scale, shift) pair
DECODE_ATTENTION = framework.define(framework.Spec(
    NAME,
    params=(framework.Param("q", "Tensor", **_ALIGNED), framework.Param("k_cache", "Tensor", **_ALIGNED),
            framework.Param("v_cache", "Tensor", **_ALIGNED), framework.Param("cache_seqlens", "Tensor"),
            framework.Param("block_table", "Tensor?"), framework.Param("cache_leftpad", "Tensor?"),
            framework.Param("k_descale", "Tensor?"),
            framework.Param("v_descale", "Tensor?"), framework.Param("k_scale_shift", "Tensor?", **_PAIRED),
            framework.Param("v_scale_shift", "Tensor?", **_PAIRED), framework.Param("softmax_scale", "float?"),
            framework.Param("causal", "bool"), framework.Param("window_left", "SymInt"),
            framework.Param("window_right", "SymInt"),
            framework.Param("sinks", "Tensor?"), framework.Param("softcap", "float"),
            framework.Param("num_splits", "SymInt?")),
    outputs=(framework.Output("out", **_ALIGNED), framework.Output("lse", optional=True)),
    check=_check, allocate=_allocate, plan=_plan))


def decode_attention(q, k_cache, v_cache, cache_seqlens, *, block_table=None, cache_leftpad=None, k_descale=None,
                     v_descale=None, k_scale_shift=None, v_scale_shift=None, softmax_scale=None, causal=True,
                     window_size=(-1, -1), sinks=None, softcap=0.0, num_splits=None, out=None, return_lse=False):
    """Attention of q's new tokens over the KV cache; returns out, or (out, lse) with
    return_lse. See the module docstring for conventions and limits; runs
    torch.ops.gfxasm.decode_attention (decode_attention_with_lse with return_lse,
    decode_attention_out when `out` is given)."""
    return DECODE_ATTENTION(q, k_cache, v_cache, cache_seqlens, block_table, cache_leftpad, k_descale, v_descale,
                            k_scale_shift, v_scale_shift, softmax_scale, causal, *fmha.window_pair(NAME, window_size),
                            sinks, softcap, num_splits, out=out, return_lse=return_lse)


_SIGNATURE = inspect.signature(decode_attention)


def launches(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None, list]:
    """decode_attention's arguments checked and planned, not run: (out, lse or None,
    [(kernel, variant, arguments), ...]) — the launches decode_attention runs, in order
    (bench/decode.py models the same ones). The op's metadata checks only, as in a fake
    call: the data is not read (bench/decode.py passes empty tensors)."""
    given = _SIGNATURE.bind(*args, **kwargs)
    given.apply_defaults()
    bound = given.arguments
    bound["window_left"], bound["window_right"] = fmha.window_pair(NAME, bound["window_size"])
    values = {p.name: bound[p.name] for p in DECODE_ATTENTION.spec.params}
    call = framework.Call(NAME, {**values, "out": bound["out"], "lse": None}, False)
    checked = _check(call)
    wanted = ({"out"} if call.out is None else set()) | ({"lse"} if bound["return_lse"] else set())
    call.values.update(_allocate(call, frozenset(wanted)))
    return call.out, call.lse, [(variant.kernel.name, variant.name, args) for variant, args in _runs(checked, call)]


def build_kernels(force: bool = False) -> None:
    """Assemble (incrementally) and check this op's kernels only."""
    from .. import build    # the toolchain is needed only here, not to import the op
    build.build_kernels((KERNEL, MERGE), force)


# ------------------------------------------------------------------ reference

def _tokens(t: torch.Tensor, b: int, seqlen: int, block_table: torch.Tensor | None) -> torch.Tensor:
    """Token rows 0..seqlen-1 of batch entry b of a cache-shaped tensor, float64."""
    if block_table is None:
        return t[b, :seqlen].double()
    pages = block_table[b, :cdiv(seqlen, t.shape[1])].long()
    return t[pages].reshape(-1, *t.shape[2:])[:seqlen].double()


def gather_kv(cache: torch.Tensor, b: int, seqlen: int, block_table: torch.Tensor | None,
              descale: torch.Tensor | None = None, scale_shift: torch.Tensor | None = None) -> torch.Tensor:
    """Keys 0..seqlen-1 of batch entry b as [seqlen, Hkv, D] float64, dequantised: times the
    per-tensor descale, or times the token's scale plus its shift."""
    rows = _tokens(cache, b, seqlen, block_table)
    if descale is not None:
        return rows * float(descale.reshape(()))
    if scale_shift is not None:
        pairs = _tokens(scale_shift, b, seqlen, block_table)
        return rows * pairs[..., :1] + pairs[..., 1:]
    return rows


def reference(q, k_cache, v_cache, cache_seqlens, *, block_table=None, cache_leftpad=None, k_descale=None,
              v_descale=None, k_scale_shift=None, v_scale_shift=None, softmax_scale=None, causal=True,
              window_size=(-1, -1), sinks=None, softcap=0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(O, LSE, O_abs) in float64: O [B, Sq, Hq, D], LSE [B, Hq, Sq] (natural log, the
    sink included), O_abs = P |V| (per-token pairs: P |fp8 * scale|; for `tolerance`).
    Rows that see no key (and no sink): O = 0, LSE = -inf. Written from the definitions
    (flash-attention's positions counted after cache_leftpad), not from the kernel's ranges."""
    batch, seq_q, heads_q, dim = q.shape
    scale = 1.0 / math.sqrt(dim) if softmax_scale is None else softmax_scale
    group = heads_q // k_cache.shape[2]

    def per_head(rows):                      # [n, Hkv, D] -> [Hq, n, D]
        return rows.repeat_interleave(group, 1).transpose(0, 1)

    def v_mag(cache, b, n):
        # what the kernel multiplies by the rounded P: |v| (per-token pairs: |fp8 * scale|, no shift)
        if v_scale_shift is None:
            return gather_kv(cache, b, n, block_table, v_descale).abs()
        scale_only = v_scale_shift * torch.tensor([1.0, 0.0], dtype=v_scale_shift.dtype)
        return gather_kv(cache, b, n, block_table, scale_shift=scale_only).abs()

    o = torch.zeros(q.shape, dtype=torch.float64)
    o_abs = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full((batch, heads_q, seq_q), float("-inf"), dtype=torch.float64)
    left, right = window_size
    for b in range(batch):
        n = int(cache_seqlens[b])
        pad = int(cache_leftpad[b]) if cache_leftpad is not None else 0
        kb = per_head(gather_kv(k_cache, b, n, block_table, k_descale, k_scale_shift))               # [Hq, n, D]
        vb = per_head(gather_kv(v_cache, b, n, block_table, v_descale, v_scale_shift))
        s = torch.matmul(q[b].double().transpose(0, 1), kb.transpose(1, 2)) * scale               # [Hq, Sq, n]
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        qpos = (n - pad) - seq_q + torch.arange(seq_q)[:, None]        # positions after the padding
        j = torch.arange(n)[None, :] - pad
        visible = (j >= 0).expand(seq_q, n).clone()
        if causal or right >= 0:
            visible &= j <= qpos + (0 if causal else right)
        if left >= 0:
            visible &= j >= qpos - left
        s = s.masked_fill(~visible, float("-inf"))
        if sinks is not None:
            s = torch.cat([s, sinks.double()[:, None, None].expand(heads_q, seq_q, 1)], dim=-1)
        row_lse = torch.logsumexp(s, dim=-1)                                                      # [Hq, Sq]
        # rows that see no key (and no sink) get O = 0; elsewhere exp's NaN stands (an inf
        # score, or every visible score -inf: 0 / 0)
        no_key = ~visible.any(-1)[:, None] & (sinks is None)                                     # [Sq, 1]
        p = torch.exp(s - row_lse[..., None]).masked_fill(no_key, 0.0)[..., :n]
        o[b] = torch.matmul(p, vb).transpose(0, 1)
        o_abs[b] = torch.matmul(p, per_head(v_mag(v_cache, b, n))).transpose(0, 1)
        lse[b] = row_lse
    return o, lse, o_abs


def tolerance(o_ref: torch.Tensor, o_abs: torch.Tensor | float, dtype: torch.dtype) -> torch.Tensor:
    """Per-element bound on |O - O_ref|: the kernel rounds each P to the input dtype before
    P.V (relative error <= u each, so at most u (P|V|) = u O_abs) and rounds O once (u |O|);
    twice that, u the dtype's unit roundoff, plus f32 accumulation noise. The merge alone
    (no P rounding) passes O_abs = 0."""
    u = torch.finfo(dtype).eps / 2
    return 2 * u * (o_abs + o_ref.abs()) + 1e-5


LSE_TOL = 2e-5                     # relative to max(1, |LSE|): f32 scores, exp2/log2 and sums


# ------------------------------------------------------------------ `gfxasm run`

def random_pairs(cache_shape, gen: torch.Generator) -> torch.Tensor:
    """Random per-token (scale, shift) fp16 pairs for a cache shape: scales 0.25..2.25, shifts
    -1..1 (the magnitudes of xformers' row-wise quantisation of unit-scale data)."""
    scale = torch.rand(*cache_shape[:3], generator=gen) * 2 + 0.25
    shift = torch.rand(*cache_shape[:3], generator=gen) * 2 - 1
    return torch.stack([scale, shift], dim=-1).to(torch.float16)


def _register_run_cases() -> None:
    from ..runcases import RunCase, run_case

    @run_case(KERNEL)
    def decode_case(variant, gen: torch.Generator) -> RunCase:
        """One unsplit launch (partial = 0) on a paged cache: B2, Sq 2, Hq 8 / Hkv 2, the
        arguments exactly as decode_attention builds them (softcap 10 for a SOFTCAP variant)."""
        dim = variant.defines["D"]
        dtype = torch.float16 if variant.defines["F16"] else torch.bfloat16
        fp8 = Fp8(variant.defines["FP8"])
        batch, seq_q, heads_q, heads_kv, page, pages = 2, 2, 8, 2, 16, 12
        q = torch.randn(batch, seq_q, heads_q, dim, generator=gen).to(dtype)
        k = torch.randn(pages, page, heads_kv, dim, generator=gen).to(E4M3 if fp8 else dtype)
        v = torch.randn(pages, page, heads_kv, dim, generator=gen).to(E4M3 if fp8 else dtype)
        scales = {Fp8.PER_TENSOR: dict(k_descale=torch.tensor([0.75]), v_descale=torch.tensor([1.5])),
                  Fp8.PER_TOKEN: dict(k_scale_shift=random_pairs(k.shape, gen),
                                      v_scale_shift=random_pairs(v.shape, gen))}
        descales = scales.get(fp8, {})
        table = torch.randperm(pages, generator=gen).to(torch.int32).view(batch, pages // batch)
        seqlens = torch.tensor([37, 90], dtype=torch.int32)
        softcap = 10.0 if variant.defines["SOFTCAP"] else 0.0
        o = torch.full(q.shape, float("nan"), dtype=dtype)
        _, lse, runs = launches(q, k, v, seqlens, block_table=table, num_splits=1, out=o, return_lse=True,
                                softcap=softcap, **descales)
        lse.fill_(float("nan"))
        o_ref, lse_ref, o_abs = reference(q, k, v, seqlens, block_table=table, softcap=softcap, **descales)
        atol = float(tolerance(o_ref, o_abs, dtype).max()) + SOFTCAP_ERROR * softcap
        return RunCase(args=runs[0][2], expected={"o": o_ref.float(), "lse": lse_ref.float()}, atol=atol,
                       rtol=LSE_TOL, note=f"paged 16, B{batch} Sq{seq_q} Hq{heads_q}/Hkv{heads_kv} seqlens 37, 90"
                                         f"{', softcap 10' if softcap else ''}")

    @run_case(MERGE)
    def merge_case(variant, gen: torch.Generator) -> RunCase:
        """Random partials of 5 splits (one empty for some rows) and sinks."""
        dim = variant.defines["D"]
        dtype = torch.float16 if variant.defines["F16"] else torch.bfloat16
        batch, seq_q, heads_q, splits = 2, 3, 4, 5
        rows = batch * seq_q * heads_q
        ws_o = torch.randn(splits, rows, dim, generator=gen)
        ws_lse = torch.randn(splits, rows, generator=gen) * 4
        ws_lse[2, ::3] = float("-inf")
        sinks = torch.randn(heads_q, generator=gen)
        o = torch.full((batch, seq_q, heads_q, dim), float("nan"), dtype=dtype)
        lse = torch.full((batch, heads_q, seq_q), float("nan"))
        terms = torch.cat([ws_lse.double() / LOG2E,
                           sinks.double().repeat(batch * seq_q)[None, :]], dim=0)            # natural log
        total = torch.logsumexp(terms, dim=0)
        weights = torch.exp(ws_lse.double() / LOG2E - total)
        o_ref = (weights[..., None] * ws_o.double()).sum(0).view(batch, seq_q, heads_q, dim)
        lse_ref = total.view(batch, seq_q, heads_q).transpose(1, 2)
        args = dict(ws_o=ws_o.view(-1), ws_lse=ws_lse.view(-1), sinks=sinks, o=o, lse=lse, splits=splits,
                    seq_q=seq_q, heads_q=heads_q, ws_stride=rows * dim * 4, wsl_stride=rows * 4, has_sinks=1,
                    store_lse=1)
        atol = float(tolerance(o_ref, 0.0, dtype).max())
        return RunCase(args=args, expected={"o": o_ref.float(), "lse": lse_ref.float()}, atol=atol, rtol=LSE_TOL,
                       note=f"{splits} splits, B{batch} Sq{seq_q} Hq{heads_q}, sinks")


_register_run_cases()
