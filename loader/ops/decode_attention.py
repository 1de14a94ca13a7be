"""Decode attention over a KV cache: `gfxasm.decode_attention` on decode_attn (+ decode_attn_merge).

    out = gfxasm.decode_attention(q, k_cache, v_cache, cache_seqlens)                 # contiguous cache
    out, lse = gfxasm.decode_attention(q, k_cache, v_cache, cache_seqlens,
                                       block_table=block_table, return_lse=True)       # paged cache

flash-attention's `flash_attn_with_kvcache` conventions:
  * q [B, Sq, Hq, D], bf16 or fp16, 1 <= Sq <= 16, D in {64, 128}, Hq % Hkv == 0 (GQA/MQA).
  * k_cache / v_cache in q's dtype: contiguous [B, S_max, Hkv, D], or paged
    [num_pages, page_size, Hkv, D] with block_table [B, max_pages] int32 (page_size a power
    of two >= 16). Key j of batch b sits in page block_table[b, j // page_size].
  * cache_seqlens [B] int32: keys visible to the batch entry, the Sq new tokens included
    (they are its last Sq keys). 0 gives O = 0 and LSE = -inf.
  * causal=True: query token s sees key j iff j <= seqlen - Sq + s (bottom-right aligned).
    window_left >= 0 (flash-attention's sliding window): also j >= seqlen - Sq + s - window_left.
  * sinks [Hq] float32: one attention-sink logit per query head (gpt-oss), added to each
    row's softmax denominator only; the LSE returned includes it.
  * softmax_scale defaults to 1/sqrt(D). O [B, Sq, Hq, D] in q's dtype (written into `out`
    when given); LSE [B, Hq, Sq] float32, natural log.

Split-K, two levels: the keys of each (batch, KV head) are cut into `num_splits` chunks of
`chunk` keys (a multiple of 32), one 8-wave workgroup each; its waves take the chunk's
32-key tiles round robin and combine their results through LDS. With more than one split
(or with sinks) each workgroup writes an f32 partial (O normalised, log2-sum-exp) and
decode_attn_merge combines them in split order — deterministic, no atomics. `plan`
documents how num_splits is chosen.

Page ids are not validated on the host (that would need a device sync): the kernel clamps
each id to [0, num_pages - 1] (a negative id, read as unsigned, becomes num_pages - 1), so
a bad id reads a wrong page of the pool, never memory outside it. Page-table entries past a
sequence's end (and pages wholly before a sliding window) are never read, nor are cache
rows at or past cache_seqlens.

FP8 caches: k_cache and v_cache torch.float8_e4m3fn (OCP e4m3) with either per-tensor
float32 k_descale and v_descale (one element each, read on the device: the keys are
k * k_descale), or per-token per-KV-head float16 (scale, shift) pairs k_scale_shift /
v_scale_shift shaped like the cache's token dims plus 2 — [B, S_max, Hkv, 2] or
[num_pages, page_size, Hkv, 2], read through the same block table (key = fp8 * scale +
shift, xformers' row-wise asymmetric FP8). One kind, for both K and V.

Everything checkable on the host is checked before any launch: a violation is a
ValueError/TypeError naming the argument.

torch ops (loader/ops/library.py): gfxasm::decode_attention(q, k_cache, v_cache,
cache_seqlens, block_table, k_descale, v_descale, k_scale_shift, v_scale_shift,
softmax_scale, causal, window_left, sinks, num_splits, return_lse) -> (out, lse), lse
empty unless return_lse; gfxasm::decode_attention_out(the same but return_lse, out!,
lse!?). Their fake kernels check what metadata tells (meta tensors throughout give the
output shapes; torch.compile traces them); what needs the data (pointers' alignment and
overlaps, a CPU cache_seqlens' range) is checked only on real tensors. The checked, prepared
launches are cached per tensor layout (shapes, strides, dtypes, devices) and scalars, so a
repeated call checks only what its data can change, allocates and launches.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from ..gridexpr import cdiv
from ..launcher import BACKEND_ENV, prepare
from ..manifest import default_manifest
from . import arguments, library
from .aliasing import extent, refuse_internal_overlap, refuse_overlap

KERNEL = "decode_attn"
MERGE = "decode_attn_merge"
DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}
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
NO_LIMIT = 2**30                   # window_left / future keys meaning "none"
CONTIGUOUS_SHIFT = 31              # page_shift of a contiguous cache: one page per batch entry
LOG2E = 1.4426950408889634
_U32 = 2**32
_MAX_OFFSET = 2**31                # the kernels' descriptors hold offsets below 2^31
_ALIGN = 16
E4M3 = torch.float8_e4m3fn
_FP8 = (E4M3, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)


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
    MIN_SPLIT_KEYS keys of the cache's capacity (contiguous: S_max; paged: max_pages *
    page_size — the longest sequence the call can hold, known without a device sync), and
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


# ------------------------------------------------------------------ validation

def _fail(exc, msg: str):
    arguments.fail("decode_attention", exc, msg)


def _tensor(name: str, value, rank: int, what: str) -> torch.Tensor:
    return arguments.tensor("decode_attention", name, value, rank, what)


def _vector(name: str, value, dtype: torch.dtype, length: int, what: str, device) -> torch.Tensor:
    """A contiguous rank-1 tensor of `length` elements of `dtype` on `device`."""
    t = _tensor(name, value, 1, what)
    if t.dtype != dtype:
        _fail(TypeError, f"'{name}' dtype must be {dtype}, got {t.dtype}")
    if t.shape[0] != length:
        _fail(ValueError, f"'{name}' must be [{length}], got {tuple(t.shape)}")
    if t.device != device:
        _fail(ValueError, f"'{name}' must be on q's device ({device}), got {t.device}")
    if not t.is_contiguous():
        _fail(ValueError, f"'{name}' must be contiguous")
    return t


def _stride(t: torch.Tensor, axis: int) -> int:
    """A dim's stride, taken as 0 when the dim has size 1 (never stepped along)."""
    return 0 if t.shape[axis] == 1 else t.stride(axis)


