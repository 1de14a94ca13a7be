"""Batch prefill over a paged KV cache, head dim 128: `gfxasm.batch_prefill` on the
`batch_prefill_d128` kernel family (asm/fmha_fwd_d128.s with PAGED = 1).

    out = gfxasm.batch_prefill(q, k_cache, v_cache, qo_indptr, kv_indptr=..., kv_page_indices=...,
                               kv_last_page_len=..., causal=True)               # SGLang table
    out, lse = gfxasm.batch_prefill(q, k_cache, v_cache, qo_indptr, block_table=..., seqlens_k=...,
                                    return_lse=True)                            # vLLM table

- q `[total_q, Hq, 128]`; sequence b's queries are rows qo_indptr[b] .. qo_indptr[b+1]
  (int32 [B+1], flash-attention's cu_seqlens; qo_indptr[0] = 0, qo_indptr[B] = total_q).
- k_cache, v_cache `[num_pages, page_size, Hkv, 128]`, page_size a power of two 1..1024,
  Hq % Hkv == 0 (MHA, GQA, MQA); any strides with the head dim contiguous (16-byte
  multiples) whose pages lie a power-of-two multiple of page_size rows apart: a plain
  pool, K and V as views of one combined pool (flashinfer/SGLang `[pages, 2, page, Hkv,
  128]`, vLLM `[2, pages, page, Hkv, 128]`), the HND layout `[pages, Hkv, page, 128]`
  permuted to `[pages, page, Hkv, 128]` (a power-of-two Hkv). No copy is made: the kernel
  addresses slot r of page p at row p * page_size * 2^k + r times the row stride (64-bit
  products; the row index p * page_size * 2^k + r must stay below 2^32).
- Exactly one page table: SGLang's (kv_indptr [B+1] cumulative page counts,
  kv_page_indices, kv_last_page_len [B] in 1..page_size for a sequence with pages;
  seqlen_k = (pages - 1) * page_size + last) or vLLM's (block_table [B, max_blocks],
  seqlens_k [B]). Both become one form for the kernel: a flat int32 page list, each
  sequence's first entry in it (kv_start) and seqlen_k.
- bf16 or fp16 q/k/v give the same dtype out. float8_e4m3fn q/k/v give bf16 out, with
  per-tensor float32 descales q_descale, k_descale, v_descale (one element each, default
  1; finite, in 2^-62 .. 2^62) and softmax_scale >= 0: the kernel keeps scores in raw
  units, so their order must not flip, and forms c = softmax_scale log2(e) q_descale
  k_descale and 8 / c in f32, so c must come out nonzero and finite there (a zero,
  subnormal or infinite descale, or softmax_scale 0, would make rows NaN), and c times the
  largest K block scale below 2^103, so that a scaled score (a raw e4m3 score reaches
  2^25) fits f32. Descales are
  checked in CPU tensors; on a GPU they are not (reading one would synchronise). P is
  rounded to e4m3 for the P.V product (the row sum uses unrounded P); `fp8_p_bound` gives
  the error that allows.
- kv_block_descale (FP8): float32 [num_pages, Hkv, 2], the (k, v) scale of each physical
  page and KV head, instead of k_descale / v_descale (q_descale stays per-tensor); scales
  in 2^-62 .. 2^62 for the pages the tables use (checked on the CPU only; a pool page no
  table names is never read, so its scales may hold anything); any page size.
  page_size >= 64 (a 64-key tile in one page) runs the `_blk` variants: one (k, v) pair
  per tile. Smaller pages run the `_blks` variants: the scales vary per key, so k
  multiplies each score, and v each P element before its e4m3 rounding, relative to U, the
  tile's largest v scale rounded up to a power of two (P' = P v / U <= P stays in range; O
  is carried in U units and rescaled only where U changes). A P' below 2^-6 is an e4m3
  subnormal: the rounding error of a key whose v scale is far below its tile's largest
  grows by U / v (`fp8_p_bound`'s v_ratio).
  Per-key scaling costs VALU work and LDS scale reads per tile (bench/prefill.py models it).
- causal: query i of a sequence sees key j iff j <= i + seqlen_k - seqlen_q (bottom-right).
  A query that sees no key (seqlen_k = 0, or causal with seqlen_q > seqlen_k) gets O = 0
  and LSE = -inf; seqlen_q = 0 is legal. A NaN in a query or in a key it sees makes that
  row's O and LSE NaN (IEEE; `reference` agrees); a NaN in K that the causal mask hides
  from a row does not reach it, one in V can (0 * NaN).
- window_size, sinks, softcap: as `gfxasm.fmha_fwd` (loader/ops/fmha.py), per sequence
  (query i of a sequence at key position i + seqlen_k - seqlen_q). Windows and sinks in
  every dtype (FP8 included); softcap for bf16/fp16 only (refused for FP8).
- LSE `[Hq, total_q]` float32, natural log of the sum of exp(scaled scores).
- `out` (optional): q's shape, q's dtype (bf16 for FP8), 16-byte rows; it may not share
  memory with any input (refused, no in-place form).

The kernel reads, per lane, the page entry of its K/V row with the row index clamped to
seqlen_k - 1 (branchless: no entry past a sequence's list is read; the keys past seqlen_k
in the last 64-key tile read a valid row of K that the mask then hides, and V = 0, so they
weigh exactly 0 whatever the last key holds), and forms 64-bit addresses
(page * page_size + slot) * row stride, so the pool may exceed 4 GiB; page * page_size +
slot must stay below 2^32. Checked on the host before launch: every tensor (index
tensors and outputs included) on q's device, dtypes, shapes, strides (16-byte rows; pages
a power-of-two multiple of page_size rows apart), both or neither table kind, page size; and,
for index tensors on the CPU, qo_indptr / kv_indptr monotonic and consistent with total_q
and the page list, kv_last_page_len in range, seqlens_k within the table, and every page
id the sequences use within the pool. For index tensors on a GPU only their shapes and
dtypes are checked (reading them would synchronise); out-of-range page ids there are
undefined behaviour, as is a qo_indptr there that does not end at total_q. The grid's x is
cdiv(max seqlen_q, 256): with at most 256 queries in all it is 1 (qo_indptr ends at total_q,
so no sequence has more), known from q's shape without a read, so such calls (decode steps,
small chunks) never synchronise; past that max seqlen_q is read from qo_indptr (a
synchronisation when qo_indptr lives on a GPU).

torch ops (declared on loader/ops/framework.py): gfxasm::batch_prefill (functional,
returns out), gfxasm::batch_prefill_with_lse (returns (out, lse)) and
gfxasm::batch_prefill_out (out, lse mutated). Their fake kernels run every check but the data ones (meta tensors,
torch.compile). The launch is planned once per tensor layout and max seqlen_q (the grid
depends on it); every call reads its own page table, descales and block scales, and on
CPU tensors reruns the checks of their contents.
"""
from __future__ import annotations

import math
import operator
import struct
from dataclasses import dataclass

import torch

