"""The MoE ops of issue 11 on the strict gfx950 emulator:

* gfxasm.moe_align_block_size: exact equality with a pure-Python transcription of vLLM's
  contract (align_reference below: lists and loops, no torch sorting), on routings with empty
  experts, one hot expert, every slot on its own expert, out-of-range ids, EP with half the
  experts absent (expert_map), top_k 1/4/5/8, T 1..64, block_m 16/32/64; and, launched on
  NaN-like poisoned buffers with guard words around them, every output entry written and
  nothing outside.
"""
from __future__ import annotations

import pytest
import torch

import gfxasm
from gfxasm import build
from gfxasm.ops import moe_align

POISON = -0x5A5A5A5B             # an int32 no output can hold


@pytest.fixture(scope="module", autouse=True)
def built():
    build.build_kernels(("moe_align",))


# ------------------------------------------------------------------ moe_align_block_size

def align_reference(ids: list[int], num_experts: int, block_m: int, expert_map: list[int] | None = None):
    """vLLM's moe_align_block_size (pad_sorted_ids=True) in plain Python, slots in increasing
    order within an expert, -1 for blocks past the end."""
    n = len(ids)
    padded = -(-(n + num_experts * (block_m - 1)) // block_m) * block_m
    if n < num_experts:
        padded = min(n * block_m, padded)
    sorted_ids, expert_ids, pos = [n] * padded, [-1] * (padded // block_m), 0
    for e in range(num_experts):
        run = [t for t in range(n) if ids[t] == e]
        sorted_ids[pos:pos + len(run)] = run
        blocks = -(-len(run) // block_m)
        for b in range(blocks):
            expert_ids[pos // block_m + b] = e if expert_map is None else expert_map[e]
        pos += blocks * block_m
    return sorted_ids, expert_ids, pos


def routing(kind: str, T: int, top_k: int, E: int, gen: torch.Generator) -> torch.Tensor:
    """[T, top_k] int32 expert ids (distinct per token where the routing allows)."""
    if kind == "random":
        ids = torch.stack([torch.randperm(E, generator=gen)[:top_k] for _ in range(T)])
    elif kind == "hot":              # every token's first choice is one expert, the rest random
        ids = torch.stack([torch.randperm(E, generator=gen)[:top_k] for _ in range(T)])
        ids[:, 0] = 3 % E
    elif kind == "spread":           # every slot on an expert of its own (needs E >= T * top_k)
        ids = torch.randperm(E, generator=gen)[:T * top_k].view(T, top_k)
    elif kind == "few":              # most experts empty: ids drawn from 3 experts
        ids = torch.randint(0, 3, (T, top_k), generator=gen) * (E // 3)
    else:
        raise ValueError(kind)
    return ids.to(torch.int32)


def check_align(ids: torch.Tensor, E: int, block_m: int, expert_map: torch.Tensor | None = None) -> None:
    sorted_ids, expert_ids, post = gfxasm.moe_align_block_size(ids, E, block_m, expert_map)
    want = align_reference(ids.flatten().tolist(), E, block_m, None if expert_map is None else expert_map.tolist())
    assert sorted_ids.tolist() == want[0]
    assert expert_ids.tolist() == want[1]
    assert post.tolist() == [want[2]]
    assert (sorted_ids.dtype, expert_ids.dtype, post.dtype) == (torch.int32,) * 3


ALIGN_CASES = [  # (kind, T, top_k, E, block_m)
    ("random", 1, 5, 129, 16), ("random", 4, 5, 129, 32), ("random", 64, 5, 129, 16),
    ("random", 17, 8, 64, 64), ("random", 33, 4, 16, 16), ("random", 64, 1, 8, 32),
    ("hot", 64, 4, 32, 16), ("hot", 9, 8, 16, 64),
    ("spread", 16, 4, 70, 16), ("spread", 1, 8, 8, 32),
    ("few", 23, 5, 129, 32), ("few", 64, 8, 256, 64),
]


@pytest.mark.parametrize("kind,T,top_k,E,block_m", ALIGN_CASES)
def test_align_matches_reference(kind, T, top_k, E, block_m):
    gen = torch.Generator().manual_seed(1000 * T + 100 * top_k + E + block_m + len(kind))
    check_align(routing(kind, T, top_k, E, gen), E, block_m)


@pytest.mark.parametrize("T,top_k,E,block_m", [(64, 5, 129, 16), (7, 8, 64, 64), (1, 4, 16, 32)])
def test_align_expert_parallel(T, top_k, E, block_m):
    """Half the experts absent (expert_map -1; the local ids of the others are a shuffled
    numbering): absent experts are still aligned and their blocks carry -1."""
    gen = torch.Generator().manual_seed(7 * T + E)
    local = torch.randperm(E, generator=gen)[:E // 2]
    expert_map = torch.full((E,), -1, dtype=torch.int32)
    expert_map[local] = torch.randperm(E // 2, generator=gen).to(torch.int32)
    check_align(routing("random", T, top_k, E, gen), E, block_m, expert_map)


def test_align_skips_out_of_range_ids():
    gen = torch.Generator().manual_seed(5)
    ids = routing("random", 12, 4, 20, gen)
    ids[0, 1], ids[3, 0], ids[7, 3], ids[11, 2] = 20, -1, 2**31 - 1, -2**31
    check_align(ids, 20, 16)


def test_align_writes_every_entry_and_nothing_else():
    """The kernel launched on poisoned outputs inside guarded buffers: every entry is
    overwritten (sentinels and -1 included), the guard words are not."""
    gen = torch.Generator().manual_seed(11)
    ids, E, block_m = routing("random", 37, 5, 129, gen), 129, 32
    want = align_reference(ids.flatten().tolist(), E, block_m)
    padded, blocks = moe_align.sizes(ids.numel(), E, block_m)
    bufs = [torch.full((n + 16,), POISON, dtype=torch.int32) for n in (padded, blocks, 1)]
    outs = [b[8:8 + n] for b, n in zip(bufs, (padded, blocks, 1))]
    gfxasm.launch("moe_align", topk_ids=ids.flatten(), expert_map=torch.empty(0, dtype=torch.int32),
                  sorted_token_ids=outs[0], expert_ids=outs[1], num_tokens_post_padded=outs[2], slots=ids.numel(),
                  num_experts=E, block_m_log2=5, max_padded=padded, max_blocks=blocks, has_map=0)
    assert [o.tolist() for o in outs] == [want[0], want[1], [want[2]]]
    for b in bufs:
        assert b[:8].eq(POISON).all() and b[-8:].eq(POISON).all()


def test_align_empty_and_single():
    s, e, p = gfxasm.moe_align_block_size(torch.empty(0, 4, dtype=torch.int32), 8, 16)
    assert (s.numel(), e.numel(), p.tolist()) == (0, 0, [0])
    check_align(torch.tensor([[5]], dtype=torch.int32), 6, 64)


def test_align_is_deterministic():
    gen = torch.Generator().manual_seed(3)
    ids = routing("hot", 48, 8, 32, gen)
    first = gfxasm.moe_align_block_size(ids, 32, 16)
    again = gfxasm.moe_align_block_size(ids, 32, 16)
    assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.parametrize("args,exc,match", [
    ((torch.zeros(2, 2, dtype=torch.int64), 8, 16), TypeError, "'topk_ids' dtype"),
    ((torch.zeros(2, 2, 2, dtype=torch.int32), 8, 16), ValueError, "'topk_ids' must be"),
    ((torch.zeros(4, 4, dtype=torch.int32).t(), 8, 16), ValueError, "contiguous"),
    ((torch.zeros(16385, dtype=torch.int32), 8, 16), ValueError, "at most 16384"),
    ((torch.zeros(2, 2, dtype=torch.int32), 0, 16), ValueError, "'num_experts'"),
    ((torch.zeros(2, 2, dtype=torch.int32), 1025, 16), ValueError, "'num_experts'"),
    ((torch.zeros(2, 2, dtype=torch.int32), 8, 24), ValueError, "power of two"),
    ((torch.zeros(2, 2, dtype=torch.int32), 8, 2048), ValueError, "'block_m'"),
    ((torch.zeros(2, 2, dtype=torch.int32), 8, 16, torch.zeros(7, dtype=torch.int32)), ValueError, "'expert_map'"),
    ((torch.zeros(2, 2, dtype=torch.int32), 8, 16, torch.zeros(8)), TypeError, "'expert_map' dtype"),
    (("ids", 8, 16), TypeError, "'topk_ids' must be a torch.Tensor"),
])
def test_align_bad_input(args, exc, match, no_launch):
    with pytest.raises(exc, match=match):
        gfxasm.moe_align_block_size(*args)
