"""gfxasm.mxfp8_moe_gemm on the strict gfx950 emulator against the exact product of the same
quantized values (gfxasm.ops.mxfp8_moe_gemm.reference: float64 of the dequantised operands,
gathered per slot by a plain loop over the blocks).

Routing inputs come from gfxasm.ops.moe_align.reference (a pure-Python transcription of vLLM's
moe_align_block_size, independent of both kernels) on test_moe.routing's token choices:
random, one hot expert (several blocks of one expert), every slot on its own expert, most
experts empty, and expert parallelism with half the experts absent (-1). On top, the unused
tail of sorted_token_ids / expert_ids past num_tokens_post_padded is filled with VALID-
looking slots and experts (a kernel that ignores num_tokens_post_padded writes rows it must
not), and some blocks carry expert ids >= E or < -1 and stray slot ids (>= num_valid,
negative) that must be skipped.

Operands: every finite e4m3 code and NON-uniform E8M0 scales per 32-block
(mxfp8_gemm.random_operands); a and w sit inside buffers of fp8 NaN bytes, out inside a
NaN-poisoned buffer: every written row must be finite and within the bound, every row no
processed block names must still be NaN (bit for bit), and nothing around out may change.

Tolerance per element: the final bf16/fp16 rounding (2^-8 / 2^-11 of |ref|), the f32
multiply by the topk weight (2^-24), and (K/16 + 128) f32 roundings of
|w_t| sum_k |a_k b_k| for the accumulation (as mxfp8_gemm.error_bound).

The 64-bit test maps a 4.3 GB weight tensor from a sparse file (private mapping: only the
two experts used are ever backed by memory) and routes to an expert whose byte offset is
2^32 + 3 experts: a kernel whose offset wraps at 32 bits would read expert 3 instead.
"""
from __future__ import annotations

import tempfile

import pytest
import torch

import gfxasm
from gfxasm.ops import mxfp8_gemm as mx
from gfxasm.ops import mxfp8_moe_gemm as moe
from gfxasm.ops import moe_align
from test_moe import routing

E4M3, E8M0 = torch.float8_e4m3fn, torch.float8_e8m0fnu
FP8_NAN = 0x7F
GUARD = 64                       # guard bytes / elements around each poisoned buffer


@pytest.fixture(scope="module", autouse=True)
def built():
    moe.build_kernels()


def embedded(t: torch.Tensor, fill) -> tuple[torch.Tensor, torch.Tensor]:
    """(view, base): t copied into the middle of a larger buffer full of `fill` (16-byte aligned)."""
    dtype = torch.uint8 if t.dtype == E4M3 else t.dtype
    base = torch.full((2 * GUARD + t.numel(),), fill, dtype=dtype)
    view = base[GUARD:GUARD + t.numel()].view(t.dtype).view(t.shape)
    view.copy_(t)
    return view, base


def ragged_counts(block_m: int) -> tuple[int, ...]:
    """Slots per expert of the 'ragged' routing: none, one, block_m - 1, block_m + 1 (a second
    block with one row), exactly block_m, 2 block_m + 1; 5 block_m + 2 in all."""
    return 0, 1, block_m - 1, block_m + 1, block_m, 2 * block_m + 1


