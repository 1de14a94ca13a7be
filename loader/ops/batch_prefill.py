"""Batch prefill over a paged KV cache, head dim 128: `gfxasm.batch_prefill` on the
`batch_prefill_d128` kernel family (asm/fmha_fwd_d128.s with PAGED = 1).

    out = gfxasm.batch_prefill(q, k_cache, v_cache, qo_indptr, kv_indptr=..., kv_page_indices=...,
                               kv_last_page_len=..., causal=True)               # SGLang table
    out, lse = gfxasm.batch_prefill(q, k_cache, v_cache, qo_indptr, block_table=..., seqlens_k=...,
                                    return_lse=True)                            # vLLM table

- q `[total_q, Hq, 128]`; sequence b's queries are rows qo_indptr[b] .. qo_indptr[b+1]
  (int32 [B+1], flash-attention's cu_seqlens; qo_indptr[0] = 0, qo_indptr[B] = total_q).
- k_cache, v_cache LINEAR `[num_pages, page_size, Hkv, 128]`, page_size a power of two
  1..1024, Hq % Hkv == 0 (MHA, GQA, MQA).
- Exactly one page table: SGLang's (kv_indptr [B+1] cumulative page counts,
  kv_page_indices, kv_last_page_len [B] in 1..page_size for a sequence with pages;
  seqlen_k = (pages - 1) * page_size + last) or vLLM's (block_table [B, max_blocks],
  seqlens_k [B]). Both become one form for the kernel: a flat int32 page list, each
  sequence's first entry in it (kv_start) and seqlen_k.
- bf16 or fp16 q/k/v give the same dtype out. float8_e4m3fn q/k/v give bf16 out, with
  per-tensor float32 descales q_descale, k_descale, v_descale (one element each, default
  1; >= 0, and softmax_scale >= 0: the kernel keeps scores in raw units, so their order must
  not flip; a descale on a GPU is not checked). P is rounded to e4m3 for the P.V product
  (the row sum uses unrounded P); `fp8_p_bound` gives the error that allows.
- kv_block_descale (FP8): float32 [num_pages, Hkv, 2], the (k, v) scale of each physical
  page and KV head, instead of k_descale / v_descale (q_descale stays per-tensor); scales
  in 2^-62 .. 2^62 (checked on the CPU only); any page size. page_size >= 64 (a 64-key tile
  in one page) runs the `_blk` variants: one (k, v) pair per tile. Smaller pages run the
  `_blks` variants: the scales vary per key, so k multiplies each score, and v each P
  element before its e4m3 rounding, relative to U, the tile's largest v scale rounded up
  to a power of two (P' = P v / U <= P stays in range; O is carried in U units and rescaled
  only where U changes). A P' below 2^-6 is an e4m3 subnormal: the rounding error of a key
  whose v scale is far below its tile's largest grows by U / v (`fp8_p_bound`'s v_ratio).
  Per-key scaling costs VALU work and LDS scale reads per tile (bench/prefill.py models it).
- causal: query i of a sequence sees key j iff j <= i + seqlen_k - seqlen_q (bottom-right).
  A query that sees no key (seqlen_k = 0, or causal with seqlen_q > seqlen_k) gets O = 0
  and LSE = -inf; seqlen_q = 0 is legal.
- LSE `[Hq, total_q]` float32, natural log of the sum of exp(scaled scores).
- `out` (optional): q's shape, q's dtype (bf16 for FP8), 16-byte rows; it may not share
  memory with q or the caches (refused, no in-place form).

The kernel reads, per lane, the page entry of its K/V row with the row index clamped to
seqlen_k - 1 (branchless: no entry past a sequence's list is read, and keys past seqlen_k
read a valid row that the mask then hides), and forms 64-bit addresses
(page * page_size + slot) * row stride, so the pool may exceed 4 GiB; page * page_size +
slot must stay below 2^32. Checked on the host before launch: dtypes, shapes, strides
(16-byte rows; a page's rows at one stride), both or neither table kind, page size; and,
for index tensors on the CPU, qo_indptr / kv_indptr monotonic and consistent with total_q
and the page list, kv_last_page_len in range, seqlens_k within the table, and every page
id the sequences use within the pool. For index tensors on a GPU only their shapes and
dtypes are checked (reading them would synchronise); out-of-range page ids there are
undefined behaviour. The grid needs max seqlen_q, which is read from qo_indptr (a
synchronisation when qo_indptr lives on a GPU).

torch ops (loader/ops/library.py): gfxasm::batch_prefill (functional, returns (out, lse),
lse empty unless return_lse) and gfxasm::batch_prefill_out (out, lse mutated).
"""
from __future__ import annotations

