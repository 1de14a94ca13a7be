"""gfxasm attention inside Hugging Face transformers 5.x (the `gfxasm[hf]` extra).

    import gfxasm.integrations.transformers as gfxasm_hf
    model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16,
                                                 attn_implementation=gfxasm_hf.register())

`register()` adds two entries named "gfxasm" and returns that name: the attention function
(`AttentionInterface`) and its mask function (`AttentionMaskInterface`). Both are needed:
transformers builds a mask only for names its mask interface knows
(`masking_utils._preprocess_mask_arguments` exits early, handing the attention
`attention_mask=None`, for any other name), so without the mask function padding would be
ignored.

The mask function (`key_ranges`) turns what transformers knows into what the kernels take:
an int32 [batch, 1, 1, 3] tensor, per sequence the first key it may see (in the layer's
key index, after left padding), the end of its keys (queries are aligned to it
bottom-right, so the valid length of a static cache comes from the cache position, not
from the user) and the sliding window (0: none). Four dims because transformers passes a
4D mask through unchanged: generate() builds the mask ahead of the model for a static
cache, and the model's own mask step would read a 2D one as a padding mask. The mask
function also builds transformers' own dense mask (the one sdpa would get) and checks that
this pattern is exactly it; anything else (right padding, gaps in the padding mask, packed
sequences, chunked or bidirectional attention, custom mask functions) fails with an error
rather than running a different attention.

The attention function takes transformers' [batch, heads, seq, head_dim] tensors as they
come and hands the ops their [batch, seq, heads, head_dim] transposed views (no copies):
  * up to decode_attention.MAX_SEQ_Q (16) query tokens: one `decode_attention` call over
    the cache as a contiguous [batch, S, Hkv, D] view, cache_seqlens = the end of the keys,
    cache_leftpad = the first key (decode, and short prefills);
  * longer prefills: `batch_prefill`, one call per sequence, its keys a page-size-1 view
    of the layer's cache named by a page table from the first key on. One call per
    sequence because transformers' queries (after RoPE, [batch, heads, seq, D] dense) are
    not one row list at a single stride, which a batched varlen call needs.
Sliding windows (`sliding_window` of the layer, transformers' "key within the last W
positions", i.e. window_size = (W - 1, 0)), attention sinks (gpt-oss `s_aux`, widened to
the ops' float32) and soft-capping go to the ops. What they cannot serve raises an error
naming the feature; nothing falls back to another attention.
"""
from __future__ import annotations

import torch

from ..ops import batch_prefill as prefill_op
from ..ops import decode_attention as decode_op

NAME = "gfxasm"
DTYPES = (torch.bfloat16, torch.float16)
# transformers' FlashAttention kwargs for packed (padding-free) batches: sequences gfxasm's
# mask cannot describe
_PACKED_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
_MASK_ERROR = ("gfxasm attention: the attention mask is not one gfxasm can serve: causal attention (with the "
               "layer's sliding window, if any) over left-padded sequences only; right padding, gaps in the padding "
               "mask, packed sequences, chunked or bidirectional attention and custom mask functions are not supported")


def register() -> str:
    """Register gfxasm's attention and mask functions with transformers; returns the
    `attn_implementation` name to load a model with (or pass to `set_attn_implementation`)."""
    import transformers

    transformers.AttentionInterface.register(NAME, attention)
    transformers.AttentionMaskInterface.register(NAME, key_ranges)
    return NAME


# ------------------------------------------------------------------ the mask

