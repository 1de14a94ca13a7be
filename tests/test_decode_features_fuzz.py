"""gfxasm.decode_attention's window_size, cache_leftpad and softcap fuzzed together on the
strict emulator: hypothesis draws (derandomized, a fixed number of examples) legal calls
over both cache kinds, the three cache dtypes (16-bit, FP8 per-tensor, FP8 per-token), D 64
and 128, GQA/MQA, causal or a right bound, left windows from 0 to none, left padding from
none to every key, softcap 0 or 1..50, splits, sinks; each is checked by
test_decode_attention.check (keys before the padding and the first query's window NaN,
out poisoned, float64 reference written from the definitions).
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gfxasm.ops import decode_attention as da
from test_decode_attention import DTYPES, check

FUZZ = settings(derandomize=True, deadline=None, database=None, print_blob=True, max_examples=8,
                suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module", autouse=True)
def built():
    da.build_kernels()


@st.composite
def feature_calls(draw):
    batch = draw(st.integers(1, 3))
    seqlens = draw(st.lists(st.integers(0, 90), min_size=batch, max_size=batch))
    leftpad = [draw(st.integers(0, n)) if draw(st.booleans()) else 0 for n in seqlens]
    causal = draw(st.booleans())
    left = draw(st.sampled_from([-1, 0, 5, 17, 40]))
    right = 0 if causal and draw(st.booleans()) else (-1 if causal else draw(st.sampled_from([-1, 0, 2, 30])))
    heads_kv = draw(st.sampled_from([1, 2]))
    return dict(seqlens=seqlens, heads_q=heads_kv * draw(st.sampled_from([1, 4, 8])), heads_kv=heads_kv,
                seq_q=draw(st.sampled_from([1, 2, 5])), dim=draw(st.sampled_from([64, 128])),
                dtype=DTYPES[draw(st.sampled_from(["bf16", "f16"]))], page_size=draw(st.sampled_from([None, 16, 64])),
                causal=causal, window=(left, right), sinks=draw(st.booleans()),
                num_splits=draw(st.sampled_from([None, 1, 3])), leftpad=leftpad if any(leftpad) else None,
                softcap=draw(st.sampled_from([0.0, 0.0, 1.0, 30.0])), fp8=draw(st.sampled_from([None, "tensor", "token"])),
                seed=draw(st.integers(0, 2**16)))


@FUZZ
@given(feature_calls())
def test_fuzz_window_leftpad_softcap(c):
    check(c.pop("seqlens"), c.pop("heads_q"), c.pop("heads_kv"), **c)