def _check_rows(name: str, t: torch.Tensor, row_axis: int, data: bool) -> list[int]:
    """Head dim contiguous, 16-byte aligned data (`data`: real tensors) and strides; returns
    the byte strides."""
    e = t.element_size()
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        _fail(ValueError, f"'{name}' must be contiguous in the head dim (stride 1), got strides {t.stride()}")
    if data:
        _check_aligned(name, t)
    strides = [_stride(t, a) * e for a in range(t.dim() - 1)]
    for axis, s in enumerate(strides):
        if s % _ALIGN or s < 0:
            _fail(ValueError, f"'{name}' strides must be non-negative multiples of 16 bytes, got {t.stride()}")
        if s >= _U32:
            _fail(ValueError, f"'{name}' stride {t.stride(axis)} (axis {axis}) must be below 2^32 bytes")
    if t.shape[row_axis] > 1 and strides[row_axis] < t.shape[-1] * e:
        _fail(ValueError, f"'{name}' rows may not overlap (seq stride >= head dim), got strides {t.stride()}")
    return strides


def _check_aligned(name: str, t: torch.Tensor) -> None:
    if t.data_ptr() % _ALIGN:
        _fail(ValueError, f"'{name}' data must be 16-byte aligned, got address {t.data_ptr():#x}")


def _fail_pairs(name: str, t: torch.Tensor):
    _fail(ValueError, f"'{name}' pairs must be contiguous and 4-byte aligned (even strides), got strides {t.stride()}")


def _span(t: torch.Tensor, axes) -> int:
    """Bytes from a slice's first element to past its last over the given axes."""
    e = t.element_size()
    return sum((t.shape[a] - 1) * _stride(t, a) * e for a in axes) + t.shape[-1] * e


def _fp8_kind(fp8: bool, q: torch.Tensor, k_cache: torch.Tensor, descales: dict, pairs: dict, data: bool) -> int:
    """0: 16-bit cache; 1: FP8 with per-tensor descales; 2: FP8 with per-token (scale, shift)
    pairs. Checks the scale arguments of the kind (both K and V, never both kinds)."""
    given = {n: t for n, t in {**descales, **pairs}.items() if t is not None}
    if not fp8:
        for name in given:
            _fail(ValueError, f"'{name}' is only for an FP8 (float8_e4m3fn) cache; this cache is {k_cache.dtype}")
        return 0
    if any(t is not None for t in descales.values()) and any(t is not None for t in pairs.values()):
        _fail(ValueError, "give per-tensor descales (k_descale, v_descale) or per-token pairs "
                          "(k_scale_shift, v_scale_shift), not both")
    chosen = pairs if any(t is not None for t in pairs.values()) else descales
    for name, t in chosen.items():
        if t is None:
            _fail(ValueError, f"'{name}' is required for a float8_e4m3fn cache (k_descale and v_descale, or "
                              f"k_scale_shift and v_scale_shift)")
        if not isinstance(t, torch.Tensor):
            _fail(TypeError, f"'{name}' must be a torch.Tensor, got {type(t).__name__}")
        if t.device != q.device:
            _fail(ValueError, f"'{name}' must be on q's device ({q.device}), got {t.device}")
        if chosen is descales:
            if t.dtype != torch.float32 or t.numel() != 1:
                _fail(TypeError, f"'{name}' must be one float32 element, got {t.dtype} of shape {tuple(t.shape)}")
            continue
        if t.dtype != torch.float16:
            _fail(TypeError, f"'{name}' dtype must be torch.float16 (scale, shift) pairs, got {t.dtype}")
        if tuple(t.shape) != tuple(k_cache.shape[:3]) + (2,):
            _fail(ValueError, f"'{name}' must be shaped like the cache's token dims plus 2: "
                              f"{tuple(k_cache.shape[:3]) + (2,)}, got {tuple(t.shape)}")
        if t.stride(3) != 1 or (data and t.data_ptr() % 4) or any(_stride(t, i) % 2 for i in range(3)):
            _fail_pairs(name, t)
        if any(_stride(t, i) * 2 >= _U32 for i in range(3)):
            _fail(ValueError, f"'{name}' strides must be below 2^32 bytes, got {t.stride()}")
    return 2 if chosen is pairs else 1