def key_ranges(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset: int = 0,
               mask_function=None, attention_mask: torch.Tensor | None = None, config=None, use_vmap: bool = False,
               device="cpu", **_) -> torch.Tensor:
    """transformers' mask interface: int32 [batch, 1, 1, 3] (first key, end of keys, window) per
    sequence, in the key index of the layer the mask is for (key j is absolute position
    kv_offset + j; `attention_mask` is the 2D padding mask over absolute positions). Checked
    against transformers' dense mask (`sdpa_mask`), which defines the attention wanted."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    window = 0 if mask_function is causal_mask_function else getattr(config, "sliding_window", None) or 0
    end = torch.zeros(batch_size, dtype=torch.int64, device=device) + (q_offset + q_length - kv_offset)
    if attention_mask is None:
        first = torch.zeros_like(end)
    else:       # left padding: the padding positions come first (the check below rejects any other layout)
        padding = attention_mask.shape[-1] - attention_mask.sum(-1, dtype=torch.int64)
        first = torch.minimum((padding - kv_offset).clamp(min=0), end)
    wanted = sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                       kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                       allow_is_causal_skip=False, allow_is_bidirectional_skip=False, use_vmap=use_vmap, device=device)
    torch._assert_async((wanted == _pattern(first, end, window, q_length, kv_length)).all(), _MASK_ERROR)
    return torch.stack([first, end, torch.full_like(end, window)], dim=1).to(torch.int32)[:, None, None]


def _pattern(first: torch.Tensor, end: torch.Tensor, window: int, q_length: int, kv_length: int) -> torch.Tensor:
    """[batch, 1, q, kv] bool: what the kernels compute. Query i sits at key index
    end - q_length + i (bottom-right) and sees keys from `first` up to itself, and with a
    window W only the last W of them."""
    key = torch.arange(kv_length, device=end.device)
    position = torch.arange(q_length, device=end.device)[None, :, None] + (end - q_length)[:, None, None]
    seen = (key >= first[:, None, None]) & (key <= position)
    if window:
        seen &= key > position - window
    return seen[:, None]


# ------------------------------------------------------------------ the attention

def attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask, *,
              scaling: float | None = None, dropout: float = 0.0, sliding_window: int | None = None,
              s_aux: torch.Tensor | None = None, softcap: float | None = None, **kwargs):
    """transformers' attention interface: query [B, Hq, Sq, D], key/value [B, Hkv, Skv, D]
    (a dynamic cache's keys so far, or a static cache's whole buffer), `attention_mask`
    from `key_ranges`. Returns ([B, Sq, Hq, D] output, None): no attention weights."""
    _refuse_unsupported(module, query, attention_mask, dropout, kwargs)
    window = sliding_window or 0
    ranges = attention_mask[:, 0, 0]
    torch._assert_async((ranges[:, 2] == window).all(),
                        f"gfxasm attention: the layer's sliding window ({window or 'none'}) differs from its mask's")
    first, end = ranges[:, 0].contiguous(), ranges[:, 1].contiguous()
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)      # [B, S, H, D] views
    options = dict(softmax_scale=scaling)          # and the features the layer uses
    if window:
        options["window_size"] = (window - 1, 0)
    if s_aux is not None:
        options["sinks"] = s_aux.float()
    if softcap:
        options["softcap"] = float(softcap)
    if q.shape[1] <= decode_op.MAX_SEQ_Q:
        _check_head_dim(q, decode_op.HEAD_DIMS, "decode_attention")
        out = decode_op.decode_attention(q, k, v, end, cache_leftpad=first, causal=True, **options)
    else:
        _check_head_dim(q, tuple(prefill_op.KERNELS), "batch_prefill")
        out = _prefill(q, k, v, first, end, options)
    return out, None


def _prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first: torch.Tensor, end: torch.Tensor,
             options: dict) -> torch.Tensor:
    """batch_prefill per sequence: its queries q[b] ([Sq, Hq, D]), its keys the pool
    k[b] viewed as Skv pages of one row ([Skv, 1, Hkv, D]) named from `first` on. Keys past
    the sequence's count (end - first) are never read, so the table's tail needs no clamp.
    The outputs are stacked (one copy of O): batch_prefill's out= form writing into views
    of one output tensor gave wrong rows under torch.compile(dynamic=True)."""
    qo_indptr = torch.tensor([0, q.shape[1]], dtype=torch.int32, device=q.device)
    slots = torch.arange(k.shape[1], dtype=torch.int32, device=q.device)
    return torch.stack([
        prefill_op.batch_prefill(q[b], k[b].unsqueeze(1), v[b].unsqueeze(1), qo_indptr,
                                 block_table=(slots + first[b])[None], seqlens_k=(end[b] - first[b]).reshape(1),
                                 causal=True, **options)
        for b in range(q.shape[0])])


def _check_head_dim(q: torch.Tensor, supported: tuple[int, ...], op: str) -> None:
    if q.shape[3] not in supported:
        what = "decode" if op == "decode_attention" else "prefill"
        raise NotImplementedError(f"gfxasm attention: head dim {q.shape[3]} {what} ({q.shape[1]} query tokens) is not "
                                  f"supported by {op} (head dims {', '.join(map(str, supported))})")


def _refuse_unsupported(module, query: torch.Tensor, attention_mask, dropout: float, kwargs: dict) -> None:
    """What the ops cannot serve, named, before anything runs."""
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dtype != torch.int32 or \
            tuple(attention_mask.shape) != (query.shape[0], 1, 1, 3):
        got = type(attention_mask).__name__
        if isinstance(attention_mask, torch.Tensor):
            got = f"{attention_mask.dtype} of shape {tuple(attention_mask.shape)}"
        raise ValueError(f"gfxasm attention: 'attention_mask' must be the int32 [batch, 1, 1, 3] key ranges of "
                         f"gfxasm's mask function (register() installs it); got {got}. Ready-made 4D masks and "
                         f"transformers' paged (continuous batching) cache are not supported")
    if query.dtype not in DTYPES:
        raise TypeError(f"gfxasm attention: {query.dtype} attention is not supported; load the model in "
                        f"torch.bfloat16 or torch.float16")
    if dropout:
        raise NotImplementedError(f"gfxasm attention: attention dropout ({dropout}) is not supported (inference only; "
                                  f"call model.eval())")
    if not getattr(module, "is_causal", True):
        raise NotImplementedError("gfxasm attention: non-causal (bidirectional) attention is not supported")
    packed = [name for name in _PACKED_KWARGS if kwargs.get(name) is not None]
    if packed:
        raise NotImplementedError(f"gfxasm attention: packed (padding-free) batches ({', '.join(packed)}) are not "
                                  f"supported")
