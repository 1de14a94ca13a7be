"""gfxasm.moe_align_block_size (asm/moe_align.s: one launch up to ONE_LAUNCH_MAX_SLOTS slots,
three above) on the strict gfx950 emulator.

* vLLM's own test grid (tests/kernels/moe/test_moe_align_block_size.py at main), re-expressed:
  its parameters (tokens 1/3/256/2256/4096, top_k 1/2/16/32, experts 32/160/256/257, block
  sizes 32/128, pad_sorted_ids; the expert_map grid with ignore_invalid_experts; the
  determinism case) and its checks (the total, expert_ids whole, the slots of each expert,
  the total's divisibility, every slot present once, expert_ids in range), each case against
  torch_align, a torch reference written here (stable torch.sort), which also fixes the order
  within an expert: sorted_token_ids must match it exactly. A representative subset runs by
  default, the whole grid under -m full.
* The contract beyond vLLM's grid, against moe_align.reference (plain Python, no sorting):
  test_moe.routing's kinds (empty experts, a hot expert, one slot per expert, few experts),
  out-of-range ids, expert_map without ignore_invalid_experts (absent experts aligned, their
  blocks -1, trailing blocks expert_map[0]), maps that are not monotone, chunk boundaries at
  every place (the op's chunk balance moved), more slots than the one-workgroup kernel took;
  the kernels of each form launched on poisoned, guarded buffers (every entry written, nothing
  outside); empty and single-slot routings; bad input refused before any launch.
* The two forms: the one launch (moe_align_one) and the three launches on the same inputs,
  each against moe_align.reference and torch_align and bit-equal to each other (ragged
  experts, expert_map with -1s in both modes, out-of-range ids, pad_sorted_ids, numel <
  num_experts, block sizes 1 to 1,024, 1,024 experts); the op's choice at the threshold's edge
  (ONE_LAUNCH_MAX_SLOTS - 1, itself, + 1 slots).
"""
from __future__ import annotations

import pytest
import torch

import gfxasm
from gfxasm import build
from gfxasm.gridexpr import cdiv
from gfxasm.manifest import default_manifest
from gfxasm.ops import moe_align
from test_moe import routing

POISON = -0x5A5A5A5B             # an int32 no output can hold


@pytest.fixture(scope="module", autouse=True)
def built():
    build.build_kernels(list(moe_align.KERNELS))


@pytest.fixture(autouse=True)
def fresh_plans():
    """No cached plan outlives a test (a test may force a form)."""
    yield
    moe_align.MOE_ALIGN_BLOCK_SIZE.clear_cache()


def force_form(monkeypatch, one: bool) -> None:
    """Make the op (and launch_args, workspace, prepared) take the one-launch or the
    three-launch form whatever the slot count."""
    monkeypatch.setattr(moe_align, "ONE_LAUNCH_MAX_SLOTS", moe_align.MAX_SLOTS if one else 0)
    moe_align.MOE_ALIGN_BLOCK_SIZE.clear_cache()


def vllm_routing(m: int, topk: int, num_experts: int, gen: torch.Generator) -> torch.Tensor:
    """vLLM's test routing: each token's top_k distinct experts, a random permutation's head."""
    return torch.stack([torch.randperm(num_experts, generator=gen)[:topk] for _ in range(m)]).to(torch.int32)