def _check_lse(lse, q: torch.Tensor) -> None:
    """The out= op's lse: float32, contiguous [batch, heads_q, seq_q], on q's device."""
    batch, seq_q, heads_q, _ = q.shape
    if not isinstance(lse, torch.Tensor):
        _fail(TypeError, f"'lse' must be a torch.Tensor or None, got {type(lse).__name__}")
    if lse.dtype != torch.float32 or tuple(lse.shape) != (batch, heads_q, seq_q) or not lse.is_contiguous():
        _fail(ValueError, f"'lse' must be a contiguous float32 [batch, heads_q, seq_q] = [{batch}, {heads_q}, "
                          f"{seq_q}], got {lse.dtype} shape {tuple(lse.shape)} strides {lse.stride()}")
    if lse.device != q.device:
        _fail(ValueError, f"'lse' must be on q's device ({q.device}), got {lse.device}")


def _validate(q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, k_scale_shift, v_scale_shift,
              softmax_scale, causal, window_left, sinks, num_splits, out, lse, return_lse, data=True) -> dict:
    """Every check of a call (arguments in the ops' order). Without `data` (the fake
    kernels: their tensors have no memory) only what metadata tells; with it also what
    the data does: pointers' alignment and overlaps, and the range of a CPU cache_seqlens."""
    descales = dict(k_descale=k_descale, v_descale=v_descale)
    pairs = dict(k_scale_shift=k_scale_shift, v_scale_shift=v_scale_shift)
    q = _tensor("q", q, 4, "[batch, seq_q, heads_q, head_dim]")
    if q.dtype not in DTYPES:
        _fail(TypeError, f"'q' dtype must be torch.bfloat16 or torch.float16, got {q.dtype}")
    given = (q, k_cache, v_cache, cache_seqlens, block_table, sinks, out, lse, *descales.values(), *pairs.values())
    # meta tensors throughout are a shape query, answered by the fake kernels (where the
    # dispatcher sends meta tensors); q alone on meta is a mistake like any other device
    if q.device.type not in ("cpu", "cuda") and not all(t.is_meta for t in given if isinstance(t, torch.Tensor)):
        _fail(ValueError, f"tensors must be on the CPU (emulator) or a ROCm gfx950 GPU, got {q.device}")
    batch, seq_q, heads_q, dim = q.shape
    if dim not in HEAD_DIMS:
        _fail(ValueError, f"'q' head dim must be 64 or 128, got {dim}")
    if not 1 <= seq_q <= MAX_SEQ_Q:
        _fail(ValueError, f"'q' seq_q must be in 1..{MAX_SEQ_Q}, got {seq_q}")
    paged = block_table is not None
    what = "[num_pages, page_size, heads_kv, head_dim]" if paged else "[batch, seq_max, heads_kv, head_dim]"
    k_cache = _tensor("k_cache", k_cache, 4, what)
    v_cache = _tensor("v_cache", v_cache, 4, what)
    fp8 = k_cache.dtype in _FP8
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != (E4M3 if fp8 else q.dtype):
            _fail(TypeError, f"'{name}' dtype must be q's ({q.dtype}) or torch.float8_e4m3fn (both caches alike), "
                             f"got {t.dtype}")
        if t.device != q.device:
            _fail(ValueError, f"'{name}' must be on q's device ({q.device}), got {t.device}")
    fp8 = _fp8_kind(fp8, q, k_cache, descales, pairs, data)
    if v_cache.shape != k_cache.shape:
        _fail(ValueError, f"'v_cache' shape must equal k_cache's {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    pages, page_size, heads_kv, kdim = k_cache.shape
    if kdim != dim:
        _fail(ValueError, f"'k_cache' head dim must equal q's ({dim}), got {kdim}")
    if heads_kv < 1 or heads_q % heads_kv:
        _fail(ValueError, f"heads of q must be a multiple of the cache's KV heads (Hq % Hkv == 0), "
                          f"got Hq={heads_q}, Hkv={heads_kv}")
    if not paged and pages != batch:
        _fail(ValueError, f"'k_cache' batch must equal q's ({batch}) for a contiguous cache, got {pages}")
    if paged:
        if page_size < MIN_PAGE or page_size & (page_size - 1):
            _fail(ValueError, f"'k_cache' page_size must be a power of two >= {MIN_PAGE}, got {page_size}")
        if pages < 1:
            _fail(ValueError, "'k_cache' must have at least one page")
        block_table = _tensor("block_table", block_table, 2, "[batch, max_pages] int32")
        if block_table.dtype != torch.int32:
            _fail(TypeError, f"'block_table' dtype must be torch.int32, got {block_table.dtype}")
        if block_table.shape[0] != batch or block_table.shape[1] < 1:
            _fail(ValueError, f"'block_table' must be [{batch}, max_pages >= 1], got {tuple(block_table.shape)}")
        if not block_table.is_contiguous():
            _fail(ValueError, f"'block_table' must be contiguous, got strides {block_table.stride()}")
        if block_table.device != q.device:
            _fail(ValueError, f"'block_table' must be on q's device ({q.device}), got {block_table.device}")
    cache_seqlens = _vector("cache_seqlens", cache_seqlens, torch.int32, batch, "[batch] int32", q.device)
    capacity = block_table.shape[1] * page_size if paged else page_size
    if data:
        _check_seqlens(cache_seqlens, block_table, page_size)
    q_strides = _check_rows("q", q, 1, data)
    k_strides = _check_rows("k_cache", k_cache, 1, data)
    v_strides = _check_rows("v_cache", v_cache, 1, data)
    if _span(q, (1, 2)) >= _MAX_OFFSET:
        _fail(ValueError, "'q' is too large: offsets within one batch entry must stay below 2^31 bytes")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if paged and page_size * _stride(t, 1) * t.element_size() > _stride(t, 0) * t.element_size() and pages > 1:
            _fail(ValueError, f"'{name}' pages may not overlap (page stride >= page_size x seq stride)")
        if page_size * _stride(t, 1) * t.element_size() >= _U32:
            _fail(ValueError, f"'{name}' one page (contiguous: one batch entry) must span < 2^32 bytes of rows")
        if (heads_kv - 1) * _stride(t, 2) * t.element_size() + 16 * _stride(t, 1) * t.element_size() >= _U32:
            _fail(ValueError, f"'{name}' head or seq strides too large (need < 2^32 bytes per 16 keys of all heads)")
    if not isinstance(causal, bool):
        _fail(TypeError, f"'causal' must be a bool, got {type(causal).__name__}")
    if isinstance(window_left, bool) or not isinstance(window_left, int) or window_left < -1:
        _fail(ValueError, f"'window_left' must be an int >= -1 (-1: no window), got {window_left!r}")
    if window_left >= NO_LIMIT:
        window_left = -1
    if sinks is not None:
        sinks = _vector("sinks", sinks, torch.float32, heads_q, "[heads_q] float32", q.device)
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int)
                                   or not 1 <= num_splits <= MAX_SPLITS):
        _fail(ValueError, f"'num_splits' must be an int in [1, {MAX_SPLITS}] or None, got {num_splits!r}")
    _check_return_lse(return_lse)
    if out is not None:
        if not isinstance(out, torch.Tensor):
            _fail(TypeError, f"'out' must be a torch.Tensor, got {type(out).__name__}")
        if out.shape != q.shape:
            _fail(ValueError, f"'out' shape must equal q's {tuple(q.shape)}, got {tuple(out.shape)}")
        if out.dtype != q.dtype:
            _fail(TypeError, f"'out' dtype must equal q's ({q.dtype}), got {out.dtype}")
        if out.device != q.device:
            _fail(ValueError, f"'out' must be on q's device ({q.device}), got {out.device}")
        _check_rows("out", out, 1, data)
        if _span(out, (1, 2)) >= _MAX_OFFSET:
            _fail(ValueError, "'out' is too large: offsets within one batch entry must stay below 2^31 bytes")
        refuse_internal_overlap("decode_attention", "out", out)
    if lse is not None:
        _check_lse(lse, q)
    if data:
        _refuse_overlaps(q, k_cache, v_cache, pairs, out, lse)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(dim)
    elif isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)) \
            or not math.isfinite(softmax_scale) or softmax_scale <= 0:
        _fail(ValueError, f"'softmax_scale' must be a finite float > 0, got {softmax_scale!r}")
    return dict(q=q, k=k_cache, v=v_cache, seqlens=cache_seqlens, block_table=block_table, paged=paged,
                capacity=capacity, window_left=window_left, fp8=fp8, sinks=sinks, scale=float(softmax_scale),
                q_strides=q_strides, k_strides=k_strides, v_strides=v_strides, causal=causal, num_splits=num_splits,
                descales=descales, pairs=pairs)


