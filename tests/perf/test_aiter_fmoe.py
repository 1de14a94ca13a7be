"""gfxasm.perf.aiter_fmoe: aiter's fused-MoE stage-1 launch against its host code, and one
small tuned_fmoe.csv row through the timing model (a few seconds)."""
from __future__ import annotations

import math
import re
import struct

import pytest
import torch

from bench import fmoe_validate
from gfxasm import corpus, emu
from gfxasm.perf import aiter_fmoe, estimate

HOST = "aiter_meta/csrc/py_itfs_cu/asm_moe_2stage.cu"
# the smallest cu_num-256 row of tuned_fmoe.csv: token 16, model_dim 4096, inter_dim 384,
# 128 experts, top-8, doweight, us1 49.7186
DOWEIGHT_128 = "_ZN5aiter54fmoe_stage1_bf16_pertokenFp8_doweight_g1u1_128x128_pf3E"
PLAIN_32 = "_ZN5aiter48fmoe_stage1_bf16_pertokenFp8_g1u1_32x128_3tg_pf2E"
SIZES = {"void": 8, "p2": 8, "unsigned": 4, "p3": 12}


def host_struct() -> dict[str, int]:
    """field -> byte offset, parsed from the host file's packed KernelArgs (p2 and p3 are
    2 and 3 unsigned ints, aiter_hip_common.h)."""
    src = corpus.path(HOST).read_text()
    body = re.search(r"struct __attribute__\(\(packed\)\) KernelArgs\s*\{(.*?)\};", src, re.S).group(1)
    offsets, off = {}, 0
    for kind, name in re.findall(r"^\s*(void|p2|p3|unsigned)\b[^;]*?\*?(\w+);", body, re.M):
        offsets[name] = off
        off += SIZES[kind]
    offsets["<size>"] = off
    return offsets


def u32(raw: bytes, off: int) -> int:
    return struct.unpack_from("<I", raw, off)[0]


def u64(raw: bytes, off: int) -> int:
    return struct.unpack_from("<Q", raw, off)[0]


@pytest.mark.parametrize("symbol", [DOWEIGHT_128, PLAIN_32])
def test_kernarg_matches_the_host_struct(symbol):
    cfg = aiter_fmoe.configs()[symbol]
    tokens, dim, inter, experts, topk = 16, 4096, 384, 128, 8
    kw = aiter_fmoe.launch(cfg, tokens, dim, inter, experts, topk, activation="Gelu")
    raw = kw["kernarg"]
    off = host_struct()
    info = emu.load(kw["co"]).kernel(symbol).info
    assert len(raw) == off["<size>"] == info.metadata[".kernarg_segment_size"] == 368
    out, x, w1, num_valid, a1_scale, w1_scale, sorted_ids, sorted_eids = kw["buffers"][:8]
    # moe_stage1_g1u1, line by line: pointers ...
    for field, t in (("ptr_O", out), ("ptr_X", x), ("ptr_GU", w1), ("ptr_XC", num_valid), ("ptr_XQ", a1_scale),
                     ("ptr_GUQ", w1_scale), ("ptr_STP", sorted_ids), ("ptr_SEP", sorted_eids)):
        assert u64(raw, off[field]) == t.data_ptr(), field
    assert u64(raw, off["ptr_SMQ"]) == 0                  # commented out in the host code
    sw = u64(raw, off["ptr_SW"])
    assert sw == (kw["buffers"][8].data_ptr() if cfg.doweight else 0)
    # ... and values, from the shapes aiter's tuner gives (fp8 X [16, 4096], w1 [128, 768, 4096],
    # per-row w1 scales [128, 768, 1] f32, bf16 out [16, 8, 384]); Gelu = 1 (aiter_enum.h)
    expect = {"dim": 4096, "hidden_dim": 384, "token_cnt": 16, "eprt_cnt": 128, "Xs": 4096, "GUs": 4096,
              "Os": 8 * 384 * 2, "eGUs": 4096 * 384 * 2, "eGUQs": 768 * 4, "eSMQs": 384 * 4, "topk": 8,
              "splitk": 0, "activation": 1}
    assert {f: u32(raw, off[f]) for f in expect} == expect
    # every padding byte is zero
    named = [(o, 8 if k.startswith("ptr_") else 4) for k, o in off.items() if k != "<size>" and not k.startswith("_p")]
    assert all(b == 0 for n, b in enumerate(raw) if not any(o <= n < o + s for o, s in named))
    # grid: ceil(inter_dim / tile_N) x moe_sorting's max_num_m_blocks x 1, block 256
    max_padded = tokens * topk + experts * cfg.tile_m - topk
    assert kw["grid"] == (math.ceil(inter / cfg.tile_n), math.ceil(max_padded / cfg.tile_m), 1)
    assert kw["block"] == (256, 1, 1)