import math

import torch

from ..launcher import launch
from . import arguments, library
from .aliasing import extent, refuse_internal_overlap, refuse_overlap

HEAD_DIM = 128
Q_TILE = 256
KV_TILE = 64
KERNEL = "batch_prefill_d128"
DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float8_e4m3fn: "fp8"}
FP8 = torch.float8_e4m3fn
LOG2E = 1.4426950408889634
MAX_PAGE_SIZE = 1024
BLOCK_SCALE_MIN_PAGE = 64          # kv_block_descale: one (k, v) pair per 64-key tile from here, per key below
_U32 = 2**32
_MAX_SPAN = 2**31                  # Q/O rows of a sequence: 32-bit buffer offsets
_MAX_HEADS = 2**16
NAME = "batch_prefill"


def variant_name(dtype: torch.dtype, causal: bool, block_scales: bool = False, page_size: int = MAX_PAGE_SIZE) -> str:
    """The kernel variant; block scales below BLOCK_SCALE_MIN_PAGE take the per-key `_blks` one."""
    blk = ("_blks" if page_size < BLOCK_SCALE_MIN_PAGE else "_blk") if block_scales else ""
    return f"{KERNEL}_{DTYPES[dtype]}{blk}{'_causal' if causal else ''}"


def _fail(kind, message: str):
    arguments.fail(NAME, kind, message)


def _tensor(name: str, value, rank: int, what: str) -> torch.Tensor:
    return arguments.tensor(NAME, name, value, rank, what)


def _index(name: str, value, length: int | None, device) -> torch.Tensor:
    """An int32 vector index tensor on q's device, of `length` entries when given."""
    t = _tensor(name, value, 1, "an int32 vector")
    if t.dtype != torch.int32:
        _fail(TypeError, f"'{name}' dtype must be torch.int32, got {t.dtype}")
    if t.device != device:
        _fail(ValueError, f"'{name}' must be on q's device ({device}), got {t.device}")
    if length is not None and t.shape[0] != length:
        _fail(ValueError, f"'{name}' must have {length} entries, got {t.shape[0]}")
    return t


def _rows(name: str, t: torch.Tensor, dims: tuple[int, ...]) -> None:
    """Head dim contiguous; the strides of `dims` multiples of 16 bytes and below 2^32 bytes."""
    if t.shape[-1] != HEAD_DIM:
        _fail(ValueError, f"'{name}' head dim must be {HEAD_DIM}, got {t.shape[-1]} (shape {tuple(t.shape)})")
    if t.numel() == 0:
        return
    if t.stride(-1) != 1:
        _fail(ValueError, f"'{name}' must be contiguous in the head dim (stride 1), got strides {t.stride()}")
    for axis in dims:
        stride = t.stride(axis) * t.element_size() if t.shape[axis] > 1 else 0
        if stride % 16 or stride >= _U32:
            _fail(ValueError, f"'{name}' stride of dim {axis} must be a multiple of 16 bytes below 2^32, got "
                              f"{stride} bytes (strides {t.stride()})")


def _row_stride(name: str, cache: torch.Tensor) -> int:
    """Bytes between consecutive slots of the pool (slot = page * page_size + row)."""
    pages, page_size = cache.shape[0], cache.shape[1]
    e = cache.element_size()
    if page_size == 1:
        return cache.stride(0) * e if pages > 1 else HEAD_DIM * e
    if pages > 1 and cache.stride(0) != page_size * cache.stride(1):
        _fail(ValueError, f"'{name}' pages must be page_size rows of one stride apart (stride(0) == page_size * "
                          f"stride(1)), got strides {cache.stride()}")
    return cache.stride(1) * e


def out_dtype(dtype: torch.dtype) -> torch.dtype:
    """FP8 inputs give bf16 out; bf16/fp16 give their own dtype."""
    return torch.bfloat16 if dtype == FP8 else dtype


