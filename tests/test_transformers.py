"""gfxasm.integrations.transformers: tiny random-weight transformers models (built from a
config, nothing downloaded) generate with gfxasm attention on the strict emulator.

Each case runs greedy generate() three ways on one left-padded batch of 2 (the second
sequence's first tokens are padding, as a tokenizer's left padding gives):
  * gfxasm attention, bf16 weights;
  * transformers' own attention at the same precision (sdpa; eager for gpt-oss, whose sinks
    sdpa lacks) — the tokens must be the same;
  * the model upcast to float32 with eager attention, teacher-forced over the generated
    tokens: the reference logits.
Tolerance (flash-attention's rule, applied to the whole model): the largest logit error of
gfxasm against the float32 reference, over every generated step and both sequences, may be
at most twice that of transformers' own bf16 attention, plus 2^-6. (Most of both errors
comes from the bf16 linear layers, which the two runs share.)

Paths covered: a 20-token prompt prefills through batch_prefill (one call per sequence over
page-size-1 views of the cache) and decodes through decode_attention with cache_leftpad; a
12-token prompt prefills through decode_attention too; a static cache (its valid length
from the cache position); gpt-oss's shape (head dim 64, attention sinks, a sliding window
on alternate layers, GQA). Refusals: head-dim-64 prefill past 16 tokens (batch_prefill has
head dim 128 only), right padding, ready-made 4D masks, float32 models.

Cost (process CPU time on the 2-core machine, measured with the emulator): see each case's
comment; the torch.compile case is marked `full` (compiling costs minutes here).
"""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from gfxasm.integrations import transformers as gfxasm_hf  # noqa: E402

NAME = gfxasm_hf.register()
PAD = 0
VOCAB = 128
PADDING = 5                       # the second sequence's left padding


def llama(head_dim: int = 128) -> transformers.PreTrainedModel:
    """2 layers, hidden 256, 4 query heads over 2 KV heads (GQA)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
                                      max_position_embeddings=64, pad_token_id=PAD, bos_token_id=1, eos_token_id=None)
    return transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()


def gpt_oss(head_dim: int = 64) -> transformers.PreTrainedModel:
    """gpt-oss's attention at a small size: head dim 64, 4 query heads over 2 KV heads, a
    sliding window (8 keys) on the first layer, full attention on the second, random sinks."""
    torch.manual_seed(0)
    config = transformers.GptOssConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=head_dim, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"], num_local_experts=4, num_experts_per_tok=2,
        max_position_embeddings=64, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=PAD, bos_token_id=1, eos_token_id=None)
    model = transformers.GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_()        # (initialised to zeros otherwise)
    return model.to(torch.bfloat16)


def left_padded(length: int, padding: int = PADDING) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(2, VOCAB, (2, length), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, :padding] = 0
    ids[1, :padding] = PAD
    return ids, mask


def generate(model, implementation: str, ids, mask, new_tokens: int, **options):
    model.set_attn_implementation(implementation)
    with torch.no_grad():
        run = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, **options)
    return run.sequences, torch.stack(run.logits, dim=1).float()            # logits [B, steps, vocab]


def reference_logits(model, sequences: torch.Tensor, mask: torch.Tensor, prompt: int) -> torch.Tensor:
    """The float32 model (eager attention) teacher-forced over the generated tokens: the
    logits each generate() step should have produced, [B, steps, vocab]."""
    upcast = type(model)(model.config).eval()
    upcast.load_state_dict(model.state_dict())
    upcast = upcast.float()
    upcast.set_attn_implementation("eager")
    steps = sequences.shape[1] - prompt
    full_mask = torch.cat([mask, torch.ones(mask.shape[0], steps - 1, dtype=mask.dtype)], dim=1)
    with torch.no_grad():
        logits = upcast(sequences[:, :-1], attention_mask=full_mask).logits
    return logits[:, prompt - 1:].float()


def check_against_transformers(model, ours: str, theirs: str, prompt: int, new_tokens: int, **options) -> None:
    ids, mask = left_padded(prompt)
    got_tokens, got = generate(model, ours, ids, mask, new_tokens, **options)
    want_tokens, lowp = generate(model, theirs, ids, mask, new_tokens, **options)
    assert torch.equal(got_tokens, want_tokens), f"gfxasm {got_tokens[:, prompt:].tolist()} != {theirs} " \
                                                 f"{want_tokens[:, prompt:].tolist()}"
    reference = reference_logits(model, want_tokens, mask, prompt)
    error, budget = (got - reference).abs().max().item(), 2 * (lowp - reference).abs().max().item() + 2.0**-6
    assert error <= budget, f"gfxasm logits off the float32 reference by {error}, budget {budget} ({theirs} x2 + 2^-6)"


# ------------------------------------------------------------------ generation

def test_llama_left_padded_batch():
    """Prefill of 20 tokens through batch_prefill, 4 decode steps through decode_attention
    with cache_leftpad, dynamic cache."""
    check_against_transformers(llama(), NAME, "sdpa", prompt=20, new_tokens=4)


def test_llama_static_cache():
    """A static cache: the keys are the whole preallocated buffer and the valid length comes
    from the cache position; a 12-token prompt prefills through decode_attention."""
    check_against_transformers(llama(), NAME, "sdpa", prompt=12, new_tokens=3, cache_implementation="static")


def test_gpt_oss_shape():
    """Head dim 64, sinks, a sliding window of 8 on alternate layers, over a 12-token
    left-padded prompt and 4 decode steps (the window slides past the padding)."""
    check_against_transformers(gpt_oss(), NAME, "eager", prompt=12, new_tokens=4)


# ------------------------------------------------------------------ refusals

def test_head_dim_64_long_prefill_is_refused():
    """Past 16 query tokens only batch_prefill serves, and it has head dim 128 only."""
    model = gpt_oss()
    model.set_attn_implementation(NAME)
    ids, mask = left_padded(20)
    with pytest.raises(NotImplementedError, match="head dim 64 prefill .* not supported by batch_prefill"):
        model(ids, attention_mask=mask)


def test_right_padding_is_refused():
    model = llama()
    model.set_attn_implementation(NAME)
    ids, mask = left_padded(8)
    with pytest.raises(RuntimeError, match="right padding"):
        model(ids, attention_mask=mask.flip(1))


def test_ready_made_4d_mask_is_refused():
    model = llama()
    model.set_attn_implementation(NAME)
    ids, _ = left_padded(8)
    mask = torch.ones(2, 1, 8, 8, dtype=torch.bool).tril()
    with pytest.raises(ValueError, match="Ready-made 4D masks"):
        model(ids, attention_mask=mask)


def test_float32_model_is_refused():
    model = llama().float()
    model.set_attn_implementation(NAME)
    ids, mask = left_padded(8)
    with pytest.raises(TypeError, match="torch.float32 attention is not supported"):
        model(ids, attention_mask=mask)


# ------------------------------------------------------------------ torch.compile

@pytest.mark.full
@pytest.mark.parametrize("prompt", [12, 20])
def test_torch_compile_fullgraph(prompt):
    """The whole model under torch.compile(fullgraph=True) (the mask check included) gives
    the eager gfxasm logits, on both prefill paths."""
    model = llama()
    model.set_attn_implementation(NAME)
    ids, mask = left_padded(prompt)
    with torch.no_grad():
        eager = model(ids, attention_mask=mask).logits
        compiled = torch.compile(model, fullgraph=True)(ids, attention_mask=mask).logits
    valid = mask.bool()
    assert torch.equal(compiled[valid], eager[valid])