def _check_seqlens(cache_seqlens: torch.Tensor, block_table: torch.Tensor | None, page_size: int) -> None:
    """cache_seqlens within [0, capacity], where it is known on the host without a sync (CPU)."""
    if cache_seqlens.device.type != "cpu" or not cache_seqlens.numel():
        return
    lo, hi = int(cache_seqlens.min()), int(cache_seqlens.max())
    if lo < 0:
        _fail(ValueError, f"'cache_seqlens' must be >= 0, got {lo}")
    capacity = block_table.shape[1] * page_size if block_table is not None else page_size
    if hi > capacity:
        where = f"block_table holds {block_table.shape[1]} pages x {page_size}" if block_table is not None else \
            f"the cache holds {page_size} keys"
        _fail(ValueError, f"max(cache_seqlens) = {hi} exceeds the cache: {where}")


def _check_return_lse(return_lse) -> None:
    if not isinstance(return_lse, bool):
        _fail(TypeError, f"'return_lse' must be a bool, got {type(return_lse).__name__}")


def _refuse_overlaps(q, k_cache, v_cache, pairs: dict, out: torch.Tensor | None, lse: torch.Tensor | None) -> None:
    """Outputs given by the caller may not share memory with the inputs (nor lse with out)."""
    named = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)] + [(n, t) for n, t in pairs.items() if t is not None]
    inputs = tuple((n, t.data_ptr(), extent(t), False) for n, t in named)
    if out is not None:
        refuse_overlap("decode_attention", "out", out.data_ptr(), extent(out), inputs)
        inputs += (("out", out.data_ptr(), extent(out), False),)
    if lse is not None:
        refuse_overlap("decode_attention", "lse", lse.data_ptr(), extent(lse), inputs)