def _descales(q, q_descale, k_descale, v_descale, kv_block_descale) -> torch.Tensor | None:
    """The kernel's [q, k, v] descale vector (FP8), or None (bf16/fp16)."""
    given = {n: t for n, t in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))
             if t is not None}
    if kv_block_descale is not None and ("k_descale" in given or "v_descale" in given):
        _fail(ValueError, "pass per-tensor k_descale/v_descale or kv_block_descale, not both")
    if q.dtype != FP8 and kv_block_descale is not None:
        _fail(ValueError, f"kv_block_descale applies to float8_e4m3fn inputs only; q is {q.dtype}")
    if q.dtype != FP8:
        if given:
            _fail(ValueError, f"descales apply to float8_e4m3fn inputs only; q is {q.dtype} (got {', '.join(given)})")
        return None
    for name, t in given.items():
        if not isinstance(t, torch.Tensor):
            _fail(TypeError, f"'{name}' must be a float32 tensor of one element, got {type(t).__name__}")
        if t.dtype != torch.float32 or t.numel() != 1:
            _fail(ValueError, f"'{name}' must be a float32 tensor of one element, got {t.dtype} shape {tuple(t.shape)}")
        if t.device != q.device:
            _fail(ValueError, f"'{name}' must be on q's device ({q.device}), got {t.device}")
        if t.device.type == "cpu" and not float(t) >= 0:
            _fail(ValueError, f"'{name}' must be >= 0 (the FP8 kernel keeps scores in raw units), got {float(t)}")
    one = torch.ones(1, dtype=torch.float32, device=q.device)
    return torch.cat([given.get(n, one).reshape(1) for n in ("q_descale", "k_descale", "v_descale")])