from ..gridexpr import cdiv, magic_u32
from ..launcher import prepare
from ..manifest import Variant, default_manifest
from . import fmha, fp8_query, framework

HEAD_DIM = 128
Q_TILE = 256
KV_TILE = 64
KERNEL = "batch_prefill_d128"
# The kernel of each supported head dim (HEAD_DIM defined per kernel in kernels.yaml); head dim 64
# is built for bfloat16/float16 only. 256 is not built (loader/ops/fmha.py says why).
KERNELS = {64: "batch_prefill_d64", HEAD_DIM: KERNEL}
DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float8_e4m3fn: "fp8"}
FP8 = torch.float8_e4m3fn
LOG2E = 1.4426950408889634
MAX_PAGE_SIZE = 1024
BLOCK_SCALE_MIN_PAGE = 64          # kv_block_descale: one (k, v) pair per 64-key tile from here, per key below
SCALE_RANGE = (2.0**-62, 2.0**62)  # descales and kv_block_descale (their checks say why)
_SCORE_SCALE_LIMIT = 2.0**103      # c times a K scale, times a raw e4m3 score (< 2^25), fits f32
_U32 = 2**32
_MAX_SPAN = 2**31                  # Q/O rows of a sequence: 32-bit buffer offsets
_MAX_HEADS = 2**16
_F32 = struct.Struct("<f")
NAME = "batch_prefill"
_Q = "[total_q, heads_q, head_dim]"
_CACHE = "[num_pages, page_size, heads_k, head_dim]"
_SGLANG = ("kv_indptr", "kv_page_indices", "kv_last_page_len")
_VLLM = ("block_table", "seqlens_k")
_DESCALES = ("q_descale", "k_descale", "v_descale")


def variant(dtype: torch.dtype, causal: bool, block_scales: bool = False, page_size: int = MAX_PAGE_SIZE,
            window: bool = False, softcap: bool = False, head_dim: int = HEAD_DIM) -> Variant:
    """The kernel variant, chosen by the source's defines: block scales below
    BLOCK_SCALE_MIN_PAGE take the per-key BLKS one; `window`: the sliding-window variant
    (fmha.windowed); `softcap`: the soft-capping one; `head_dim` picks the kernel."""
    return default_manifest().kernel(KERNELS[head_dim]).variant_with(
        F16=dtype == torch.float16, FP8=dtype == FP8, BLK=block_scales,
        BLKS=block_scales and page_size < BLOCK_SCALE_MIN_PAGE, FMHA_CAUSAL=causal, WINDOW=window, SOFTCAP=softcap)


def out_dtype(dtype: torch.dtype) -> torch.dtype:
    """FP8 inputs give bf16 out; bf16/fp16 give their own dtype."""
    return torch.bfloat16 if dtype == FP8 else dtype


# ------------------------------------------------------------------ checks

def _index(call, name: str, length: int | None = None) -> torch.Tensor:
    """An int32 vector index tensor, of `length` entries when given."""
    t = call.tensor(name, 1, "an int32 vector")
    if t.dtype != torch.int32:
        call.fail(TypeError, f"'{name}' dtype must be torch.int32, got {t.dtype}")
    if length is not None and t.shape[0] != length:
        call.fail(ValueError, f"'{name}' must have {length} entries, got {t.shape[0]}")
    return t


def _head_dim(call, q: torch.Tensor) -> int:
    """q's head dim, one a kernel is built for in q's dtype."""
    if q.shape[-1] not in tuple(KERNELS):         # (a tuple: a traced SymInt compares, it does not hash)
        supported = " or ".join(map(str, sorted(KERNELS)))
        call.fail(ValueError, f"'q' head dim must be {supported}, got {q.shape[-1]} (shape {tuple(q.shape)})")
    if q.dtype == FP8 and q.shape[-1] != HEAD_DIM:
        call.fail(ValueError, f"'q' head dim must be {HEAD_DIM} for float8_e4m3fn inputs (head dim {q.shape[-1]} is "
                              f"built for bfloat16/float16), got {q.shape[-1]}")
    return next(d for d in KERNELS if q.shape[-1] == d)     # an int, also for a traced SymInt


def _rows(call, name: str, t: torch.Tensor, dims: tuple[int, ...], head_dim: int) -> None:
    """Head dim q's, contiguous; the strides of `dims` multiples of 16 bytes and below 2^32 bytes."""
    if t.shape[-1] != head_dim:
        call.fail(ValueError, f"'{name}' head dim must equal q's ({head_dim}), got {t.shape[-1]} "
                              f"(shape {tuple(t.shape)})")
    if t.numel() == 0:
        return
    if t.stride(-1) != 1:
        call.fail(ValueError, f"'{name}' must be contiguous in the head dim (stride 1), got strides {t.stride()}")
    for axis in dims:
        stride = t.stride(axis) * t.element_size() if t.shape[axis] > 1 else 0
        if stride % 16 or stride >= _U32:
            call.fail(ValueError, f"'{name}' stride of dim {axis} must be a multiple of 16 bytes below 2^32, got "
                                  f"{stride} bytes (strides {t.stride()})")


def _row_stride(call, name: str, cache: torch.Tensor) -> tuple[int, int]:
    """(bytes between a page's consecutive rows, log2 of the page stride in rows over
    page_size): the kernel addresses slot r of page p at row p * page_size * 2^that + r. A
    plain pool has 0; K or V as a view of a combined pool ([pages, 2, page, Hkv, D]: 1) or the
    HND layout permuted ([pages, Hkv, page, D]: log2 Hkv) a power-of-two multiple."""
    pages, page_size = cache.shape[0], cache.shape[1]
    e = cache.element_size()
    if page_size == 1:
        return (cache.stride(0) * e if pages > 1 else cache.shape[3] * e), 0
    row = cache.stride(1)
    if pages == 1:
        return row * e, 0
    ratio = cache.stride(0) // (page_size * row) if row > 0 and cache.stride(0) % (page_size * row) == 0 else 0
    if ratio < 1 or ratio & (ratio - 1):
        call.fail(ValueError, f"'{name}' pages must lie a power-of-two multiple of page_size rows apart (stride(0) == "
                              f"2^k * page_size * stride(1): a plain pool, K/V views of a combined pool, the HND layout "
                              f"with a power-of-two head count), got strides {cache.stride()}")
    return row * e, ratio.bit_length() - 1


def _in_range(call, name: str, smallest: float, largest: float, why: str) -> None:
    """Scales from `smallest` to `largest` within SCALE_RANGE (a NaN fails the comparisons)."""
    if not SCALE_RANGE[0] <= smallest <= largest <= SCALE_RANGE[1]:
        call.fail(ValueError, f"'{name}' must be finite and > 0, within 2^-62 .. 2^62 ({why})")