def torch_align(topk_ids, block_size, num_experts, expert_map=None, pad_sorted_ids=False,
                ignore_invalid_experts=False):
    """vLLM's contract in torch ops: keys (experts, or local experts when the map drops
    absent ones) stably sorted, each key's run padded to block_size."""
    numel = topk_ids.numel()
    ids = topk_ids.flatten().long()
    keys = torch.where((ids >= 0) & (ids < num_experts), ids, -1)
    by_key = expert_map is not None and ignore_invalid_experts
    if by_key:
        local = expert_map.long()[keys.clamp(min=0)]
        keys = torch.where((keys >= 0) & (local >= 0) & (local < num_experts), local, -1)
    padded = numel + num_experts * (block_size - 1)
    if pad_sorted_ids:
        padded = cdiv(padded, block_size) * block_size
    if numel < num_experts:
        padded = min(padded, numel * block_size)
    order = torch.sort(keys, stable=True).indices
    order = order[keys[order] >= 0]
    counts = torch.bincount(keys[keys >= 0], minlength=num_experts)
    runs = (counts + block_size - 1) // block_size * block_size
    starts = torch.cumsum(runs, 0) - runs
    sorted_ids = torch.full((padded,), numel, dtype=torch.int32)
    rank = torch.arange(order.numel()) - (torch.cumsum(counts, 0) - counts)[keys[order]]
    sorted_ids[starts[keys[order]] + rank] = order.to(torch.int32)
    expert_ids = torch.zeros(cdiv(padded, block_size), dtype=torch.int64)
    block_key = torch.repeat_interleave(torch.arange(num_experts), runs // block_size)
    expert_ids[:block_key.numel()] = block_key
    if expert_map is not None and not by_key:
        expert_ids = expert_map.long()[expert_ids]
    return sorted_ids, expert_ids.to(torch.int32), torch.tensor([int(runs.sum())], dtype=torch.int32)


def experts_slots(sorted_ids, expert_ids, block_size, total, numel) -> dict[int, list[int]]:
    """vLLM's grouping check: each expert_ids value's slots, sorted, over the used blocks."""
    got: dict[int, list[int]] = {}
    for b in range(total // block_size):
        block = sorted_ids[b * block_size:(b + 1) * block_size]
        got.setdefault(int(expert_ids[b]), []).extend(block[block < numel].tolist())
    return {e: sorted(v) for e, v in got.items()}


def check_vllm(topk_ids, block_size, num_experts, expert_map=None, pad_sorted_ids=False, ignore_invalid_experts=False,
               every_slot=True):
    """vLLM's checks, then exact equality with torch_align."""
    got = gfxasm.moe_align_block_size(topk_ids, block_size, num_experts, expert_map, pad_sorted_ids,
                                      ignore_invalid_experts)
    want = torch_align(topk_ids, block_size, num_experts, expert_map, pad_sorted_ids, ignore_invalid_experts)
    sorted_ids, expert_ids, post = got
    numel, total = topk_ids.numel(), int(post)
    assert [t.dtype for t in got] == [torch.int32] * 3
    assert [t.shape for t in got] == [t.shape for t in want]
    assert torch.equal(post, want[2])
    assert torch.equal(expert_ids, want[1])
    assert experts_slots(sorted_ids, expert_ids, block_size, total, numel) == \
        experts_slots(want[0], want[1], block_size, total, numel)
    assert total % block_size == 0
    if every_slot:                               # no expert left out: every slot once
        assert total >= numel
        valid = sorted_ids[sorted_ids < numel]
        assert valid.numel() == numel and torch.equal(valid.sort().values, torch.arange(numel, dtype=torch.int32))
        used = expert_ids[:cdiv(total, block_size)]
        assert bool(((used >= 0) & (used < num_experts)).all())
    assert torch.equal(sorted_ids, want[0])      # stricter than vLLM: increasing slots within an expert
    return got


# ------------------------------------------------------------------ vLLM's grid

NUM_TOKENS, TOP_KS, NUM_EXPERTS, BLOCK_SIZES = [1, 3, 256, 2256, 4096], [1, 2, 16, 32], [32, 160, 256, 257], [32, 128]
VLLM_GRID = [(m, k, e, bs, pad) for m in NUM_TOKENS for k in TOP_KS for e in NUM_EXPERTS for bs in BLOCK_SIZES
             for pad in (False, True)]
VLLM_SUBSET = [  # (m, topk, num_experts, block_size, pad): numel < E, = E, > E; one and several chunks
    (1, 1, 32, 32, False), (3, 2, 257, 128, False), (1, 32, 32, 32, True), (3, 16, 160, 128, True),
    (256, 1, 256, 128, False), (256, 16, 160, 32, True), (2256, 2, 257, 32, False),
]


def run_vllm_case(m, topk, num_experts, block_size, pad):
    gen = torch.Generator().manual_seed(m * 1009 + topk * 101 + num_experts * 7 + block_size + pad)
    check_vllm(vllm_routing(m, topk, num_experts, gen), block_size, num_experts, pad_sorted_ids=pad)


@pytest.mark.parametrize("m,topk,num_experts,block_size,pad", VLLM_SUBSET)
def test_vllm_grid_subset(m, topk, num_experts, block_size, pad):
    run_vllm_case(m, topk, num_experts, block_size, pad)


@pytest.mark.full
@pytest.mark.parametrize("m,topk,num_experts,block_size,pad", [c for c in VLLM_GRID if c not in VLLM_SUBSET])
def test_vllm_grid(m, topk, num_experts, block_size, pad):
    run_vllm_case(m, topk, num_experts, block_size, pad)


def vllm_map(num_experts: int) -> torch.Tensor:
    """vLLM's EP map: the even experts local (0, 1, ...), the odd ones absent."""
    expert_map = torch.full((num_experts,), -1, dtype=torch.int32)
    expert_map[::2] = torch.arange(cdiv(num_experts, 2), dtype=torch.int32)
    return expert_map


EXPERT_MAP_GRID = [(m, k, e) for m in (16, 32, 2048) for k in (2, 4) for e in (8, 64)]
EXPERT_MAP_SUBSET = [(16, 2, 8), (32, 4, 64), (2048, 2, 64)]


def run_expert_map_case(m, topk, num_experts):
    gen = torch.Generator().manual_seed(m + 10 * topk + num_experts)
    check_vllm(vllm_routing(m, topk, num_experts, gen), 64, num_experts, vllm_map(num_experts),
               ignore_invalid_experts=True, every_slot=False)


@pytest.mark.parametrize("m,topk,num_experts", EXPERT_MAP_SUBSET)
def test_vllm_expert_map_subset(m, topk, num_experts):
    run_expert_map_case(m, topk, num_experts)


@pytest.mark.full
@pytest.mark.parametrize("m,topk,num_experts", [c for c in EXPERT_MAP_GRID if c not in EXPERT_MAP_SUBSET])
def test_vllm_expert_map(m, topk, num_experts):
    run_expert_map_case(m, topk, num_experts)


def test_vllm_deterministic():
    ids = torch.randint(0, 32, (128, 2), generator=torch.Generator().manual_seed(42), dtype=torch.int32)
    results = [gfxasm.moe_align_block_size(ids, 64, 32) for _ in range(5)]
    assert all(torch.equal(a, b) for r in results[1:] for a, b in zip(results[0], r))


# ------------------------------------------------------------------ the contract beyond the grid

def check_reference(ids: torch.Tensor, block_size, num_experts, expert_map=None, pad=False, ignore=False):
    got = gfxasm.moe_align_block_size(ids, block_size, num_experts, expert_map, pad, ignore)
    want = moe_align.reference(ids.flatten().tolist(), block_size, num_experts,
                               None if expert_map is None else expert_map.tolist(), pad, ignore)
    assert [t.tolist() for t in got] == [want[0], want[1], [want[2]]]


ROUTING_CASES = [  # (kind, T, top_k, E, block_size): test_moe.routing's kinds
    ("random", 1, 5, 129, 16), ("random", 4, 5, 129, 32), ("random", 64, 5, 129, 16),
    ("random", 17, 8, 64, 64), ("random", 33, 4, 16, 16), ("random", 64, 1, 8, 32),
    ("hot", 64, 4, 32, 16), ("hot", 9, 8, 16, 64),
    ("spread", 16, 4, 70, 16), ("spread", 1, 8, 8, 32),
    ("few", 23, 5, 129, 32), ("few", 64, 8, 256, 64),
]


@pytest.mark.parametrize("kind,T,top_k,E,block_size", ROUTING_CASES)
def test_routings(kind, T, top_k, E, block_size):
    """Empty experts, one hot expert, every slot on its own expert, most experts empty."""
    gen = torch.Generator().manual_seed(1000 * T + 100 * top_k + E + block_size + len(kind))
    check_reference(routing(kind, T, top_k, E, gen), block_size, E, pad=T % 2 == 0)


@pytest.mark.full
@pytest.mark.parametrize("T", [1, 2, 5, 16, 33, 64])
@pytest.mark.parametrize("top_k", [1, 4, 5, 8])
@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_routings_cross_product(T, top_k, block_size):
    gen = torch.Generator().manual_seed(T * 7 + top_k + block_size)
    for kind, E in (("random", 129), ("hot", 16), ("few", 256)):
        check_reference(routing(kind, T, top_k, E, gen), block_size, E, pad=True)


def shuffled_map(num_experts: int, gen: torch.Generator) -> torch.Tensor:
    """Half the experts absent, the others numbered in a shuffled (non-monotone) order."""
    expert_map = torch.full((num_experts,), -1, dtype=torch.int32)
    local = torch.randperm(num_experts, generator=gen)[:num_experts // 2]
    expert_map[local] = torch.randperm(num_experts // 2, generator=gen).to(torch.int32)
    return expert_map


@pytest.mark.parametrize("ignore", [False, True])
@pytest.mark.parametrize("T,top_k,E,block_size", [(64, 5, 129, 16), (7, 8, 64, 64), (1, 4, 16, 32)])
def test_expert_map_modes(T, top_k, E, block_size, ignore):
    """Without ignore_invalid_experts every expert is aligned and expert_ids go through the
    map (absent: -1, trailing: expert_map[0]); with it, runs follow the local ids and absent
    experts are left out. Out-of-range ids among them."""
    gen = torch.Generator().manual_seed(7 * T + E + ignore)
    ids = vllm_routing(T, top_k, E, gen)
    ids.view(-1)[::7] = E + 3
    expert_map = shuffled_map(E, gen)
    check_reference(ids, block_size, E, expert_map, pad=True, ignore=ignore)
    check_vllm(ids, block_size, E, expert_map, True, ignore, every_slot=False)


def test_out_of_range_ids_and_local_ids_are_skipped():
    gen = torch.Generator().manual_seed(5)
    ids = vllm_routing(12, 4, 20, gen)
    ids[0, 1], ids[3, 0], ids[7, 3], ids[11, 2] = 20, -1, 2**31 - 1, -2**31
    check_reference(ids, 16, 20)
    check_vllm(ids, 16, 20, every_slot=False)
    expert_map = torch.randint(-3, 25, (20,), generator=gen, dtype=torch.int32)   # locals < 0 or >= 20 too
    check_reference(ids, 16, 20, expert_map, ignore=True)


@pytest.mark.parametrize("balance,chunk", [(16, 640), (64, 320), (1024, 64)])
def test_chunk_boundaries(monkeypatch, balance, chunk):
    """The three launches with the op's chunk balance moved, so that 1,665 slots make 3 chunks
    of 10 rounds, 6 of 5, or 27 of one (the scan's walk past one batch of 16 rows), the last
    one partial."""
    monkeypatch.setattr(moe_align, "CHUNK_BALANCE", balance)
    force_form(monkeypatch, one=False)
    assert moe_align.choose_chunk(1665)[0] == chunk
    gen = torch.Generator().manual_seed(balance)
    ids = vllm_routing(333, 5, 129, gen)
    ids[::5, 0] = 3                              # one hot expert across every chunk
    check_reference(ids, 32, 129, pad=True)
    check_reference(ids, 16, 129, shuffled_map(129, gen), ignore=True)


def test_beyond_one_workgroup():
    """20,480 slots (4,096 tokens x top-5, E 129): more than the single-workgroup kernel's
    16,384; 80 chunks of 256 (the scan's walk: five batches of rows)."""
    gen = torch.Generator().manual_seed(4096)
    check_vllm(vllm_routing(4096, 5, 129, gen), 64, 129, pad_sorted_ids=True)


@pytest.mark.full
def test_prefill_32k_tokens_top8():
    """20,480 slots (4,096 tokens x top-5, E 129): more than the single-workgroup kernel's
    16,384; 80 chunks of 256 (the scan's walk: five batches of rows)."""
    gen = torch.Generator().manual_seed(32768)
    ids = torch.stack([torch.randperm(256, generator=gen)[:8] for _ in range(32768)]).to(torch.int32)
    check_vllm(ids, 64, 256, pad_sorted_ids=True)


def launch_form(monkeypatch, one: bool, ids, block_size, E, expert_map=None, pad=False, ignore=False) -> list:
    """The form's kernels launched directly on poisoned outputs and workspace inside guarded
    buffers; checks that they are the form's kernels and that no guard word changed; returns
    the outputs (sorted_token_ids, expert_ids, num_tokens_post_padded) as lists."""
    force_form(monkeypatch, one)
    padded, blocks = moe_align.sizes(ids.numel(), block_size, E, pad)
    sizes = (padded, blocks, 1, moe_align.workspace(ids.numel(), E, "cpu").numel())
    assert (sizes[3] == 0) == one                 # the one launch keeps its counts in LDS
    bufs = [torch.full((n + 16,), POISON, dtype=torch.int32) for n in sizes]
    outs = [b[8:8 + n] for b, n in zip(bufs, sizes)]
    args = moe_align.launch_args(ids, block_size, E, expert_map, ignore, outs[:3], outs[3])
    launches = moe_align.prepared(args)
    assert [launch.variant for launch in launches] == \
        ([moe_align.ONE_LAUNCH] if one else list(moe_align.THREE_LAUNCHES))
    for launch in launches:
        launch(*[args[name] for name, _, _ in launch.pointers])
    for b in bufs:
        assert b[:8].eq(POISON).all() and b[-8:].eq(POISON).all()
    return [o.tolist() for o in outs[:3]]


@pytest.mark.parametrize("one", [True, False])
def test_kernels_write_every_entry_and_nothing_else(monkeypatch, one):
    """Each form on poisoned outputs and workspace inside guarded buffers: every output entry
    is overwritten (sentinels and trailing blocks included), no guard word is."""
    gen = torch.Generator().manual_seed(11)
    ids, E, block_size = vllm_routing(37, 5, 129, gen), 129, 32
    want = moe_align.reference(ids.flatten().tolist(), block_size, E)
    assert launch_form(monkeypatch, one, ids, block_size, E) == [want[0], want[1], [want[2]]]


FORM_CASES = [  # (routing kind, T, top_k, E, block_size, map: None / "keep" / "ignore", pad, out-of-range ids)
    ("hot", 64, 5, 129, 16, None, True, False),           # ragged: one hot expert, the rest thin
    ("few", 23, 5, 129, 32, None, False, False),          # most experts empty
    ("random", 40, 8, 129, 1, None, False, True),         # block size 1; ids past E and negative
    ("random", 3, 2, 257, 128, None, True, False),        # numel < num_experts
    ("spread", 1, 8, 70, 1024, None, False, False),       # block size 1024, numel < num_experts
    ("random", 17, 8, 64, 2, "keep", True, True),         # absent experts aligned, expert_ids through the map
    ("hot", 50, 4, 96, 64, "ignore", False, True),        # absent experts left out, runs by local id
    ("random", 9, 4, 1024, 256, "ignore", True, False),   # 1,024 experts: every wave holds keys in phase 2
    ("random", 300, 8, 129, 64, None, True, False),       # 2,400 slots: 3 rounds a wave in the one launch
]


@pytest.mark.parametrize("kind,T,top_k,E,block_size,mapped,pad,outside", FORM_CASES)
def test_one_launch_equals_three_launches(monkeypatch, kind, T, top_k, E, block_size, mapped, pad, outside):
    """The one launch and the three launches on the same inputs: each equal to the plain-Python
    reference, and so to each other, bit for bit."""
    gen = torch.Generator().manual_seed(T * 31 + top_k * 7 + E + block_size)
    ids = routing(kind, T, top_k, E, gen)
    if outside:
        ids.view(-1)[::11] = E + 2
        ids.view(-1)[5::13] = -1
    check_forms(monkeypatch, ids, block_size, E, None if mapped is None else shuffled_map(E, gen), pad,
                mapped == "ignore")


def check_forms(monkeypatch, ids, block_size, E, expert_map, pad, ignore):
    """Both forms' outputs equal to the plain-Python reference, so bit-equal to each other."""
    want = moe_align.reference(ids.flatten().tolist(), block_size, E,
                               None if expert_map is None else expert_map.tolist(), pad, ignore)
    for one in (True, False):
        got = launch_form(monkeypatch, one, ids, block_size, E, expert_map, pad, ignore)
        assert got == [want[0], want[1], [want[2]]]


@pytest.mark.full
@pytest.mark.parametrize("block_size", [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024])
@pytest.mark.parametrize("mapped", [None, "keep", "ignore"])
def test_one_launch_equals_three_launches_block_sizes(monkeypatch, block_size, mapped):
    gen = torch.Generator().manual_seed(block_size)
    ids = routing("hot", 33, 5, 129, gen)
    ids.view(-1)[::9] = 200
    check_forms(monkeypatch, ids, block_size, 129, None if mapped is None else shuffled_map(129, gen), True,
                mapped == "ignore")


def test_one_launch_shape_matches_the_op():
    """The op spreads at most ONE_LAUNCH_WAVES chunks over the one launch's waves: its single
    workgroup must have that many, and every slot count up to the threshold fits in them."""
    kernel = default_manifest().kernel(moe_align.ONE_LAUNCH)
    assert tuple(kernel.workgroup) == (64 * moe_align.ONE_LAUNCH_WAVES, 1, 1)
    for n in (1, 63, 64, 65, 1023, 1024, 1025, moe_align.ONE_LAUNCH_MAX_SLOTS):
        chunk, chunks = moe_align.choose_chunk(n)
        assert chunk % 64 == 0 and chunks <= moe_align.ONE_LAUNCH_WAVES and chunk * chunks >= n


@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_threshold_edge(monkeypatch, offset):
    """At ONE_LAUNCH_MAX_SLOTS - 1 and itself the op launches once, one slot more three
    times; each output against torch_align and bit-equal to the other form's."""
    n = moe_align.ONE_LAUNCH_MAX_SLOTS + offset
    picked = []
    choose = moe_align.prepared
    monkeypatch.setattr(moe_align, "prepared", lambda args: picked.append(choose(args)) or picked[-1])
    moe_align.MOE_ALIGN_BLOCK_SIZE.clear_cache()
    gen = torch.Generator().manual_seed(n)
    ids = torch.randint(0, 129, (n,), generator=gen, dtype=torch.int32)
    ids[::97] = 3                                  # a hot expert across every chunk
    got = check_vllm(ids, 64, 129, pad_sorted_ids=True)
    assert [[launch.variant for launch in p] for p in picked] == \
        [[moe_align.ONE_LAUNCH] if offset <= 0 else list(moe_align.THREE_LAUNCHES)]
    assert [t.tolist() for t in got] == launch_form(monkeypatch, offset > 0, ids, 64, 129, pad=True)


def test_empty_and_single():
    s, e, p = gfxasm.moe_align_block_size(torch.empty(0, 4, dtype=torch.int32), 16, 8)
    assert (s.numel(), e.numel(), p.tolist()) == (0, 0, [0])
    check_reference(torch.tensor([[5]], dtype=torch.int32), 64, 6)


@pytest.mark.parametrize("one", [True, False])
def test_schedule_independent(monkeypatch, one):
    """Phase 2's sixteen waves meet at barriers over LDS totals and starts; phases 1 and 3
    keep to their own wave's LDS (the one launch: its sixteen waves also meet at barriers
    between the phases, over the LDS rows of counts and offsets and the sentinels).
    Bit-identical under seeded adversarial schedules (waves interleaved, loads landing late)."""
    from gfxasm.emu import adversarial
    force_form(monkeypatch, one)
    ids = vllm_routing(64, 5, 129, torch.Generator().manual_seed(17))
    ids[:, 0] = 3
    found = adversarial.check(lambda: gfxasm.moe_align_block_size(ids, 16, 129, None, True), range(3))
    assert not found, "\n".join(map(str, found))


@pytest.mark.parametrize("args,exc,match", [
    ((torch.zeros(2, 2, dtype=torch.int64), 16, 8), TypeError, "'topk_ids' dtype"),
    ((torch.zeros(2, 2, 2, dtype=torch.int32), 16, 8), ValueError, "'topk_ids' must be"),
    ((torch.zeros(4, 4, dtype=torch.int32).t(), 16, 8), ValueError, "contiguous"),
    ((torch.zeros(2, 2, dtype=torch.int32), 16, 0), ValueError, "'num_experts'"),
    ((torch.zeros(2, 2, dtype=torch.int32), 16, 1025), ValueError, "'num_experts'"),
    ((torch.zeros(2, 2, dtype=torch.int32), 24, 8), ValueError, "'block_size' must be a power of two"),
    ((torch.zeros(2, 2, dtype=torch.int32), 2048, 8), ValueError, "'block_size'"),
    ((torch.zeros(2, 2, dtype=torch.int32), 16, 8, torch.zeros(7, dtype=torch.int32)), ValueError,
     r"'expert_map' must be \[num_experts\] = \[8\]"),
    ((torch.zeros(2, 2, dtype=torch.int32), 16, 8, torch.zeros(8)), TypeError, "'expert_map' dtype"),
    ((torch.zeros(2, 2, dtype=torch.int32), 16, 8, None, 1), TypeError, "'pad_sorted_ids' must be a bool"),
    ((torch.zeros(2, 2, dtype=torch.int32), 16, 8, None, False, None), TypeError, "'ignore_invalid_experts'"),
    (("ids", 16, 8), TypeError, "'topk_ids' must be a torch.Tensor"),
])
def test_bad_input(args, exc, match, no_launch):
    with pytest.raises(exc, match=match):
        gfxasm.moe_align_block_size(*args)


def test_too_many_slots(no_launch):
    ids = torch.empty(moe_align.MAX_SLOTS + 1, dtype=torch.int32)
    with pytest.raises(ValueError, match=f"at most {moe_align.MAX_SLOTS}"):
        gfxasm.moe_align_block_size(ids, 16, 8)