def route(kind, T, top_k, E, block_m, gen, ep=False, stray=False):
    """(sorted_token_ids, expert_ids, num_tokens_post_padded) int32 from moe_align.reference, the
    tail past num_tokens_post_padded filled with valid-looking entries; `stray` adds a block
    of an expert id >= E and one < -1 and stray slot ids inside the used range. kind 'ragged':
    experts 0, 1, ... get ragged_counts(block_m) slots (T * top_k must be their sum), in a
    random slot order."""
    if kind == "ragged":
        counts = torch.tensor(ragged_counts(block_m) + (0,) * (E - len(ragged_counts(block_m))))
        assert int(counts.sum()) == T * top_k
        ids = torch.repeat_interleave(torch.arange(E), counts)[torch.randperm(T * top_k, generator=gen)]
        ids = ids.view(T, top_k).to(torch.int32)
    else:
        ids = routing(kind, T, top_k, E, gen)
    expert_map = None
    if ep:                           # this rank holds every other expert, renumbered 0..E/2-1
        expert_map = [e // 2 if e % 2 == 0 else -1 for e in range(E)]
    sorted_ids, expert_ids, post = moe_align.reference(ids.flatten().tolist(), block_m, E, expert_map, True)
    valid = T * top_k
    sorted_ids = sorted_ids + [valid] * (2 * block_m)              # two spare blocks
    expert_ids = expert_ids + [-1, -1]
    for i in range(post, len(sorted_ids)):                         # garbage the kernel must not use
        sorted_ids[i] = i % valid
    for b in range(-(-post // block_m), len(expert_ids)):
        expert_ids[b] = b % max(1, E // (2 if ep else 1))
    if stray:                        # blocks 0 and 1: experts E + 3 and -5; two padding slots of later blocks
        used = post // block_m
        for b, e in zip(range(min(2, used)), (E + 3, -5)):
            expert_ids[b] = e
        pads = [i for i in range(2 * block_m, post) if sorted_ids[i] == valid]
        for i, t in zip(pads, (valid + 7, -3)):
            sorted_ids[i] = t
    return (torch.tensor(sorted_ids, dtype=torch.int32), torch.tensor(expert_ids, dtype=torch.int32),
            torch.tensor([post], dtype=torch.int32))


def operands(M, E, N, K, gen, out_dtype):
    a, a_scale, _, _ = mx.random_operands(M, 1, K, gen, **mx.OPERAND_RANGES[out_dtype])
    _, _, w, w_scale = mx.random_operands(1, E * N, K, gen, **mx.OPERAND_RANGES[out_dtype])
    return a, a_scale, w.view(E, N, K), w_scale.view(E, N, K // 32)


def check_against_reference(out, out_base, args, a_div, topk_weights, out_dtype, N):
    """Written rows within the bound, the others (and the guard around out) still NaN."""
    a, a_scale, w, w_scale, sorted_ids, expert_ids, post = args
    K = a.shape[1]
    ref, written = moe.reference(*args, a_div, topk_weights)
    mag, _ = moe.reference(*args, a_div, topk_weights, absolute=True)
    u_out, half_tiny = (2.0 ** -8, 2.0 ** -134) if out_dtype == torch.bfloat16 else (2.0 ** -11, 2.0 ** -25)
    bound = (u_out + 2.0 ** -24) * ref.abs() + half_tiny + (K / 16 + 128) * 2.0 ** -24 * mag
    assert written.any(), "the routing left nothing to compute"
    got = out.double()[written]
    assert not torch.isnan(got).any(), f"{int(torch.isnan(got).any(1).sum())} routed rows left unwritten"
    err = (got - ref[written]).abs()
    assert (err <= bound[written]).all(), f"{int((err > bound[written]).sum())} outputs off; worst " \
        f"{float((err / bound[written]).max()):.3g} x bound"
    assert torch.isnan(out[~written].float()).all(), f"{int((~torch.isnan(out[~written].float())).sum())} " \
        f"elements of rows no block names were written"
    poison = torch.cat([out_base[:GUARD], out_base[GUARD + out.numel():]])
    assert torch.isnan(poison.float()).all(), "a store landed outside out"
    return written


def check(kind, T, top_k, E, N, K, block_m, *, a_div_topk=True, weights=True, out_dtype=torch.bfloat16, ep=False,
          stray=False, seed=0, scale_dtype=E8M0):
    gen = torch.Generator().manual_seed(seed * 7919 + T * 131 + top_k * 17 + N + K)
    a_div = top_k if a_div_topk else 1
    M = T * top_k // a_div
    E_local = E // 2 if ep else E
    a, a_scale, w, w_scale = operands(M, E_local, N, K, gen, out_dtype)
    if scale_dtype == torch.uint8:
        a_scale, w_scale = a_scale.view(torch.uint8), w_scale.view(torch.uint8)
    sorted_ids, expert_ids, post = route(kind, T, top_k, E, block_m, gen, ep=ep, stray=stray)
    tw = torch.rand(T, top_k, generator=gen) + 0.25 if weights else None
    a_in, a_base = embedded(a, FP8_NAN)
    w_in, w_base = embedded(w, FP8_NAN)
    out, out_base = embedded(torch.full((T * top_k, N), float("nan"), dtype=out_dtype), float("nan"))
    result = gfxasm.mxfp8_moe_gemm(a_in, a_scale, w_in, w_scale, sorted_ids, expert_ids, post, a_div=a_div,
                                   topk_weights=tw, out=out, out_dtype=out_dtype)
    assert result is out
    args = (a, a_scale, w, w_scale, sorted_ids, expert_ids, post)
    written = check_against_reference(out, out_base, args, a_div, tw, out_dtype, N)
    for base, t in ((a_base, a), (w_base, w)):
        guard = torch.cat([base[:GUARD], base[GUARD + t.numel():]])
        assert (guard == FP8_NAN).all()
    return written


CASES = [  # (kind, T, top_k, E, N, K, block_m, a_div = top_k, topk_weights)
    ("random", 1, 1, 8, 17, 6144, 16, False, True),       # one token, deep K
    ("random", 1, 5, 129, 40, 160, 16, True, True),
    ("random", 4, 5, 33, 72, 416, 32, True, True),        # K % 128 = 32: a partial step
    ("random", 64, 8, 16, 40, 96, 16, True, False),       # K < 128: waves without a step
    ("random", 64, 4, 32, 24, 256, 64, False, True),
    ("hot", 64, 4, 16, 33, 128, 16, True, True),          # one expert with 64 slots: 4 blocks
    ("hot", 9, 8, 16, 50, 224, 64, False, False),
    ("spread", 16, 4, 70, 20, 192, 16, True, True),       # every slot on its own expert
    ("spread", 1, 8, 8, 100, 64, 32, False, True),
    ("few", 23, 5, 129, 16, 320, 32, True, True),         # most experts empty
    # the 3-deep K loop (block_m 16, 16/32 columns) leaves after its 1st / 3rd step body:
    ("random", 3, 2, 8, 40, 640, 16, True, True),         # 5 steps: wave 0 runs 2
    ("random", 2, 3, 8, 24, 1824, 16, False, True),       # 15 steps, one partial: wave 0 runs 4
]


@pytest.mark.parametrize("kind,T,top_k,E,N,K,block_m,adiv,weights", CASES, ids=lambda v: str(v))
def test_routings(kind, T, top_k, E, N, K, block_m, adiv, weights):
    check(kind, T, top_k, E, N, K, block_m, a_div_topk=adiv, weights=weights)


@pytest.mark.parametrize("block_m,adiv", [(16, True), (32, False), (64, True)])
def test_expert_parallel_half_absent(block_m, adiv):
    # E = 32 experts, 16 on this rank; the others' blocks carry -1 and their rows stay NaN
    written = check("random", 24, 4, 32, 40, 256, block_m, a_div_topk=adiv, ep=True)
    assert not written.all()


@pytest.mark.parametrize("block_m", [16, 64])
def test_stray_expert_and_slot_ids_are_skipped(block_m):
    written = check("random", 12, 5, 16, 24, 128, block_m, stray=True)
    assert not written.all()


def force_nt(monkeypatch, nt: int) -> None:
    """The op takes `nt` strips per workgroup; its cached plans (of the real choice) are set
    aside, and those of the forced one dropped after the test."""
    monkeypatch.setattr(moe, "choose_nt", lambda sizes: nt)
    monkeypatch.setattr(moe.MXFP8_MOE_GEMM, "_cache", {})


@pytest.mark.parametrize("block_m,nt", [(16, 4), (16, 2), (32, 2), (32, 1), (64, 2), (64, 4)])
def test_wide_tiles(block_m, nt, monkeypatch):
    # the variants choose_nt takes for many busy blocks, forced on a small problem
    force_nt(monkeypatch, nt)
    check("random", 20, 4, 16, 72, 160, block_m)


# The prefill tiles (block_m 64, 32 and 64 columns: m64_n64 reads its row table past the DS
# offset field) and the decode tiles on ragged expert loads: experts with 0, 1, block_m - 1,
# block_m + 1, block_m and 2 block_m + 1 slots; N = 72 (a partial column tile), K = 416 (a
# partial K step, uneven steps per wave).
@pytest.mark.parametrize("block_m,nt", [(64, 4), (64, 2), (64, 1), (16, 4)])
def test_ragged_expert_loads(block_m, nt, monkeypatch):
    force_nt(monkeypatch, nt)
    written = check("ragged", sum(ragged_counts(block_m)) // 2, 2, 8, 72, 416, block_m, a_div_topk=nt != 2)
    assert written.all()


@pytest.mark.parametrize("nt", [4, 2])
def test_prefill_tiles_expert_parallel(nt, monkeypatch):
    # expert_map with half the experts absent (their blocks -1), stray ids, block_m 64
    force_nt(monkeypatch, nt)
    assert not check("random", 48, 4, 32, 80, 256, 64, ep=True).all()
    assert not check("random", 40, 5, 16, 72, 128, 64, stray=True, out_dtype=torch.float16).all()


def test_prefill_tiles_bit_equal_to_narrow(monkeypatch):
    # every D tile sums the same K steps in the same order whatever the tile width (the 4 waves'
    # steps, their copies added in wave order): the 64- and 32-column tiles write the 16-column
    # tile's bits
    gen = torch.Generator().manual_seed(11)
    T, top_k, E, N, K = 37, 3, 6, 136, 672
    a, a_scale, w, w_scale = operands(T, E, N, K, gen, torch.bfloat16)
    routing_ = route("random", T, top_k, E, 64, gen)
    tw = torch.rand(T, top_k, generator=gen)
    outs = []
    for nt in (1, 2, 4):
        force_nt(monkeypatch, nt)
        out = torch.full((T * top_k, N), float("nan"), dtype=torch.bfloat16)
        gfxasm.mxfp8_moe_gemm(a, a_scale, w, w_scale, *routing_, a_div=top_k, topk_weights=tw, out=out)
        outs.append(out.view(torch.int16))
    assert not torch.isnan(outs[0].view(torch.bfloat16)).any()
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_fp16_output_and_uint8_scales():
    check("random", 7, 4, 12, 40, 160, 16, out_dtype=torch.float16)
    check("random", 7, 4, 12, 40, 160, 32, scale_dtype=torch.uint8, a_div_topk=False)


def test_flat_topk_weights_and_fresh_output():
    gen = torch.Generator().manual_seed(5)
    a, a_scale, w, w_scale = operands(5, 6, 24, 96, gen, torch.bfloat16)
    sorted_ids, expert_ids, post = route("random", 5, 2, 6, 16, gen)
    tw = torch.rand(10, generator=gen)
    out = gfxasm.mxfp8_moe_gemm(a, a_scale, w, w_scale, sorted_ids, expert_ids, post, a_div=2, topk_weights=tw)
    assert out.shape == (10, 24) and out.dtype == torch.bfloat16
    ref, written = moe.reference(a, a_scale, w, w_scale, sorted_ids, expert_ids, post, 2, tw)
    assert written.all()
    torch.testing.assert_close(out.double(), ref, rtol=2.0 ** -7, atol=1e-6 * float(ref.abs().max()))


def test_schedule_independent():
    from gfxasm.emu import adversarial
    gen = torch.Generator().manual_seed(3)
    a, a_scale, w, w_scale = operands(6, 8, 24, 416, gen, torch.bfloat16)
    sorted_ids, expert_ids, post = route("random", 6, 3, 8, 16, gen)
    tw = torch.rand(6, 3, generator=gen)
    found = adversarial.check(lambda: gfxasm.mxfp8_moe_gemm(a, a_scale, w, w_scale, sorted_ids, expert_ids, post,
                                                            a_div=3, topk_weights=tw), range(3))
    assert not found, "\n".join(map(str, found))


def test_expert_offsets_beyond_32_bits():
    # w [2^14 + 4, 64, 4096] = 4.3 GB, mapped from a sparse file: expert 2^14 + 3 starts at
    # byte 2^32 + 3 * 2^18, which a 32-bit offset would wrap onto expert 3 (also routed to,
    # with different data)
    E, N, K = 2**14 + 4, 64, 4096
    far, near = E - 1, 3
    gen = torch.Generator().manual_seed(9)
    with tempfile.NamedTemporaryFile() as wf, tempfile.NamedTemporaryFile() as sf:
        wf.truncate(E * N * K)
        sf.truncate(E * N * K // 32)
        w = torch.from_file(wf.name, shared=False, size=E * N * K, dtype=torch.uint8).view(E4M3).view(E, N, K)
        w_scale = torch.from_file(sf.name, shared=False, size=E * N * K // 32, dtype=torch.uint8).view(E8M0)
        w_scale = w_scale.view(E, N, K // 32)
        assert far * N * K > 2**32 and (far * N * K) % 2**32 == near * N * K
        a, a_scale, pair, pair_scale = operands(3, 2, N, K, gen, torch.bfloat16)
        w[near], w[far] = pair[0], pair[1]
        w_scale[near], w_scale[far] = pair_scale[0], pair_scale[1]
        # 3 tokens, top_k 2: slots 0, 2, 4 on the far expert, 1, 3, 5 on the near one
        sorted_ids = torch.tensor([1, 3, 5] + [6] * 13 + [0, 2, 4] + [6] * 13, dtype=torch.int32)
        expert_ids = torch.tensor([near, far], dtype=torch.int32)
        post = torch.tensor([32], dtype=torch.int32)
        out = torch.full((6, N), float("nan"), dtype=torch.bfloat16)
        gfxasm.mxfp8_moe_gemm(a, a_scale, w, w_scale, sorted_ids, expert_ids, post, a_div=2, out=out)
        A = mx.dequantize(a, a_scale)
        for slot, expert in ((0, 1), (1, 0), (2, 1), (3, 0), (4, 1), (5, 0)):
            want = A[slot // 2] @ mx.dequantize(pair[expert], pair_scale[expert]).T
            bound = 2.0 ** -8 * want.abs() + (K / 16 + 128) * 2.0 ** -24 * (
                A[slot // 2].abs() @ mx.dequantize(pair[expert], pair_scale[expert]).abs().T)
            assert ((out[slot].double() - want).abs() <= bound).all(), f"slot {slot}"


def _full_cases():
    """Routing kinds x T x top_k x block_m x a_div x (N, K); E even (EP keeps half), and for
    'spread' at least one expert per slot."""
    n = 0
    for kind in ("random", "hot", "spread", "few"):
        for T in (1, 2, 7, 33, 64):
            for top_k in (1, 4, 5, 8):
                for block_m in (16, 32, 64):
                    n += 1
                    E = max(T * top_k + T * top_k % 2, 8) if kind == "spread" else (16, 34, 130)[n % 3]
                    N, K = ((17, 6144), (100, 416), (64, 128), (33, 1056))[n % 4]
                    ep = n % 5 == 0 and kind == "random" and T * top_k >= 8    # some slots on this rank
                    yield kind, T, top_k, E, N, K, block_m, n % 2 == 0, n % 3 != 0, ep


@pytest.mark.full
@pytest.mark.parametrize("kind,T,top_k,E,N,K,block_m,adiv,weights,ep", list(_full_cases()), ids=lambda v: str(v))
def test_full_cross_product(kind, T, top_k, E, N, K, block_m, adiv, weights, ep):
    check(kind, T, top_k, E, N, K, block_m, a_div_topk=adiv, weights=weights, ep=ep)


# ------------------------------------------------------------------ bad input (before launch)

def e8m0(*shape):
    return torch.zeros(shape, dtype=torch.uint8).view(E8M0)


def good(**over):
    gen = torch.Generator().manual_seed(1)
    a, a_scale, w, w_scale = operands(2, 4, 8, 64, gen, torch.bfloat16)
    args = dict(a=a, a_scale=a_scale, w=w, w_scale=w_scale,
                sorted_token_ids=torch.full((32,), 4, dtype=torch.int32),
                expert_ids=torch.zeros(2, dtype=torch.int32), num_tokens_post_padded=torch.tensor([16], dtype=torch.int32),
                a_div=2)
    args.update(over)
    return args


def call(**kwargs):
    positional = [kwargs.pop(k) for k in ("a", "a_scale", "w", "w_scale", "sorted_token_ids", "expert_ids",
                                          "num_tokens_post_padded")]
    return gfxasm.mxfp8_moe_gemm(*positional, **kwargs)


@pytest.mark.parametrize("over,exc,match", [
    (dict(a=torch.zeros(2, 64)), TypeError, "'a' dtype"),
    (dict(w_scale=torch.zeros(4, 8, 2)), TypeError, "'w_scale' dtype"),
    (dict(sorted_token_ids=torch.zeros(32, dtype=torch.int64)), TypeError, "'sorted_token_ids' dtype"),
    (dict(expert_ids=torch.zeros(2, dtype=torch.int64)), TypeError, "'expert_ids' dtype"),
    (dict(num_tokens_post_padded=torch.zeros(2, dtype=torch.int32)), ValueError, "num_tokens_post_padded"),
    (dict(w=torch.zeros(4, 8, 64, dtype=E4M3)[:, :, :32]), ValueError, "'w' must be"),
    (dict(a_scale=e8m0(2, 3)), ValueError, "'a_scale' must be"),
    (dict(w_scale=e8m0(4, 9, 2)), ValueError, "'w_scale' must be"),
    (dict(sorted_token_ids=torch.zeros(48, dtype=torch.int32)), ValueError, "block_m"),
    (dict(sorted_token_ids=torch.zeros(16, dtype=torch.int32)), ValueError, "block_m"),
    (dict(expert_ids=torch.zeros(0, dtype=torch.int32)), ValueError, "block_m"),
    (dict(a_div=0), ValueError, "'a_div'"),
    (dict(a_div=3, topk_weights=torch.ones(2, 2)), ValueError, "'a_div' must be 1 or top_k"),
    (dict(topk_weights=torch.ones(5)), ValueError, "'topk_weights' must be"),
    (dict(topk_weights=torch.ones(2, 2, dtype=torch.bfloat16)), TypeError, "'topk_weights' dtype"),
    (dict(out=torch.empty(4, 9, dtype=torch.bfloat16)), ValueError, "'out' must be"),
    (dict(out=torch.empty(4, 8, dtype=torch.float16)), TypeError, "'out' dtype"),
    (dict(out=torch.empty(8, 4, dtype=torch.bfloat16).T), ValueError, "'out' must be contiguous"),
    (dict(out_dtype=torch.float32), TypeError, "'out_dtype'"),
    (dict(a="x"), TypeError, "'a' must be a torch.Tensor"),
])
def test_bad_input(over, exc, match, no_launch):
    with pytest.raises(exc, match=match):
        call(**good(**over))


def test_bad_k_and_sizes(no_launch):
    with pytest.raises(ValueError, match="multiple of 32"):
        call(**good(a=torch.zeros(2, 48, dtype=E4M3), a_scale=e8m0(2, 1)))
    with pytest.raises(ValueError, match="positive multiple of 32"):
        call(**good(a=torch.zeros(2, 0, dtype=E4M3), a_scale=e8m0(2, 0), w=torch.zeros(4, 8, 0, dtype=E4M3),
                    w_scale=e8m0(4, 8, 0)))
    # one expert of 2^16 x 2^15 = 2^31 bytes (meta tensors: metadata only)
    meta = dict(device="meta")
    with pytest.raises(ValueError, match="one expert"):
        moe.validate(torch.empty(2, 2**15, dtype=E4M3, **meta), torch.empty(2, 2**10, dtype=E8M0, **meta),
                     torch.empty(1, 2**16, 2**15, dtype=E4M3, **meta), torch.empty(1, 2**16, 2**10, dtype=E8M0, **meta),
                     torch.empty(16, dtype=torch.int32, **meta), torch.empty(1, dtype=torch.int32, **meta),
                     torch.empty(1, dtype=torch.int32, **meta), 1, None, None, torch.bfloat16)


def test_out_overlapping_an_input_is_refused(no_launch):
    args = good()
    buf = torch.zeros(128, dtype=torch.uint8)
    args["a"] = buf.view(E4M3).view(2, 64)
    with pytest.raises(ValueError, match="overlaps the memory of 'a'"):
        call(**args, out=buf[:64].view(torch.bfloat16).view(4, 8))


def test_misaligned_weights_are_refused(no_launch):
    base = torch.zeros(4 * 8 * 64 + 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match="'w' data must be 16-byte aligned"):
        call(**good(w=base[1:1 + 4 * 8 * 64].view(E4M3).view(4, 8, 64)))


@pytest.mark.parametrize("name", ["sorted_token_ids", "expert_ids", "num_tokens_post_padded", "topk_weights"])
def test_index_tensor_on_another_device_is_refused(name, no_launch):
    """Issue 26: an index tensor on another device than the data (here meta, the rest on the
    CPU) is refused before launch, naming it, in both forms (not an uninitialised result)."""
    args = good(topk_weights=torch.ones(2, 2))
    args[name] = args[name].to("meta")
    for out in (None, torch.empty(4, 8, dtype=torch.bfloat16)):
        with pytest.raises(ValueError, match=f"'{name}' must be on a's device \\(cpu\\), got meta"):
            call(**args, out=out)