def _check_descales(call, fp8: bool) -> None:
    """Per-tensor descales: FP8 only, float32 of one element (their values: `_descale_values`)."""
    given = [n for n in _DESCALES if call.values[n] is not None]
    if call.kv_block_descale is not None and ("k_descale" in given or "v_descale" in given):
        call.fail(ValueError, "pass per-tensor k_descale/v_descale or kv_block_descale, not both")
    if not fp8 and call.kv_block_descale is not None:
        call.fail(ValueError, f"kv_block_descale applies to float8_e4m3fn inputs only; q is {call.q.dtype}")
    if not fp8:
        if given:
            call.fail(ValueError, f"descales apply to float8_e4m3fn inputs only; q is {call.q.dtype} (got "
                                  f"{', '.join(given)})")
        return
    for name in given:
        t = call.values[name]
        if not isinstance(t, torch.Tensor):
            call.fail(TypeError, f"'{name}' must be a float32 tensor of one element, got {type(t).__name__}")
        if t.dtype != torch.float32 or t.numel() != 1:
            call.fail(ValueError, f"'{name}' must be a float32 tensor of one element, got {t.dtype} shape "
                                  f"{tuple(t.shape)}")


def _descale_values(call) -> None:
    """The given descales' values in SCALE_RANGE (a readable FP8 call whose `_check_descales`
    passed). q, k: the kernel forms c = softmax_scale log2(e) q_descale k_descale and 8 / c in
    f32, NaN rows for a zero, subnormal, infinite or NaN descale; v: O = v_descale P V / l,
    NaN for an infinite or NaN one. One range for the three, kv_block_descale's."""
    for name in _DESCALES:
        t = call.values[name]
        if t is not None:
            value = float(t)
            _in_range(call, name, value, value, f"the kernel multiplies by it and divides by q_descale k_descale in "
                                                f"f32; got {value}")