# ------------------------------------------------------------------ launch

FP8_SUFFIX = ("", "_fp8", "_fp8_ss")          # by FP8 kind: 16-bit, per-tensor descales, per-token pairs


def variant_name(kernel: str, dtype: torch.dtype, dim: int, fp8: int = 0) -> str:
    return f"{kernel}_d{dim}_{DTYPES[dtype]}{FP8_SUFFIX[fp8]}"


def _magic(divisor: int) -> int:
    return -(-2**31 // divisor)


def _new_lse(q: torch.Tensor) -> torch.Tensor:
    return torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)


class _Plan:
    """A checked call's launches, prepared but for the data pointers, with the tensors that
    stay the same from call to call (placeholders, a contiguous cache's page table) and
    the workspace sizes; a call with the same layouts and scalars reuses it."""
    __slots__ = ("launches", "fixed", "ws_numel", "page_size")

    def __init__(self, a: dict, out: torch.Tensor, lse: torch.Tensor | None):
        manifest = default_manifest()
        runs = _runs(a, out, lse)
        self.launches = tuple(prepare(manifest.kernel(kernel).variant(variant), args) for kernel, variant, args in runs)
        merged = {name: t for _, _, args in runs for name, t in args.items() if isinstance(t, torch.Tensor)}
        self.ws_numel = (merged["ws_o"].numel(), merged["ws_lse"].numel()) if len(runs) > 1 else None
        varying = _call_tensors(self, a["q"], a["k"], a["v"], a["seqlens"], a["block_table"], *a["descales"].values(),
                                *a["pairs"].values(), a["sinks"], out, lse)
        self.fixed = {name: t for name, t in merged.items() if name not in varying}     # holds no caller tensor
        self.page_size = a["k"].shape[1]


def _call_tensors(plan: _Plan, q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale,
                  k_scale_shift, v_scale_shift, sinks, out, lse) -> dict:
    """The launch tensors that change from call to call, by kernel argument name; the
    split-K workspace is new for each call."""
    t = dict(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens, o=out)
    optional = dict(block_table=block_table, lse=lse, sinks=sinks, k_scale_shift=k_scale_shift,
                    v_scale_shift=v_scale_shift)
    t.update((name, x) for name, x in optional.items() if x is not None)
    if k_descale is not None:
        t.update(k_descale=k_descale.reshape(1), v_descale=v_descale.reshape(1))
    if plan.ws_numel:
        t.update(ws_o=torch.empty(plan.ws_numel[0], dtype=torch.float32, device=q.device),
                 ws_lse=torch.empty(plan.ws_numel[1], dtype=torch.float32, device=q.device))
    return t


_PLANS: dict[tuple, _Plan] = {}
_MAX_PLANS = 4096                  # a bound on memory for callers that never repeat a layout