def test_moe_sorting_places_every_slot_once():
    ids = torch.tensor([[2, 0], [2, 1], [0, 2]], dtype=torch.int32)      # 3 tokens, top-2, 4 experts
    w = torch.tensor([[0.7, 0.3], [0.6, 0.4], [0.9, 0.1]])
    sorted_ids, sorted_w, eids, num_valid = aiter_fmoe.moe_sorting(ids, w, 4, 2)
    pad = 2 << 24 | 3
    # expert 0: (t0,k1), (t2,k0); expert 1: (t1,k1) + pad; expert 2: (t0,k0), (t1,k0), (t2,k1) + pad
    assert sorted_ids[:8].tolist() == [1 << 24 | 0, 2, 1 << 24 | 1, pad, 0, 1, 1 << 24 | 2, pad]
    assert (sorted_ids[8:] == pad).all() and sorted_ids.numel() == 6 + 4 * 2 - 2
    assert sorted_w[:7].tolist() == pytest.approx([0.3, 0.9, 0.4, 0.0, 0.7, 0.6, 0.1])
    assert eids.tolist() == [0, 1, 2, 2, -1, -1] and num_valid.tolist() == [8, 3]


def test_bad_input_is_refused():
    cfg = aiter_fmoe.configs()[DOWEIGHT_128]
    with pytest.raises(ValueError, match="inter_dim"):
        aiter_fmoe.grid(cfg, 320, 4)
    with pytest.raises(ValueError, match="activation"):
        aiter_fmoe.launch(cfg, 16, 4096, 384, 128, 8, activation="Relu")
    with pytest.raises(ValueError, match="topk"):
        aiter_fmoe.routing(4, 8, 9)
    t = torch.empty(1)
    with pytest.raises(ValueError, match="w1"):
        aiter_fmoe.kernarg(torch.empty(1, 1, 1), t, torch.empty(2, 8), t, t, t, t, t, model_dim=8, inter_dim=4)


def test_every_stage1_row_is_launchable_and_only_one_stage_rows_are_skipped():
    points, skipped = fmoe_validate.rows()
    assert len(points) == 64                      # cu_num-256 rows naming an fmoe_stage1 object
    assert all("fmoe_stage1" not in s["kernel"] for s in skipped)
    assert all(re.match(r"_ZN5aiter\d+fmoe_bf16_pertokenFp8_g1u1_vs_", s["kernel"]) for s in skipped)


def test_a_small_row_models():
    cfg = aiter_fmoe.configs()[DOWEIGHT_128]
    e = estimate(**aiter_fmoe.launch(cfg, 16, 4096, 384, 128, 8))
    assert e.stubbed == []
    assert math.isfinite(e.seconds) and e.seconds > 0
    # at least the used experts' fp8 weights come from HBM (every row of a block's tile)
    ids, _ = aiter_fmoe.routing(16, 128, 8)
    assert e.dram_bytes >= aiter_fmoe.weight_bytes(ids, 384, 4096)