def _check_block_scales(call, k_cache: torch.Tensor) -> None:
    """kv_block_descale: float32 contiguous [num_pages, Hkv, 2] (k, v) (its values:
    `_block_scale_values`)."""
    t = call.kv_block_descale
    num_pages, _, heads_k, _ = k_cache.shape
    if not isinstance(t, torch.Tensor):
        call.fail(TypeError, f"'kv_block_descale' must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32 or tuple(t.shape) != (num_pages, heads_k, 2) or not t.is_contiguous():
        call.fail(ValueError, f"'kv_block_descale' must be a contiguous float32 [num_pages, Hkv, 2] = [{num_pages}, "
                              f"{heads_k}, 2], got {t.dtype} shape {tuple(t.shape)} strides {t.stride()}")
    if num_pages * heads_k * 8 >= _U32:
        call.fail(ValueError, f"kv_block_descale spans {num_pages * heads_k * 8} bytes; the kernel's offset is 32-bit")


def _block_scale_values(call, used: torch.Tensor | list[int]) -> float:
    """The scales of the pages the table uses (`used`) in SCALE_RANGE (a readable call whose
    `_check_block_scales` passed). The launch reads no other page's scales, so a pool page no
    table names may hold anything. Returns the largest K scale of those pages (1 for none)."""
    if not len(used):
        return 1.0
    scales = call.kv_block_descale[used]
    smallest, largest = torch.aminmax(scales)
    _in_range(call, "kv_block_descale", float(smallest), float(largest),
              "O is rescaled by ratios of v scales, formed by exponent arithmetic")
    return float(scales[..., 0].max())


def _decreases(values: list[int]) -> bool:
    return any(a > b for a, b in zip(values, values[1:]))


def _check_page_ids(call, name: str, used: torch.Tensor | list[int], num_pages: int) -> None:
    if len(used):
        low, high = (min(used), max(used)) if isinstance(used, list) else (int(x) for x in torch.aminmax(used))
        if low < 0 or high >= num_pages:
            call.fail(ValueError, f"'{name}' holds page ids outside the pool 0..{num_pages - 1} (min {low}, max "
                                  f"{high})")


def _check_table(call, batch: int) -> None:
    """The call's one page table: which kind, and its tensors' metadata (its contents:
    `_table_contents`)."""
    sglang = [call.values[n] is not None for n in _SGLANG]
    vllm = [call.values[n] is not None for n in _VLLM]
    if any(sglang) and any(vllm):
        call.fail(ValueError, "pass one page table: SGLang's (kv_indptr, kv_page_indices, kv_last_page_len) or "
                              "vLLM's (block_table, seqlens_k), not both")
    if any(sglang):
        if not all(sglang):
            call.fail(ValueError, "the SGLang page table needs all of kv_indptr, kv_page_indices and kv_last_page_len")
        return _check_sglang(call, batch)
    if any(vllm):
        if not all(vllm):
            call.fail(ValueError, "the vLLM page table needs both block_table and seqlens_k")
        return _check_vllm(call, batch)
    call.fail(ValueError, "a page table is required: SGLang's (kv_indptr, kv_page_indices, kv_last_page_len) or "
                          "vLLM's (block_table, seqlens_k)")


def _table_contents(call, batch: int, page_size: int, num_pages: int) -> torch.Tensor | list[int]:
    """The page table's contents (a readable call whose `_check_table` passed): returns the
    page ids its sequences use."""
    if call.kv_indptr is not None:
        return _sglang_contents(call, batch, page_size, num_pages)
    return _vllm_contents(call, batch, page_size, num_pages)


def _check_sglang(call, batch: int) -> None:
    _index(call, "kv_indptr", batch + 1)
    _index(call, "kv_page_indices")
    _index(call, "kv_last_page_len", batch)


def _sglang_contents(call, batch: int, page_size: int, num_pages: int) -> torch.Tensor | list[int]:
    pages = call.kv_page_indices
    if not batch:
        return []
    # (host reads: cheaper than tensor ops at these sizes)
    indptr, lasts = call.kv_indptr.tolist(), call.kv_last_page_len.tolist()
    if indptr[0] < 0 or _decreases(indptr) or indptr[-1] > pages.shape[0]:
        call.fail(ValueError, f"'kv_indptr' must start >= 0, never decrease and end <= len(kv_page_indices) = "
                              f"{pages.shape[0]}, got {indptr[:8]}")
    for b in range(batch):
        if indptr[b + 1] > indptr[b] and not 1 <= lasts[b] <= page_size:
            call.fail(ValueError, f"'kv_last_page_len' must be in 1..page_size ({page_size}) for a sequence with "
                                  f"pages, got {lasts[b]} for sequence {b}")
    used = pages[indptr[0]:indptr[-1]]                            # (monotonic: the sequences' lists back to back)
    _check_page_ids(call, "kv_page_indices", used, num_pages)
    return used


def _check_vllm(call, batch: int) -> None:
    table = call.tensor("block_table", 2, "int32 [batch, max_blocks]")
    if table.dtype != torch.int32:
        call.fail(TypeError, f"'block_table' dtype must be torch.int32, got {table.dtype}")
    if table.shape[0] != batch:
        call.fail(ValueError, f"'block_table' must have batch = {batch} rows, got {table.shape[0]}")
    if table.shape[1] > 1 and table.stride(1) != 1:
        call.fail(ValueError, f"'block_table' rows must be contiguous, got strides {table.stride()}")
    _index(call, "seqlens_k", batch)


def _vllm_contents(call, batch: int, page_size: int, num_pages: int) -> torch.Tensor | list[int]:
    table, seqlens_k = call.block_table, call.seqlens_k
    if not batch:
        return []
    lengths = seqlens_k.tolist()
    if min(lengths) < 0 or max(lengths) > table.shape[1] * page_size:
        call.fail(ValueError, f"'seqlens_k' must be in 0..max_blocks * page_size = {table.shape[1] * page_size}, "
                              f"got {lengths[:8]}")
    used = _used_entries(table, seqlens_k, lengths, page_size)
    _check_page_ids(call, "block_table", used, num_pages)
    return used


_HOST_TABLE = 4096      # entries of a block table read on the host rather than masked by tensor ops


def _used_entries(table: torch.Tensor, seqlens_k: torch.Tensor, lengths: list[int], page_size: int
                  ) -> torch.Tensor | list[int]:
    """The page ids a vLLM block table's sequences use: entry j of row b iff j * page_size <
    seqlens_k[b] (entries past a list are never read). A small table is read on the host
    (a decode step's: ~3 us, where the tensor mask costs ~25 us), a large one masked."""
    if table.numel() <= _HOST_TABLE:
        return [page for row, n in zip(table.tolist(), lengths) for page in row[:-(-n // page_size)]]
    return table[torch.arange(table.shape[1]) * page_size < seqlens_k[:, None]]


def _check_out(call, q: torch.Tensor) -> None:
    out = call.out
    if not isinstance(out, torch.Tensor):
        call.fail(TypeError, f"'out' must be a torch.Tensor, got {type(out).__name__}")
    if out.shape != q.shape:
        call.fail(ValueError, f"'out' shape must equal q's {tuple(q.shape)}, got {tuple(out.shape)}")
    if out.dtype != out_dtype(q.dtype):
        call.fail(TypeError, f"'out' dtype must be {out_dtype(q.dtype)} for {q.dtype} inputs, got {out.dtype}")
    _rows(call, "out", out, (0, 1), q.shape[-1])


def _check_lse(call, q: torch.Tensor) -> None:
    lse = call.lse
    if not isinstance(lse, torch.Tensor):
        call.fail(TypeError, f"'lse' must be a torch.Tensor or None, got {type(lse).__name__}")
    if lse.dtype != torch.float32 or tuple(lse.shape) != (q.shape[1], q.shape[0]) or not lse.is_contiguous():
        call.fail(ValueError, f"'lse' must be a contiguous float32 [heads_q, total_q] = [{q.shape[1]}, {q.shape[0]}], "
                              f"got {lse.dtype} shape {tuple(lse.shape)} strides {lse.stride()}")


def _softmax_scale(call) -> float:
    value = call.softmax_scale
    if value is None:
        return 1.0 / math.sqrt(call.q.shape[-1])
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        call.fail(TypeError, f"'softmax_scale' must be a float, got {type(value).__name__}")
    if not math.isfinite(value):
        call.fail(ValueError, f"'softmax_scale' must be finite, got {value}")
    return float(value)


_SCORE_FACTORS = ("q_descale", "k_descale")


def _check_score_sign(call, scale: float) -> None:
    """FP8: the kernel keeps scores in raw units and scales them by c = softmax_scale log2(e)
    q_descale k_descale (`_check_score_scale`), so softmax_scale must be >= 0 (the scores'
    order)."""
    if scale < 0:
        call.fail(ValueError, f"'softmax_scale' must be >= 0 for float8_e4m3fn inputs (the kernel keeps scores in "
                              f"raw units and orders them by their sign), got {scale}")


def _score_factors(call) -> list:
    """The descale tensors given among q_descale, k_descale (c's factors)."""
    return [call.values[n] for n in _SCORE_FACTORS if call.values[n] is not None]


def _check_score_scale(call, scale: float, largest_k_scale: float) -> None:
    """FP8: c = softmax_scale log2(e) q_descale k_descale, formed in f32 in that order, and
    8 / c (the lazy-rescale threshold) must be neither 0 nor inf, which make rows NaN. A raw
    e4m3 score reaches 448^2 * 128 < 2^25, so c times the largest K block scale must stay
    below 2^103 for a scaled score to fit f32 (past it, rows come out NaN). Reads the
    descales' values: checked where they are readable (or none is given)."""
    c = _f32(scale * LOG2E)
    for t in _score_factors(call):       # the kernel's order; a product of two f32 values is exact in a double
        c = _f32(float(t) * c)
    if not 0 < c < math.inf:
        call.fail(ValueError, f"'softmax_scale' * log2(e) * q_descale * k_descale must be a nonzero finite float32 "
                              f"for float8_e4m3fn inputs (the kernel divides by it), got {c} in float32")
    if c * largest_k_scale >= _SCORE_SCALE_LIMIT:
        call.fail(ValueError, f"'softmax_scale' * log2(e) * q_descale * k_descale * (the largest K kv_block_descale) "
                              f"must stay below 2^103 for float8_e4m3fn inputs (a raw e4m3 score reaches 2^25 and the "
                              f"scaled score must fit float32), got {c * largest_k_scale:.3g}")


def _f32(x: float) -> float:
    """`x` rounded to float32 (to +-inf past its range), as f32 arithmetic rounds."""
    try:
        return _F32.unpack(_F32.pack(x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


@dataclass(frozen=True)
class _Checked:
    """What the checks derive from a call: its variant and the launch scalars its layouts fix."""
    variant: Variant
    scale: float
    window: tuple[int, int]
    softcap: float
    k_seq_stride: int
    v_seq_stride: int
    page_ratio_log2: int           # log2 (page stride / (page_size * row stride)), K's and V's
    total_q: int                   # q's rows


def _check_attention(call) -> tuple[int, int, int, int]:
    """q and the caches: dtypes, shapes, strides; returns the head dim (`_head_dim`), the
    caches' row strides (bytes) and log2 of their page stride over page_size rows
    (`_row_stride`)."""
    q = call.tensor("q", 3, _Q)
    k_cache = call.tensor("k_cache", 4, _CACHE)
    v_cache = call.tensor("v_cache", 4, _CACHE)
    if q.dtype not in DTYPES:
        call.fail(TypeError, f"'q' dtype must be torch.bfloat16, torch.float16 or torch.float8_e4m3fn, got {q.dtype}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype:
            call.fail(TypeError, f"'{name}' dtype must equal q's ({q.dtype}), got {t.dtype}")
    if not isinstance(call.causal, bool):
        call.fail(TypeError, f"'causal' must be a bool, got {type(call.causal).__name__}")
    if k_cache.shape != v_cache.shape:
        call.fail(ValueError, f"'v_cache' shape must equal k_cache's {tuple(k_cache.shape)}, got "
                              f"{tuple(v_cache.shape)}")
    total_q, heads_q, _ = q.shape
    num_pages, page_size, heads_k, _ = k_cache.shape
    if page_size < 1 or page_size > MAX_PAGE_SIZE or page_size & (page_size - 1):
        call.fail(ValueError, f"page_size (k_cache dim 1) must be a power of two in 1..{MAX_PAGE_SIZE}, got "
                              f"{page_size}")
    if heads_k < 1 or heads_q % heads_k:
        call.fail(ValueError, f"heads of q must be a multiple of the cache's heads (Hq % Hkv == 0), got Hq={heads_q}, "
                              f"Hkv={heads_k}")
    if heads_q >= _MAX_HEADS:
        call.fail(ValueError, f"heads_q must be below {_MAX_HEADS}, got {heads_q}")
    head_dim = _head_dim(call, q)
    _rows(call, "q", q, (0, 1), head_dim)
    _rows(call, "k_cache", k_cache, (0, 1, 2), head_dim)
    _rows(call, "v_cache", v_cache, (0, 1, 2), head_dim)
    (k_row, k_ratio), (v_row, v_ratio) = _row_stride(call, "k_cache", k_cache), _row_stride(call, "v_cache", v_cache)
    if k_ratio != v_ratio:
        call.fail(ValueError, f"'v_cache' pages must lie as many rows apart as k_cache's (page stride / (page_size * "
                              f"row stride) {2**v_ratio} vs {2**k_ratio}): strides {v_cache.stride()} and "
                              f"{k_cache.stride()}")
    if num_pages * page_size << k_ratio > _U32:
        call.fail(ValueError, f"the pool spans {num_pages * page_size << k_ratio} row slots; the kernel's slot index "
                              f"is 32-bit")
    if total_q and q.stride(0) * q.element_size() * total_q >= _MAX_SPAN:
        call.fail(ValueError, f"'q' rows span {q.stride(0) * q.element_size() * total_q} bytes; the kernel needs < "
                              f"2^31")
    return head_dim, k_row, v_row, k_ratio


def _check(call) -> _Checked:
    """Everything the metadata can tell, and the index tensors' and scales' contents where
    they are readable (a real call on CPU tensors: `_check_contents`)."""
    head_dim, k_seq_stride, v_seq_stride, page_ratio_log2 = _check_attention(call)
    q, k_cache = call.q, call.k_cache
    scale = _softmax_scale(call)
    qo_indptr = call.tensor("qo_indptr", 1, "int32 [batch + 1]")
    if qo_indptr.shape[0] < 1:
        call.fail(ValueError, "'qo_indptr' must have batch + 1 >= 1 entries, got 0")
    _index(call, "qo_indptr")
    _check_table(call, qo_indptr.shape[0] - 1)
    fp8 = q.dtype == FP8
    _check_descales(call, fp8)
    block_scales = fp8 and call.kv_block_descale is not None
    if block_scales:
        _check_block_scales(call, k_cache)
    if fp8:
        _check_score_sign(call, scale)
        if not _score_factors(call):        # (c is known without reading a tensor)
            _check_score_scale(call, scale, 1.0)
    if fmha.readable(call):
        _check_contents(call, scale)
    window = fmha.check_window(call)
    softcap = fmha.check_softcap(call)
    fmha.check_sinks(call, q.shape[1])
    if call.out is not None:
        _check_out(call, q)
    if call.lse is not None:
        _check_lse(call, q)
    if softcap and fp8:
        call.fail(ValueError, f"'softcap' applies to bfloat16/float16 inputs only; q is {q.dtype}")
    chosen = variant(q.dtype, call.causal, block_scales, k_cache.shape[1], fmha.windowed(call.causal, window),
                     softcap > 0, head_dim)
    return _Checked(chosen, scale, window, softcap, k_seq_stride, v_seq_stride, page_ratio_log2, q.shape[0])


def _check_contents(call, scale: float) -> None:
    """The checks of tensor contents (a readable call whose metadata passed `_check`): the
    page table, qo_indptr, the descales and block scales; every call makes them, and only
    them (its layout's metadata checks ran once)."""
    q, k_cache, qo_indptr = call.q, call.k_cache, call.qo_indptr
    batch = qo_indptr.shape[0] - 1
    used = _table_contents(call, batch, k_cache.shape[1], k_cache.shape[0])
    total_q, indptr = q.shape[0], qo_indptr.tolist()
    if indptr[0] != 0 or _decreases(indptr) or indptr[-1] != total_q:
        call.fail(ValueError, f"'qo_indptr' must start at 0, never decrease and end at total_q = {total_q}, got "
                              f"{indptr[:8]}{'...' if batch > 7 else ''} ending at {indptr[-1]}")
    if q.dtype != FP8:
        return
    _descale_values(call)
    block_scales = call.kv_block_descale is not None
    largest_k_scale = _block_scale_values(call, used) if block_scales else 1.0
    if block_scales or _score_factors(call):        # (else `_check` found c as it is)
        _check_score_scale(call, scale, largest_k_scale)


# ------------------------------------------------------------------ the launch

def _page_table(call, batch: int, page_size: int, device, kv_start: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(page_list, kv_start, seqlen_k), the one form the kernel reads, from the checked
    call's table (tensor arithmetic only: nothing is read back from a GPU). A vLLM table's
    kv_start follows from its layout alone: `kv_start`, where the caller made it before."""
    if call.kv_indptr is not None:
        kv_indptr, pages, last = call.kv_indptr, call.kv_page_indices, call.kv_last_page_len
        counts = kv_indptr[1:] - kv_indptr[:-1]
        seqlen_k = torch.where(counts > 0, (counts - 1) * page_size + last, 0)
        return pages if pages.numel() else torch.zeros(1, dtype=torch.int32, device=device), \
            kv_indptr[:-1].contiguous(), seqlen_k
    table = call.block_table
    row = table.stride(0) if batch > 1 else table.shape[1]
    span = (batch - 1) * row + table.shape[1] if table.numel() else 0
    page_list = table.as_strided((span,), (1,)) if span else torch.zeros(1, dtype=torch.int32, device=device)
    if kv_start is None:
        kv_start = torch.arange(batch, dtype=torch.int32, device=device) * row
    return page_list, kv_start, call.seqlens_k.contiguous()


def normalise(batch, page_size, num_pages, **table):
    """The (page_list, kv_start, seqlen_k) the kernel reads, from either table kind of CPU
    tensors (checked as the op checks it)."""
    call = framework.Call(NAME, {**dict.fromkeys(_SGLANG + _VLLM), **table}, True)
    _check_table(call, batch)
    _table_contents(call, batch, page_size, num_pages)
    return _page_table(call, batch, page_size, torch.device("cpu"))


def max_seq_q(qo_indptr: torch.Tensor) -> int:
    """The most queries of one sequence (the grid's extent) from qo_indptr: read on the host
    from a CPU tensor, by a synchronising read on a GPU."""
    if qo_indptr.shape[0] < 2:
        return 0
    if qo_indptr.device.type == "cpu":
        indptr = qo_indptr.tolist()
        return max(map(operator.sub, indptr[1:], indptr))
    return int((qo_indptr[1:] - qo_indptr[:-1]).max())


def _q_tiles(qo_indptr: torch.Tensor, checked: _Checked) -> int:
    """The Spec's data_key: the grid's x, cdiv(max seqlen_q, Q_TILE), a plan per value. Up to
    Q_TILE queries in all it is 1 (0 with none) from the layout alone, qo_indptr ending at
    total_q; past that max seqlen_q is read (`max_seq_q`, a synchronisation on a GPU)."""
    if checked.total_q <= Q_TILE:
        return int(checked.total_q > 0)
    return cdiv(max_seq_q(qo_indptr), Q_TILE)


def _descales(call, one: torch.Tensor) -> torch.Tensor:
    """The kernel's (q, k, v) descales, 1 for one not given."""
    return torch.cat([(one if call.values[n] is None else call.values[n]).reshape(1) for n in _DESCALES])


def _contents(call, one: torch.Tensor, kv_start: torch.Tensor | None = None, scales: bool = True) -> dict:
    """The kernel arguments a call's tensor contents give: the page table normalised and,
    with `scales`, the descales and the block scales (`one` where there are none);
    `kv_start` as _page_table's."""
    page_list, kv_start, seqlen_k = _page_table(call, call.qo_indptr.shape[0] - 1, call.k_cache.shape[1],
                                                call.q.device, kv_start)
    given = dict(page_list=page_list, kv_start=kv_start, seqlen_k=seqlen_k)
    if scales:
        given.update(descales=_descales(call, one),
                     kv_scales=one if call.kv_block_descale is None else call.kv_block_descale.reshape(-1))
    return given


_ROWS = ((0, "seq"), (1, "head"))          # q and out [total_q, heads_q, head_dim]


def kernel_args(checked: _Checked, call, seq_q: int) -> dict:
    """The manifest arguments of batch_prefill_d128 for a checked call whose max seqlen_q is
    at most `seq_q` (the grid: cdiv(seq_q, Q_TILE) tiles a sequence): the page table
    normalised, the caches' byte strides (their pages: `_row_stride`) and those of q's and
    out's size-1 dims (the launcher fills q's, out's and lse's others: kernels.yaml `strides:`)."""
    q, k_cache, v_cache, out, lse, qo_indptr = call.q, call.k_cache, call.v_cache, call.out, call.lse, call.qo_indptr
    e = q.element_size()
    ratio = q.shape[1] // k_cache.shape[2]
    store_lse = lse is not None
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, o=out,
                lse=lse if store_lse else torch.empty((0, 0), dtype=torch.float32, device=q.device),
                qo_indptr=qo_indptr, **_contents(call, torch.ones(1, dtype=torch.float32, device=q.device)),
                heads_k=k_cache.shape[2], max_seq_q=seq_q,
                k_seq_stride=checked.k_seq_stride, k_head_stride=k_cache.stride(2) * e,
                v_seq_stride=checked.v_seq_stride, v_head_stride=v_cache.stride(2) * e,
                **fmha.unstepped_strides("q", q, _ROWS), **fmha.unstepped_strides("o", out, _ROWS),
                page_shift=k_cache.shape[1].bit_length() - 1,
                page_stride_shift=k_cache.shape[1].bit_length() - 1 + checked.page_ratio_log2, kv_head_magic=magic_u32(ratio),
                store_lse=int(store_lse), **fmha.score_args(checked.scale, checked.softcap),
                **fmha.sinks_args(call.sinks, q.device), **fmha.window_args(checked.window))


def _plan(checked: _Checked, call, tiles: int) -> framework.Plan:
    """The launch for a layout and `tiles` query tiles per sequence (the framework keeps one
    per pair: the Spec's data_key, `_q_tiles`). Where the kernel's table and scale arguments are the call's own
    tensors (`_positional`), the plan names them (the framework binds them by position);
    otherwise each call binds what its tensor contents give (`_contents`). Either way the
    plan keeps only placeholders the kernel never reads and the layout's constants."""
    if not call.q.numel() or not tiles:         # (tiles 0: no sequence has a query)
        return framework.Plan()
    args = kernel_args(checked, call, tiles * Q_TILE)       # (the kernel reads no max_seq_q: the grid's)
    launch = prepare(checked.variant, args)
    recheck = (lambda c: (_check_contents(c, checked.scale), fmha.sink_values(c))) if fmha.readable(call) else None
    # the kernel never touches lse without store_lse, nor sinks without has_sinks
    fixed = {name: args[name] for name in ("lse", "sinks")}
    rename = _positional(call)
    if rename is not None:
        fixed.update({name: args[name] for name in ("page_list", "kv_start", "descales", "kv_scales")
                      if name not in rename})
        return framework.Plan((launch,), fixed=fixed, rename=rename, recheck=recheck)
    one = torch.ones(1, dtype=torch.float32, device=call.q.device)
    kv_start = None if call.block_table is None else args["kv_start"]      # (a vLLM table's: from its layout)
    scales = any(call.values[n] is not None for n in _DESCALES + ("kv_block_descale",))
    if not scales:                              # (all ones: the layout's constants)
        fixed.update(descales=args["descales"], kv_scales=args["kv_scales"])

    def bind(c) -> dict:
        given = dict(q=c.q, k_cache=c.k_cache, v_cache=c.v_cache, o=c.out, qo_indptr=c.qo_indptr,
                     **_contents(c, one, kv_start, scales))
        if c.lse is not None:
            given["lse"] = c.lse
        if c.sinks is not None:
            given["sinks"] = c.sinks
        return given
    return framework.Plan((launch,), fixed=fixed, bind=bind, recheck=recheck)


def _positional(call) -> dict[str, str] | None:
    """Where every table and scale argument the kernel takes is, for this layout, a call's
    tensor as it is (the same address; `_contents` makes views of them) or a constant: the
    kernel arguments that take a call's tensor under another name (kernel argument -> the
    call's). A vLLM table (its page list is block_table's memory, kv_start follows from its
    layout) with a contiguous seqlens_k and no per-tensor descales (their product is a new
    tensor); kv_block_descale, contiguous, is its own flat view. None otherwise (an SGLang
    table's seqlen_k is computed per call)."""
    if call.block_table is None or not call.seqlens_k.is_contiguous() or \
            any(call.values[n] is not None for n in _DESCALES):
        return None
    rename = {"o": "out", "seqlen_k": "seqlens_k"}
    if call.block_table.numel():                # (else the layout's placeholder: nothing is read)
        rename["page_list"] = "block_table"
    if call.kv_block_descale is not None:
        rename["kv_scales"] = "kv_block_descale"
    return rename


def _allocate(call, names: frozenset) -> dict:
    q = call.tensor("q", 3, _Q)
    outs = {}
    if "out" in names:
        outs["out"] = torch.empty(q.shape, dtype=out_dtype(q.dtype), device=q.device)
    if "lse" in names:
        outs["lse"] = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
    return outs


# The launch depends on tensor data: the grid's query tiles per sequence (the data_key: a plan
# per layout and value) and the page table, descales and block scales (bound on every call).
_ALIGNED = dict(align=16)
BATCH_PREFILL = framework.define(framework.Spec(
    NAME,
    params=(framework.Param("q", "Tensor", **_ALIGNED), framework.Param("k_cache", "Tensor", **_ALIGNED),
            framework.Param("v_cache", "Tensor", **_ALIGNED), framework.Param("qo_indptr", "Tensor"),
            *(framework.Param(n, "Tensor?") for n in _SGLANG + _VLLM),
            framework.Param("causal", "bool"), framework.Param("softmax_scale", "float?"),
            *fmha.WINDOW_SINKS_SOFTCAP,
            *(framework.Param(n, "Tensor?") for n in _DESCALES + ("kv_block_descale",))),
    outputs=(framework.Output("out", **_ALIGNED), framework.Output("lse", optional=True)),
    check=_check, allocate=_allocate, plan=_plan, out_after="seqlens_k", data_key=("qo_indptr", _q_tiles)))


def batch_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, qo_indptr: torch.Tensor, *,
                  kv_indptr: torch.Tensor | None = None, kv_page_indices: torch.Tensor | None = None,
                  kv_last_page_len: torch.Tensor | None = None, block_table: torch.Tensor | None = None,
                  seqlens_k: torch.Tensor | None = None, causal: bool = False, softmax_scale: float | None = None,
                  window_size: tuple[int, int] = (-1, -1), sinks: torch.Tensor | None = None, softcap: float = 0.0,
                  q_descale: torch.Tensor | None = None, k_descale: torch.Tensor | None = None,
                  v_descale: torch.Tensor | None = None, kv_block_descale: torch.Tensor | None = None,
                  out: torch.Tensor | None = None, return_lse: bool = False):
    """Varlen attention of q over a paged KV cache; returns out, or (out, lse) with
    return_lse. See the module docstring; runs torch.ops.gfxasm.batch_prefill (batch_prefill_with_lse
    with return_lse, batch_prefill_out when `out` is given). bf16 q over an FP8 cache first runs the
    pre-pass that quantises q on the device (loader/ops/fp8_query.py)."""
    args = (q, k_cache, v_cache, qo_indptr, kv_indptr, kv_page_indices, kv_last_page_len, block_table, seqlens_k,
            causal, softmax_scale, *fmha.window_pair(NAME, window_size), sinks, softcap, q_descale, k_descale,
            v_descale, kv_block_descale)
    if fp8_query.quantizes(q, k_cache):
        args = fp8_query.with_quantized_query(BATCH_PREFILL, args, out)
    return BATCH_PREFILL(*args, out=out, return_lse=return_lse)


# ------------------------------------------------------------------ reference

def gather_kv(cache: torch.Tensor, page_list: torch.Tensor, start: int, seqlen: int) -> torch.Tensor:
    """[seqlen, Hkv, 128]: rows 0..seqlen-1 of one sequence read through its page list."""
    page_size = cache.shape[1]
    j = torch.arange(seqlen)
    pages = page_list[start + j // page_size].long()
    return cache[pages, j % page_size]


def reference(q, k_cache, v_cache, qo_indptr, page_list, kv_start, seqlen_k, *, causal=False,
              softmax_scale=None, window=(-1, -1), sinks=None, softcap=0.0, descales=(1.0, 1.0, 1.0),
              kv_block_descale=None, p_bound=False) -> tuple[torch.Tensor, ...]:
    """(O [total_q, Hq, D], LSE [Hq, total_q]) in float64 from the normalised page table
    (page_list, kv_start, seqlen_k: the form `normalise` returns), inputs dequantised by
    `descales` (q, k, v) and, per page and KV head, `kv_block_descale`; window, sinks and
    softcap as fmha.reference's. A row that sees no key gets O = 0, LSE = -inf (with sinks:
    the sink); one that sees a NaN score (a NaN in its query or a visible
    key) gets NaN. With p_bound, also the bound on |O - O_ref| that P's rounding to FP8
    e4m3 allows (see `fp8_p_bound`)."""
    scale = 1.0 / math.sqrt(q.shape[2]) if softmax_scale is None else softmax_scale
    total_q, heads_q, _ = q.shape
    ratio = heads_q // k_cache.shape[2]
    qd, kd, vd = descales
    o = torch.zeros(total_q, heads_q, q.shape[2], dtype=torch.float64)
    bound = torch.zeros_like(o)
    lse = torch.full((heads_q, total_q), float("-inf"), dtype=torch.float64)
    for b in range(qo_indptr.shape[0] - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        sq, sk = q1 - q0, int(seqlen_k[b])
        if sq == 0:
            continue
        qb = q[q0:q1].double() * qd
        kb = gather_kv(k_cache, page_list, int(kv_start[b]), sk).double() * kd
        vb = gather_kv(v_cache, page_list, int(kv_start[b]), sk).double() * vd
        v_ratio = torch.ones(sk, heads_q, dtype=torch.float64)
        if kv_block_descale is not None:
            rows = int(kv_start[b]) + torch.arange(sk) // k_cache.shape[1]
            row_scales = kv_block_descale[page_list[rows].long()].double()           # [sk, Hkv, 2]
            kb, vb = kb * row_scales[..., :1], vb * row_scales[..., 1:]
            if k_cache.shape[1] < BLOCK_SCALE_MIN_PAGE:         # (_blk: P is rounded as it is)
                v_ratio = tile_v_ratio(row_scales[..., 1]).repeat_interleave(ratio, 1)
        kb, vb = kb.repeat_interleave(ratio, 1), vb.repeat_interleave(ratio, 1)
        s = fmha.capped(torch.einsum("qhd,khd->hqk", qb, kb) * scale, softcap)
        sees = torch.ones(sq, dtype=torch.bool)                # rows with at least one visible key
        visible = fmha.visible_keys(sq, sk, causal, window)
        if visible is not None:
            s = s.masked_fill(~visible, float("-inf"))
            sees = visible.any(-1)
        lse_b = torch.logsumexp(fmha.with_sinks(s, sinks), dim=-1)
        # IEEE arithmetic, as in the kernel: a NaN among the visible scores (a NaN in Q or a
        # visible key) or a +inf score makes the row NaN, visible scores all -inf give 0 / 0 =
        # NaN (with sinks: P = 0 and the sink's weight 1); only a row without a visible key
        # gets P = 0. P = exp(s - max) / sum (softmax), not exp(s - lse): at scores near 1e31
        # lse absorbs log 2 of two tied best keys.
        p = torch.softmax(fmha.with_sinks(s, sinks), dim=-1)[..., :sk]
        if sinks is None:
            p = p.masked_fill(~sees[None, :, None], 0.0)
        o[q0:q1] = torch.einsum("hqk,khd->qhd", p, vb)
        lse[:, q0:q1] = lse_b
        if p_bound:
            bound[q0:q1] = fp8_p_bound(p, s, vb, v_ratio)
    return (o, lse, bound) if p_bound else (o, lse)


def tile_v_ratio(v_scale: torch.Tensor) -> torch.Tensor:
    """[sk, Hkv]: U / v per key of one sequence (v_scale [sk, Hkv]), U the largest v scale of
    the key's 64-key tile rounded up to a power of two (the _blks kernel's P' = P v / U).
    Keys past seqlen_k in the last tile re-read the last key, so they add nothing to its max."""
    sk = v_scale.shape[0]
    pad = (-sk) % KV_TILE
    padded = torch.cat([v_scale, v_scale[-1:].expand(pad, -1)]) if pad else v_scale
    v_ref = padded.reshape(-1, KV_TILE, v_scale.shape[1]).amax(1).repeat_interleave(KV_TILE, 0)[:sk]
    return torch.exp2(torch.ceil(torch.log2(v_ref.double()))) / v_scale


def fp8_p_bound(p: torch.Tensor, s: torch.Tensor, v: torch.Tensor, v_ratio: torch.Tensor | None = None) -> torch.Tensor:
    """Largest |O - O_exact| [q, h, d] from rounding P to FP8 e4m3 before the P.V GEMM.

    p [h, q, k] are the exact probabilities (exp(s - max) / l), s the scores (-inf where
    masked), v [k, h, d] dequantised. The kernel's P for key j is P_j * l * a with
    a = 2^(c (m_final - m_tile)) in [2^-0, 2^8] (its lazily updated max never trails the
    final one by more than 8 in log2 units) and its exact P_j * l * a in (0, 2^8]. Rounding
    to e4m3 moves a normal value (>= 2^-6) by at most half an ulp, 2^-4 relative, and a
    subnormal or underflowing one by at most half the smallest step, 2^-10 absolute; back in
    the final scale (divide by a >= 1) the absolute part stays <= 2^-10. The row sum l comes
    from unrounded P, so O moves by at most sum_j (2^-4 P_j + 2^-10 / l) |V_j| per output.

    Per-key v scales (kv_block_descale below page 64): the kernel rounds P'_j = P_j v_j / U
    (<= P_j; U: the tile's largest v scale rounded up to a power of two) and O carries U, so
    V_j's weight is round(P'_j) U: the relative part stays 2^-4 P_j, the absolute 2^-10 grows
    to 2^-10 U / v_j (< 2^-9 v_ref / v_j). v_ratio [k, h] is U / v_j (`tile_v_ratio`; None: 1)."""
    if not s.shape[-1]:
        return torch.zeros(p.shape[1], p.shape[0], v.shape[-1], dtype=torch.float64)
    visible = torch.isfinite(s).double()
    if v_ratio is not None:
        visible = visible * v_ratio.t()[:, None, :]
    l = torch.exp(s - s.amax(-1, keepdim=True)).nan_to_num(0.0).sum(-1, keepdim=True)
    weight = 2.0**-4 * p + 2.0**-10 * visible / l.clamp_min(1e-300)
    return torch.einsum("hqk,khd->qhd", weight, v.abs())


# ------------------------------------------------------------------ `gfxasm run batch_prefill_d128`

def _register_run_case() -> None:
    from ..runcases import RunCase, run_case

    def prefill_case(variant, gen: torch.Generator, seq_q=(70, 1, 300), seq_k=(100, 40, 300), page_size=16,
                     heads_q=4, heads_k=2) -> RunCase:
        dtype = FP8 if variant.defines.get("FP8", 0) else torch.float16 if variant.defines["F16"] else torch.bfloat16
        causal = bool(variant.defines["FMHA_CAUSAL"])
        blk = bool(variant.defines.get("BLK", 0))
        if blk and not variant.defines.get("BLKS", 0):
            page_size = max(page_size, BLOCK_SCALE_MIN_PAGE)        # (BLK: a tile in one page)
        counts = [-(-s // page_size) for s in seq_k]
        num_pages = sum(counts) + 2
        table = dict(kv_indptr=torch.tensor([0] + [sum(counts[:b + 1]) for b in range(len(counts))], dtype=torch.int32),
                     kv_page_indices=torch.randperm(num_pages, generator=gen)[:sum(counts)].to(torch.int32),
                     kv_last_page_len=torch.tensor([s - (n - 1) * page_size for s, n in zip(seq_k, counts)],
                                                   dtype=torch.int32))
        qo_indptr = torch.tensor([0] + [sum(seq_q[:b + 1]) for b in range(len(seq_q))], dtype=torch.int32)
        head_dim = variant.defines.get("HEAD_DIM", HEAD_DIM)
        q = torch.randn(int(qo_indptr[-1]), heads_q, head_dim, generator=gen).to(dtype)
        k = torch.randn(num_pages, page_size, heads_k, head_dim, generator=gen).to(dtype)
        v = torch.randn(num_pages, page_size, heads_k, head_dim, generator=gen).to(dtype)
        out = torch.full(q.shape, float("nan"), dtype=out_dtype(dtype))
        lse = torch.full((heads_q, q.shape[0]), float("nan"))
        kv_block = torch.rand(num_pages, heads_k, 2, generator=gen) + 0.5 if blk else None
        # each variant with what the op would give it (the call's checks choose this variant)
        window = ((37, 0) if causal else (37, 11)) if variant.defines.get("WINDOW") else (-1, -1)
        softcap = 2.0 if variant.defines.get("SOFTCAP") else 0.0
        call = framework.Call(NAME, dict(q=q, k_cache=k, v_cache=v, qo_indptr=qo_indptr, **table, block_table=None,
                                         seqlens_k=None, causal=causal, softmax_scale=None, window_left=window[0],
                                         window_right=window[1], sinks=None, softcap=softcap, q_descale=None,
                                         k_descale=None, v_descale=None, kv_block_descale=kv_block, out=out, lse=lse),
                              True)
        o_ref, lse_ref, bound = reference(q, k, v, qo_indptr, *normalise(len(seq_q), page_size, num_pages, **table),
                                          causal=causal, window=window, softcap=softcap, kv_block_descale=kv_block,
                                          p_bound=True)
        # one atol for both outputs: FP8's P-rounding bound plus O's rounding, or 2^-6 for bf16/fp16
        # (their tests hold them to flash-attention's rule: tests/test_batch_prefill.py)
        slack = 2.0**-8 * o_ref.abs().max().item() + 2.0**-6
        atol = (bound.max().item() if dtype == FP8 else 0.0) + slack
        checked = _check(call)
        assert checked.variant.name == variant.name, f"the case's arguments choose {checked.variant.name}, not {variant.name}"
        return RunCase(args=kernel_args(checked, call, max_seq_q(qo_indptr)),
                       expected={"o": o_ref.float(), "lse": lse_ref.float()},
                       atol=atol, rtol=0.0, note=f"Sq={seq_q} Sk={seq_k} page {page_size} Hq={heads_q} Hk={heads_k} "
                                                 f"window {window} softcap {softcap}")

    for kernel in KERNELS.values():
        run_case(kernel)(prefill_case)


_register_run_case()