def _layout(t) -> tuple | None:
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def _run(q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, k_scale_shift, v_scale_shift,
         softmax_scale, causal, window_left, sinks, num_splits, out, lse) -> None:
    """Check and launch on given outputs (out, and lse unless None, are written). The
    first call of a layout checks everything in order and plans; a repeat checks only
    what the data can change (pointers, overlaps, a CPU cache_seqlens' range)."""
    tensors = (q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, k_scale_shift, v_scale_shift,
               sinks, out, lse)
    try:
        key = (tuple(_layout(t) for t in tensors), type(softmax_scale), softmax_scale, type(causal), causal,
               type(window_left), window_left, type(num_splits), num_splits, os.environ.get(BACKEND_ENV))
        plan_ = _PLANS.get(key)
    except (AttributeError, TypeError):       # not tensors, or unhashable: _validate says what is wrong
        key, plan_ = None, None
    if plan_ is None:
        a = _validate(q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, k_scale_shift,
                      v_scale_shift, softmax_scale, causal, window_left, sinks, num_splits, out, lse, lse is not None)
        plan_ = _Plan(a, out, lse)
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = plan_
    else:
        _check_seqlens(cache_seqlens, block_table, plan_.page_size)
        for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("out", out)):
            _check_aligned(name, t)
        for name, t in (("k_scale_shift", k_scale_shift), ("v_scale_shift", v_scale_shift)):
            if t is not None and t.data_ptr() % 4:
                _fail_pairs(name, t)
        _refuse_overlaps(q, k_cache, v_cache, dict(k_scale_shift=k_scale_shift, v_scale_shift=v_scale_shift), out,
                         lse)
    if not plan_.launches:
        return
    given = {**plan_.fixed, **_call_tensors(plan_, q, k_cache, v_cache, cache_seqlens, block_table, k_descale,
                                            v_descale, k_scale_shift, v_scale_shift, sinks, out, lse)}
    for launch in plan_.launches:
        launch(*(given[name] for name, _, _ in launch.pointers))


def _decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
                      block_table: torch.Tensor | None, k_descale: torch.Tensor | None,
                      v_descale: torch.Tensor | None, k_scale_shift: torch.Tensor | None,
                      v_scale_shift: torch.Tensor | None, softmax_scale: float | None, causal: bool,
                      window_left: int, sinks: torch.Tensor | None, num_splits: int | None,
                      return_lse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = _outputs(q, return_lse)
    _run(q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, k_scale_shift, v_scale_shift,
         softmax_scale, causal, window_left, sinks, num_splits, out, lse if return_lse else None)
    return out, lse


def _outputs(q, return_lse) -> tuple[torch.Tensor, torch.Tensor]:
    """The functional op's (out, lse); lse is empty unless return_lse."""
    _check_return_lse(return_lse)
    q = _tensor("q", q, 4, "[batch, seq_q, heads_q, head_dim]")
    lse = _new_lse(q) if return_lse else torch.empty(0, dtype=torch.float32, device=q.device)
    return torch.empty(q.shape, dtype=q.dtype, device=q.device), lse


def _decode_attention_fake(q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, k_scale_shift,
                           v_scale_shift, softmax_scale, causal, window_left, sinks, num_splits, return_lse):
    _validate(q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, k_scale_shift, v_scale_shift,
              softmax_scale, causal, window_left, sinks, num_splits, None, None, return_lse, data=False)
    return _outputs(q, return_lse)


def _decode_attention_out(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          cache_seqlens: torch.Tensor, block_table: torch.Tensor | None,
                          k_descale: torch.Tensor | None, v_descale: torch.Tensor | None,
                          k_scale_shift: torch.Tensor | None, v_scale_shift: torch.Tensor | None,
                          softmax_scale: float | None, causal: bool, window_left: int, sinks: torch.Tensor | None,
                          num_splits: int | None, out: torch.Tensor, lse: torch.Tensor | None) -> None:
    _run(q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, k_scale_shift, v_scale_shift,
         softmax_scale, causal, window_left, sinks, num_splits, out, lse)


def _decode_attention_out_fake(q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, k_scale_shift,
                               v_scale_shift, softmax_scale, causal, window_left, sinks, num_splits, out, lse) -> None:
    _validate(q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, k_scale_shift, v_scale_shift,
              softmax_scale, causal, window_left, sinks, num_splits, out, lse, lse is not None, data=False)


decode_attention_op = library.define("decode_attention", _decode_attention, _decode_attention_fake)
decode_attention_out_op = library.define("decode_attention_out", _decode_attention_out, _decode_attention_out_fake,
                                         mutates_args=("out", "lse"))


def decode_attention(q, k_cache, v_cache, cache_seqlens, *, block_table=None, k_descale=None, v_descale=None,
                     k_scale_shift=None, v_scale_shift=None, softmax_scale=None, causal=True, window_left=-1,
                     sinks=None, num_splits=None, out=None, return_lse=False):
    """Attention of q's new tokens over the KV cache; returns out, or (out, lse) with
    return_lse. See the module docstring for conventions and limits; runs
    torch.ops.gfxasm.decode_attention (or decode_attention_out when `out` is given)."""
    args = (q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, k_scale_shift, v_scale_shift,
            softmax_scale, causal, window_left, sinks, num_splits)
    if out is None:
        out, lse = decode_attention_op(*args, return_lse)
        return (out, lse) if return_lse else out
    _check_return_lse(return_lse)
    lse = _new_lse(_tensor("q", q, 4, "[batch, seq_q, heads_q, head_dim]")) if return_lse else None
    decode_attention_out_op(*args, out, lse)
    return (out, lse) if return_lse else out