def _block_scales(t, k_cache: torch.Tensor) -> torch.Tensor | None:
    """kv_block_descale checked: float32 contiguous [num_pages, Hkv, 2] (k, v), > 0."""
    if t is None:
        return None
    num_pages, _, heads_k, _ = k_cache.shape
    if not isinstance(t, torch.Tensor):
        _fail(TypeError, f"'kv_block_descale' must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32 or tuple(t.shape) != (num_pages, heads_k, 2) or not t.is_contiguous():
        _fail(ValueError, f"'kv_block_descale' must be a contiguous float32 [num_pages, Hkv, 2] = [{num_pages}, "
                          f"{heads_k}, 2], got {t.dtype} shape {tuple(t.shape)} strides {t.stride()}")
    if t.device != k_cache.device:
        _fail(ValueError, f"'kv_block_descale' must be on q's device ({k_cache.device}), got {t.device}")
    if num_pages * heads_k * 8 >= _U32:
        _fail(ValueError, f"kv_block_descale spans {num_pages * heads_k * 8} bytes; the kernel's offset is 32-bit")
    if t.device.type == "cpu" and t.numel() and not bool(((t >= 2.0**-62) & (t <= 2.0**62)).all()):
        _fail(ValueError, "'kv_block_descale' must be finite and > 0, within 2^-62 .. 2^62 (O is rescaled by "
                          "ratios of v scales, formed by exponent arithmetic)")
    return t


def _check_scale(name, value) -> float:
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(TypeError, f"'{name}' must be a float, got {type(value).__name__}")
    if not math.isfinite(value):
        _fail(ValueError, f"'{name}' must be finite, got {value}")
    return float(value)


class _Call:
    """A checked call: the normalised page table and everything the launch needs."""

    def __init__(self, q, k_cache, v_cache, qo_indptr, kv_indptr, kv_page_indices, kv_last_page_len,
                 block_table, seqlens_k, causal, softmax_scale, q_descale, k_descale, v_descale, kv_block_descale,
                 out, lse):
        q = _tensor("q", q, 3, f"[total_q, heads_q, {HEAD_DIM}]")
        k_cache = _tensor("k_cache", k_cache, 4, f"[num_pages, page_size, heads_k, {HEAD_DIM}]")
        v_cache = _tensor("v_cache", v_cache, 4, f"[num_pages, page_size, heads_k, {HEAD_DIM}]")
        if q.dtype not in DTYPES:
            _fail(TypeError, f"'q' dtype must be torch.bfloat16, torch.float16 or torch.float8_e4m3fn, got {q.dtype}")
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            if t.dtype != q.dtype:
                _fail(TypeError, f"'{name}' dtype must equal q's ({q.dtype}), got {t.dtype}")
            if t.device != q.device:
                _fail(ValueError, f"'{name}' must be on q's device ({q.device}), got {t.device}")
        if q.device.type not in ("cpu", "cuda"):
            _fail(ValueError, f"tensors must be on the CPU (emulator) or a ROCm gfx950 GPU, got {q.device}")
        if not isinstance(causal, bool):
            _fail(TypeError, f"'causal' must be a bool, got {type(causal).__name__}")
        if k_cache.shape != v_cache.shape:
            _fail(ValueError, f"'v_cache' shape must equal k_cache's {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
        total_q, heads_q, _ = q.shape
        num_pages, page_size, heads_k, _ = k_cache.shape
        if page_size < 1 or page_size > MAX_PAGE_SIZE or page_size & (page_size - 1):
            _fail(ValueError, f"page_size (k_cache dim 1) must be a power of two in 1..{MAX_PAGE_SIZE}, got {page_size}")
        if heads_k < 1 or heads_q % heads_k:
            _fail(ValueError, f"heads of q must be a multiple of the cache's heads (Hq % Hkv == 0), got Hq={heads_q}, "
                              f"Hkv={heads_k}")
        if heads_q >= _MAX_HEADS:
            _fail(ValueError, f"heads_q must be below {_MAX_HEADS}, got {heads_q}")
        if num_pages * page_size > _U32:
            _fail(ValueError, f"the pool holds {num_pages * page_size} slots; the kernel's slot index is 32-bit")
        _rows("q", q, (0, 1))
        _rows("k_cache", k_cache, (0, 1, 2))
        _rows("v_cache", v_cache, (0, 1, 2))
        if total_q and q.stride(0) * q.element_size() * total_q >= _MAX_SPAN:
            _fail(ValueError, f"'q' rows span {q.stride(0) * q.element_size() * total_q} bytes; the kernel needs < 2^31")
        self.k_ss, self.v_ss = _row_stride("k_cache", k_cache), _row_stride("v_cache", v_cache)
        self.scale = 1.0 / math.sqrt(HEAD_DIM) if softmax_scale is None else _check_scale("softmax_scale",
                                                                                            softmax_scale)
        qo_indptr = _tensor("qo_indptr", qo_indptr, 1, "int32 [batch + 1]")
        if qo_indptr.shape[0] < 1:
            _fail(ValueError, "'qo_indptr' must have batch + 1 >= 1 entries, got 0")
        qo_indptr = _index("qo_indptr", qo_indptr, None, q.device)
        batch = qo_indptr.shape[0] - 1
        self.batch = batch
        self.page_list, self.kv_start, self.seqlen_k = _page_table(
            batch, page_size, num_pages, q.device, kv_indptr, kv_page_indices, kv_last_page_len, block_table, seqlens_k)
        host = qo_indptr.device.type == "cpu"
        if host and batch:
            lengths = qo_indptr[1:] - qo_indptr[:-1]
            if qo_indptr[0].item() != 0 or (lengths < 0).any() or qo_indptr[-1].item() != total_q:
                _fail(ValueError, f"'qo_indptr' must start at 0, never decrease and end at total_q = {total_q}, got "
                                  f"{qo_indptr.tolist()[:8]}{'...' if batch > 7 else ''} ending at {qo_indptr[-1].item()}")
        self.max_seq_q = int((qo_indptr[1:] - qo_indptr[:-1]).max().item()) if batch else 0
        self.q, self.k_cache, self.v_cache, self.qo_indptr, self.causal = q, k_cache, v_cache, qo_indptr, causal
        self.page_shift = page_size.bit_length() - 1
        self.descales = _descales(q, q_descale, k_descale, v_descale, kv_block_descale)
        self.block_scales = _block_scales(kv_block_descale, k_cache) if self.descales is not None else None
        if self.descales is not None and self.scale < 0:
            _fail(ValueError, f"'softmax_scale' must be >= 0 for float8_e4m3fn inputs (the kernel keeps scores in raw "
                              f"units and orders them by their sign), got {self.scale}")
        self.out, self.lse = out, lse
        if out is not None:
            _check_out(out, q)
        if lse is not None:
            _check_lse(lse, q)

    def run(self) -> None:
        q, out, lse = self.q, self.out, self.lse
        if out is not None:
            pointers = [("q", q), ("k_cache", self.k_cache), ("v_cache", self.v_cache)]
            for name, t in pointers + [("out", out)]:
                if t.numel() and t.data_ptr() % 16:
                    _fail(ValueError, f"'{name}' data must be 16-byte aligned, got address {t.data_ptr():#x}")
            refuse_overlap(NAME, "out", out.data_ptr(), extent(out),
                           tuple((n, t.data_ptr(), extent(t), False) for n, t in pointers))
            if lse is not None:
                refuse_overlap(NAME, "lse", lse.data_ptr(), extent(lse),
                               tuple((n, t.data_ptr(), extent(t), False) for n, t in pointers + [("out", out)]))
        if q.numel() and self.max_seq_q:
            launch(KERNEL, variant=variant_name(q.dtype, self.causal, self.block_scales is not None,
                                                self.k_cache.shape[1]), **self.kernel_args())

    def kernel_args(self) -> dict:
        """The manifest arguments of batch_prefill_d128 for this call."""
        q, out, lse = self.q, self.out, self.lse
        e = q.element_size()
        descales = self.descales if self.descales is not None else torch.ones(3, dtype=torch.float32,
                                                                              device=q.device)
        ratio = q.shape[1] // self.k_cache.shape[2]
        store_lse = lse is not None
        return dict(q=q, k_cache=self.k_cache, v_cache=self.v_cache, o=out,
                    lse=lse if store_lse else torch.empty((0, 0), dtype=torch.float32, device=q.device),
                    qo_indptr=self.qo_indptr, kv_start=self.kv_start, seqlen_k=self.seqlen_k,
                    page_list=self.page_list, descales=descales,
                    kv_scales=(self.block_scales.reshape(-1) if self.block_scales is not None else
                               torch.ones(1, dtype=torch.float32, device=q.device)),
                    heads_k=self.k_cache.shape[2], max_seq_q=self.max_seq_q,
                    q_seq_stride=q.stride(0) * e, q_head_stride=q.stride(1) * e,
                    k_seq_stride=self.k_ss, k_head_stride=self.k_cache.stride(2) * e,
                    v_seq_stride=self.v_ss, v_head_stride=self.v_cache.stride(2) * e,
                    o_seq_stride=out.stride(0) * out.element_size(), o_head_stride=out.stride(1) * out.element_size(),
                    lse_head_stride=lse.stride(0) * 4 if store_lse else 0,
                    page_shift=self.page_shift, kv_head_magic=0 if ratio == 1 else -(-_U32 // ratio),
                    scale_log2=self.scale * LOG2E, store_lse=int(store_lse))


def _page_table(batch, page_size, num_pages, device, kv_indptr, kv_page_indices, kv_last_page_len, block_table,
                seqlens_k) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(page_list, kv_start, seqlen_k) from either table kind, checked."""
    sglang = [x is not None for x in (kv_indptr, kv_page_indices, kv_last_page_len)]
    vllm = [x is not None for x in (block_table, seqlens_k)]
    if any(sglang) and any(vllm):
        _fail(ValueError, "pass one page table: SGLang's (kv_indptr, kv_page_indices, kv_last_page_len) or vLLM's "
                          "(block_table, seqlens_k), not both")
    if any(sglang):
        if not all(sglang):
            _fail(ValueError, "the SGLang page table needs all of kv_indptr, kv_page_indices and kv_last_page_len")
        kv_indptr = _index("kv_indptr", kv_indptr, batch + 1, device)
        pages = _index("kv_page_indices", kv_page_indices, None, device)
        last = _index("kv_last_page_len", kv_last_page_len, batch, device)
        counts = kv_indptr[1:] - kv_indptr[:-1]
        seqlen_k = torch.where(counts > 0, (counts - 1) * page_size + last, torch.zeros_like(last))
        if device.type == "cpu" and batch:
            if kv_indptr[0].item() < 0 or (counts < 0).any() or kv_indptr[-1].item() > pages.shape[0]:
                _fail(ValueError, f"'kv_indptr' must start >= 0, never decrease and end <= len(kv_page_indices) = "
                                  f"{pages.shape[0]}, got {kv_indptr.tolist()[:8]}")
            bad = (counts > 0) & ((last < 1) | (last > page_size))
            if bad.any():
                b = int(bad.nonzero()[0, 0])
                _fail(ValueError, f"'kv_last_page_len' must be in 1..page_size ({page_size}) for a sequence with "
                                  f"pages, got {int(last[b])} for sequence {b}")
            used = torch.cat([pages[int(kv_indptr[b]):int(kv_indptr[b + 1])] for b in range(batch)])
            _check_page_ids("kv_page_indices", used, num_pages)
        return pages if pages.numel() else torch.zeros(1, dtype=torch.int32, device=device), \
            kv_indptr[:-1].contiguous(), seqlen_k.to(torch.int32).contiguous()
    if any(vllm):
        if not all(vllm):
            _fail(ValueError, "the vLLM page table needs both block_table and seqlens_k")
        table = _tensor("block_table", block_table, 2, "int32 [batch, max_blocks]")
        if table.dtype != torch.int32:
            _fail(TypeError, f"'block_table' dtype must be torch.int32, got {table.dtype}")
        if table.device != device:
            _fail(ValueError, f"'block_table' must be on q's device ({device}), got {table.device}")
        if table.shape[0] != batch:
            _fail(ValueError, f"'block_table' must have batch = {batch} rows, got {table.shape[0]}")
        if table.shape[1] > 1 and table.stride(1) != 1:
            _fail(ValueError, f"'block_table' rows must be contiguous, got strides {table.stride()}")
        seqlens_k = _index("seqlens_k", seqlens_k, batch, device)
        if device.type == "cpu" and batch:
            blocks = (seqlens_k.long() + page_size - 1) // page_size
            if (seqlens_k < 0).any() or (blocks > table.shape[1]).any():
                _fail(ValueError, f"'seqlens_k' must be in 0..max_blocks * page_size = {table.shape[1] * page_size}, "
                                  f"got {seqlens_k.tolist()[:8]}")
            used = torch.cat([table[b, :int(blocks[b])] for b in range(batch)])
            _check_page_ids("block_table", used, num_pages)
        row = table.stride(0) if batch > 1 else table.shape[1]
        span = (batch - 1) * row + table.shape[1] if table.numel() else 0
        page_list = table.as_strided((span,), (1,)) if span else torch.zeros(1, dtype=torch.int32, device=device)
        kv_start = torch.arange(batch, dtype=torch.int32, device=device) * row
        return page_list, kv_start, seqlens_k.contiguous()
    _fail(ValueError, "a page table is required: SGLang's (kv_indptr, kv_page_indices, kv_last_page_len) or vLLM's "
                      "(block_table, seqlens_k)")


def _check_page_ids(name: str, used: torch.Tensor, num_pages: int) -> None:
    if used.numel() and (int(used.min()) < 0 or int(used.max()) >= num_pages):
        _fail(ValueError, f"'{name}' holds page ids outside the pool 0..{num_pages - 1} (min {int(used.min())}, "
                          f"max {int(used.max())})")


def _check_out(out, q) -> None:
    if not isinstance(out, torch.Tensor):
        _fail(TypeError, f"'out' must be a torch.Tensor, got {type(out).__name__}")
    if out.shape != q.shape:
        _fail(ValueError, f"'out' shape must equal q's {tuple(q.shape)}, got {tuple(out.shape)}")
    if out.dtype != out_dtype(q.dtype):
        _fail(TypeError, f"'out' dtype must be {out_dtype(q.dtype)} for {q.dtype} inputs, got {out.dtype}")
    if out.device != q.device:
        _fail(ValueError, f"'out' must be on q's device ({q.device}), got {out.device}")
    _rows("out", out, (0, 1))
    refuse_internal_overlap(NAME, "out", out)


def _check_lse(lse, q) -> None:
    if not isinstance(lse, torch.Tensor):
        _fail(TypeError, f"'lse' must be a torch.Tensor or None, got {type(lse).__name__}")
    if lse.dtype != torch.float32 or tuple(lse.shape) != (q.shape[1], q.shape[0]) or not lse.is_contiguous():
        _fail(ValueError, f"'lse' must be a contiguous float32 [heads_q, total_q] = [{q.shape[1]}, {q.shape[0]}], got "
                          f"{lse.dtype} shape {tuple(lse.shape)} strides {lse.stride()}")
    if lse.device != q.device:
        _fail(ValueError, f"'lse' must be on q's device ({q.device}), got {lse.device}")


# ------------------------------------------------------------------ the op

def _new_outputs(q: torch.Tensor, return_lse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    out = torch.empty(q.shape, dtype=out_dtype(q.dtype), device=q.device)
    lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device) if return_lse else None
    return out, lse


def _batch_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, qo_indptr: torch.Tensor,
                   kv_indptr: torch.Tensor | None, kv_page_indices: torch.Tensor | None,
                   kv_last_page_len: torch.Tensor | None, block_table: torch.Tensor | None,
                   seqlens_k: torch.Tensor | None, causal: bool, softmax_scale: float | None,
                   q_descale: torch.Tensor | None, k_descale: torch.Tensor | None, v_descale: torch.Tensor | None,
                   kv_block_descale: torch.Tensor | None, return_lse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    _check_flag("return_lse", return_lse)
    q = _tensor("q", q, 3, f"[total_q, heads_q, {HEAD_DIM}]")
    out, lse = _new_outputs(q, return_lse)
    _Call(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_page_indices, kv_last_page_len, block_table, seqlens_k,
          causal, softmax_scale, q_descale, k_descale, v_descale, kv_block_descale, out, lse).run()
    return out, lse if lse is not None else torch.empty(0, dtype=torch.float32, device=q.device)


def _batch_prefill_fake(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_page_indices, kv_last_page_len, block_table,
                        seqlens_k, causal, softmax_scale, q_descale, k_descale, v_descale, kv_block_descale,
                        return_lse):
    _check_flag("return_lse", return_lse)
    q = _tensor("q", q, 3, f"[total_q, heads_q, {HEAD_DIM}]")
    out, lse = _new_outputs(q, return_lse)
    return out, lse if lse is not None else torch.empty(0, dtype=torch.float32, device=q.device)


def _batch_prefill_out(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, qo_indptr: torch.Tensor,
                       kv_indptr: torch.Tensor | None, kv_page_indices: torch.Tensor | None,
                       kv_last_page_len: torch.Tensor | None, block_table: torch.Tensor | None,
                       seqlens_k: torch.Tensor | None, out: torch.Tensor, lse: torch.Tensor | None, causal: bool,
                       softmax_scale: float | None, q_descale: torch.Tensor | None, k_descale: torch.Tensor | None,
                       v_descale: torch.Tensor | None, kv_block_descale: torch.Tensor | None) -> None:
    if out is None:
        _fail(TypeError, "'out' must be a torch.Tensor, got NoneType")
    _Call(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_page_indices, kv_last_page_len, block_table, seqlens_k,
          causal, softmax_scale, q_descale, k_descale, v_descale, kv_block_descale, out, lse).run()


def _batch_prefill_out_fake(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_page_indices, kv_last_page_len,
                            block_table, seqlens_k, out, lse, causal, softmax_scale, q_descale, k_descale, v_descale,
                            kv_block_descale) -> None:
    if out is None:
        _fail(TypeError, "'out' must be a torch.Tensor, got NoneType")
    _check_out(out, _tensor("q", q, 3, f"[total_q, heads_q, {HEAD_DIM}]"))
    if lse is not None:
        _check_lse(lse, q)


def _check_flag(name: str, value) -> None:
    if not isinstance(value, bool):
        _fail(TypeError, f"'{name}' must be a bool, got {type(value).__name__}")


batch_prefill_op = library.define("batch_prefill", _batch_prefill, _batch_prefill_fake)
batch_prefill_out_op = library.define("batch_prefill_out", _batch_prefill_out, _batch_prefill_out_fake,
                                      mutates_args=("out", "lse"))


def batch_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, qo_indptr: torch.Tensor, *,
                  kv_indptr: torch.Tensor | None = None, kv_page_indices: torch.Tensor | None = None,
                  kv_last_page_len: torch.Tensor | None = None, block_table: torch.Tensor | None = None,
                  seqlens_k: torch.Tensor | None = None, causal: bool = False, softmax_scale: float | None = None,
                  q_descale: torch.Tensor | None = None, k_descale: torch.Tensor | None = None,
                  v_descale: torch.Tensor | None = None, kv_block_descale: torch.Tensor | None = None,
                  out: torch.Tensor | None = None, return_lse: bool = False):
    """Varlen attention of q over a paged KV cache; returns out, or (out, lse) with
    return_lse. See the module docstring; runs torch.ops.gfxasm.batch_prefill (or
    batch_prefill_out when `out` is given)."""
    tables = (kv_indptr, kv_page_indices, kv_last_page_len, block_table, seqlens_k)
    scales = (q_descale, k_descale, v_descale, kv_block_descale)
    if out is None:
        out, lse = batch_prefill_op(q, k_cache, v_cache, qo_indptr, *tables, causal, softmax_scale, *scales,
                                    return_lse)
        return (out, lse) if return_lse else out
    _check_flag("return_lse", return_lse)
    lse = _new_outputs(_tensor("q", q, 3, f"[total_q, heads_q, {HEAD_DIM}]"), True)[1] if return_lse else None
    batch_prefill_out_op(q, k_cache, v_cache, qo_indptr, *tables, out, lse, causal, softmax_scale, *scales)
    return (out, lse) if return_lse else out


# ------------------------------------------------------------------ reference

def gather_kv(cache: torch.Tensor, page_list: torch.Tensor, start: int, seqlen: int) -> torch.Tensor:
    """[seqlen, Hkv, 128]: rows 0..seqlen-1 of one sequence read through its page list."""
    page_size = cache.shape[1]
    j = torch.arange(seqlen)
    pages = page_list[start + j // page_size].long()
    return cache[pages, j % page_size]


def reference(q, k_cache, v_cache, qo_indptr, page_list, kv_start, seqlen_k, *, causal=False,
              softmax_scale=None, descales=(1.0, 1.0, 1.0), kv_block_descale=None,
              p_bound=False) -> tuple[torch.Tensor, ...]:
    """(O [total_q, Hq, 128], LSE [Hq, total_q]) in float64 from the normalised page table
    (page_list, kv_start, seqlen_k: the form `normalise` returns), inputs dequantised by
    `descales` (q, k, v) and, per page and KV head, `kv_block_descale`. With p_bound, also the bound on |O - O_ref| that P's rounding to
    FP8 e4m3 allows (see `fp8_p_bound`)."""
    scale = 1.0 / math.sqrt(HEAD_DIM) if softmax_scale is None else softmax_scale
    total_q, heads_q, _ = q.shape
    ratio = heads_q // k_cache.shape[2]
    qd, kd, vd = descales
    o = torch.zeros(total_q, heads_q, HEAD_DIM, dtype=torch.float64)
    bound = torch.zeros_like(o)
    lse = torch.full((heads_q, total_q), float("-inf"), dtype=torch.float64)
    for b in range(qo_indptr.shape[0] - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        sq, sk = q1 - q0, int(seqlen_k[b])
        if sq == 0 or sk == 0:
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
        s = torch.einsum("qhd,khd->hqk", qb, kb) * scale
        if causal:
            i = torch.arange(sq)[:, None]
            j = torch.arange(sk)[None, :]
            s = s.masked_fill(~(j <= i + sk - sq), float("-inf"))
        lse_b = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse_b[..., None]).nan_to_num(0.0)
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


def normalise(batch, page_size, num_pages, **table):
    """The (page_list, kv_start, seqlen_k) the kernel reads, from either table kind
    (checked as the op checks it)."""
    return _page_table(batch, page_size, num_pages, torch.device("cpu"), table.get("kv_indptr"),
                       table.get("kv_page_indices"), table.get("kv_last_page_len"), table.get("block_table"),
                       table.get("seqlens_k"))


# ------------------------------------------------------------------ `gfxasm run batch_prefill_d128`

def _register_run_case() -> None:
    from ..runcases import RunCase, run_case

    @run_case(KERNEL)
    def prefill_case(variant, gen: torch.Generator, seq_q=(70, 1, 300), seq_k=(100, 40, 300), page_size=16,
                     heads_q=4, heads_k=2) -> RunCase:
        dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "fp8": FP8}[variant.name.split("_")[3]]
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
        q = torch.randn(int(qo_indptr[-1]), heads_q, HEAD_DIM, generator=gen).to(dtype)
        k = torch.randn(num_pages, page_size, heads_k, HEAD_DIM, generator=gen).to(dtype)
        v = torch.randn(num_pages, page_size, heads_k, HEAD_DIM, generator=gen).to(dtype)
        out = torch.full(q.shape, float("nan"), dtype=out_dtype(dtype))
        lse = torch.full((heads_q, q.shape[0]), float("nan"))
        kv_block = torch.rand(num_pages, heads_k, 2, generator=gen) + 0.5 if blk else None
        call = _Call(q, k, v, qo_indptr, *table.values(), None, None, causal, None, None, None, None, kv_block, out,
                     lse)
        o_ref, lse_ref, bound = reference(q, k, v, qo_indptr, call.page_list, call.kv_start, call.seqlen_k,
                                          causal=causal, kv_block_descale=kv_block, p_bound=True)
        # one atol for both outputs: FP8's P-rounding bound plus O's rounding, or 2^-6 for bf16/fp16
        # (their tests hold them to flash-attention's rule: tests/test_batch_prefill.py)
        slack = 2.0**-8 * o_ref.abs().max().item() + 2.0**-6
        atol = (bound.max().item() if dtype == FP8 else 0.0) + slack
        return RunCase(args=call.kernel_args(), expected={"o": o_ref.float(), "lse": lse_ref.float()}, atol=atol,
                       rtol=0.0, note=f"Sq={seq_q} Sk={seq_k} page {page_size} Hq={heads_q} Hk={heads_k}")


_register_run_case()