def launches(q, k_cache, v_cache, cache_seqlens, *, block_table=None, k_descale=None, v_descale=None,
             k_scale_shift=None, v_scale_shift=None, softmax_scale=None, causal=True, window_left=-1, sinks=None,
             num_splits=None, out=None, return_lse=False) -> tuple[torch.Tensor, torch.Tensor | None, list]:
    """Validate and plan a call: (out, lse or None, [(kernel, variant, arguments), ...]) —
    the launches decode_attention runs, in order (bench/decode.py models the same ones)."""
    a = _validate(q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, k_scale_shift, v_scale_shift,
                  softmax_scale, causal, window_left, sinks, num_splits, out, None, return_lse)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = _new_lse(q) if return_lse else None
    return out, lse, _runs(a, out, lse)


def _runs(a: dict, out: torch.Tensor, lse: torch.Tensor | None) -> list:
    """The launches of a validated call on its outputs."""
    q, k, v = a["q"], a["k"], a["v"]
    batch, seq_q, heads_q, dim = q.shape
    heads_kv = k.shape[2]
    group = heads_q // heads_kv
    dev = q.device
    if not q.numel():
        return []
    p = plan(batch, heads_kv, seq_q * group, a["capacity"], a["num_splits"])
    partial = p.partial or a["sinks"] is not None
    if a["paged"]:
        table, shift, pages = a["block_table"], int(math.log2(k.shape[1])), k.shape[0]
    else:
        table, shift, pages = torch.arange(batch, dtype=torch.int32, device=dev).view(batch, 1), CONTIGUOUS_SHIFT, batch
    rows_total = batch * seq_q * heads_q
    ws_stride = rows_total * dim * 4
    if p.num_splits * ws_stride >= _MAX_OFFSET:
        _fail(ValueError, f"the split-K workspace ({p.num_splits} x {ws_stride} bytes) must stay below 2^31 bytes; "
                          f"pass a smaller num_splits")
    dummy = torch.empty(4, dtype=torch.float32, device=dev)
    if partial:
        ws_o = torch.empty(p.num_splits * rows_total * dim, dtype=torch.float32, device=dev)
        ws_lse = torch.empty(p.num_splits * rows_total, dtype=torch.float32, device=dev)
    else:
        ws_o = ws_lse = dummy
    lse_t = lse if lse is not None else dummy.view(1, 1, 4)
    e = q.element_size()
    o_bs, o_ss, o_hs = (_stride(out, i) * e for i in range(3))
    lse_bs, lse_hs = (lse.stride(0) * 4, lse.stride(1) * 4) if lse is not None else (0, 0)
    qs, ks, vs = a["q_strides"], a["k_strides"], a["v_strides"]
    window = NO_LIMIT if a["window_left"] < 0 else a["window_left"]
    per_tensor, per_token = a["fp8"] == 1, a["fp8"] == 2
    k_descale, v_descale = a["descales"].values()
    k_scale_shift, v_scale_shift = a["pairs"].values()
    no_pairs = torch.empty(1, 1, 1, 2, dtype=torch.float16, device=dev)
    ks_t, vs_t = (k_scale_shift, v_scale_shift) if per_token else (no_pairs, no_pairs)
    pair_strides = {f"{n}_{x}": _stride(t, i) * 2 for n, t in (("ks", ks_t), ("vs", vs_t))
                    for i, x in enumerate(("ps", "ss", "hs"))}
    # decode_attn bounds each block's descriptors at (valid keys) x (seq stride): a seq axis of
    # one key (S_max 1, which _stride gives as 0) passes its row's bytes, or the key reads as 0
    k_ss, v_ss = ks[1] or dim * k.element_size(), vs[1] or dim * v.element_size()
    pair_strides.update(ks_ss=pair_strides["ks_ss"] or 4, vs_ss=pair_strides["vs_ss"] or 4)
    runs = [(KERNEL, variant_name(KERNEL, q.dtype, dim, a["fp8"]), dict(
        q=q, k_cache=k, v_cache=v, cache_seqlens=a["seqlens"], block_table=table, o=out, lse=lse_t, ws_o=ws_o,
        ws_lse=ws_lse, k_descale=k_descale.reshape(1) if per_tensor else dummy,
        v_descale=v_descale.reshape(1) if per_tensor else dummy, k_scale_shift=ks_t, v_scale_shift=vs_t,
        **pair_strides, num_splits=p.num_splits, heads_kv=heads_kv, row_tiles=p.row_tiles, seq_q=seq_q,
        heads_q=heads_q, group=group, group_magic=_magic(group), tiles_magic=_magic(p.row_tiles),
        rows=seq_q * group, max_pages=table.shape[1], pages_m1=pages - 1, page_shift=shift,
        k_ps=ks[0], k_ss=k_ss, k_hs=ks[2], v_ps=vs[0], v_ss=v_ss, v_hs=vs[2],
        q_ss=qs[1], q_hs=qs[2], q_bs=qs[0], o_ss=o_ss, o_hs=o_hs, o_bs=o_bs, lse_hs=lse_hs, lse_bs=lse_bs,
        ws_stride=ws_stride, wsl_stride=rows_total * 4, chunk=p.chunk, window=window,
        future=0 if a["causal"] else NO_LIMIT, scale_log2=a["scale"] * LOG2E, partial=int(partial),
        store_lse=int(lse is not None)))]
    if partial:
        sinks_t = a["sinks"] if a["sinks"] is not None else dummy
        runs.append((MERGE, variant_name(MERGE, q.dtype, dim), dict(
            ws_o=ws_o, ws_lse=ws_lse, sinks=sinks_t, o=out, lse=lse_t, splits=p.num_splits, seq_q=seq_q,
            heads_q=heads_q, ws_stride=ws_stride, wsl_stride=rows_total * 4, o_ss=o_ss, o_hs=o_hs, o_bs=o_bs,
            lse_hs=lse_hs, lse_bs=lse_bs, has_sinks=int(a["sinks"] is not None), store_lse=int(lse is not None))))
    return runs


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


def reference(q, k_cache, v_cache, cache_seqlens, *, block_table=None, k_descale=None, v_descale=None,
              k_scale_shift=None, v_scale_shift=None, softmax_scale=None, causal=True, window_left=-1,
              sinks=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(O, LSE, O_abs) in float64: O [B, Sq, Hq, D], LSE [B, Hq, Sq] (natural log, the
    sink included), O_abs = P |V| (per-token pairs: P |fp8 * scale|; for `tolerance`).
    Rows that see no key (and no sink): O = 0, LSE = -inf."""
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
    for b in range(batch):
        n = int(cache_seqlens[b])
        kb = per_head(gather_kv(k_cache, b, n, block_table, k_descale, k_scale_shift))               # [Hq, n, D]
        vb = per_head(gather_kv(v_cache, b, n, block_table, v_descale, v_scale_shift))
        s = torch.matmul(q[b].double().transpose(0, 1), kb.transpose(1, 2)) * scale               # [Hq, Sq, n]
        qpos = n - seq_q + torch.arange(seq_q)[:, None]
        j = torch.arange(n)[None, :]
        visible = torch.ones(seq_q, n, dtype=torch.bool)
        if causal:
            visible &= j <= qpos
        if window_left >= 0:
            visible &= j >= qpos - window_left
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
        arguments exactly as decode_attention builds them."""
        dim = variant.defines["D"]
        dtype = torch.float16 if variant.defines["F16"] else torch.bfloat16
        fp8 = variant.defines["FP8"]
        batch, seq_q, heads_q, heads_kv, page, pages = 2, 2, 8, 2, 16, 12
        q = torch.randn(batch, seq_q, heads_q, dim, generator=gen).to(dtype)
        k = torch.randn(pages, page, heads_kv, dim, generator=gen).to(E4M3 if fp8 else dtype)
        v = torch.randn(pages, page, heads_kv, dim, generator=gen).to(E4M3 if fp8 else dtype)
        scales = {1: dict(k_descale=torch.tensor([0.75]), v_descale=torch.tensor([1.5])),
                  2: dict(k_scale_shift=random_pairs(k.shape, gen), v_scale_shift=random_pairs(v.shape, gen))}
        descales = scales.get(fp8, {})
        table = torch.randperm(pages, generator=gen).to(torch.int32).view(batch, pages // batch)
        seqlens = torch.tensor([37, 90], dtype=torch.int32)
        o = torch.full(q.shape, float("nan"), dtype=dtype)
        _, lse, runs = launches(q, k, v, seqlens, block_table=table, num_splits=1, out=o, return_lse=True, **descales)
        lse.fill_(float("nan"))
        o_ref, lse_ref, o_abs = reference(q, k, v, seqlens, block_table=table, **descales)
        atol = float(tolerance(o_ref, o_abs, dtype).max())
        return RunCase(args=runs[0][2], expected={"o": o_ref.float(), "lse": lse_ref.float()}, atol=atol,
                       rtol=LSE_TOL, note=f"paged 16, B{batch} Sq{seq_q} Hq{heads_q}/Hkv{heads_kv} seqlens 37, 90")

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
        e = o.element_size()
        args = dict(ws_o=ws_o.view(-1), ws_lse=ws_lse.view(-1), sinks=sinks, o=o, lse=lse, splits=splits,
                    seq_q=seq_q, heads_q=heads_q, ws_stride=rows * dim * 4, wsl_stride=rows * 4,
                    o_ss=o.stride(1) * e, o_hs=o.stride(2) * e, o_bs=o.stride(0) * e,
                    lse_hs=lse.stride(1) * 4, lse_bs=lse.stride(0) * 4, has_sinks=1, store_lse=1)
        atol = float(tolerance(o_ref, 0.0, dtype).max())
        return RunCase(args=args, expected={"o": o_ref.float(), "lse": lse_ref.float()}, atol=atol, rtol=LSE_TOL,
                       note=f"{splits} splits, B{batch} Sq{seq_q} Hq{heads_q}, sinks")


_register_run_cases()
