"""The hardware-built conformance cases the evidence ledger (gfxasm.evidence) records:
every strict-clean corpus case of test_conformance.py and the strict-clean MX-FP8
attention case, each run as its test runs it (strict, the object's waivers) with the
emulator's trace hook recording the forms executed, then checked against its reference.
"""
from __future__ import annotations

from typing import Callable

import gfxasm.emu as emu
from gfxasm import corpus
from gfxasm.evidence import FormRecorder

from . import cases_mxfp8
from .test_conformance import CORPUS_CASES, WAIVED


def _mxfp8_one_tile():
    return cases_mxfp8.mxfp8_attention(1, 2, 1, 200, 128, seed=1)


EVIDENCE_CASES: dict[str, Callable] = {**CORPUS_CASES, "mxfp8_attention_gqa2_200x128": _mxfp8_one_tile}


def object_of(name: str):
    """(path, sha256) of the code object a case runs; CorpusMissing where it is absent."""
    if name == "mxfp8_attention_gqa2_200x128":
        return cases_mxfp8.path(), corpus.EXTRA_OBJECTS[cases_mxfp8.NAME].sha256
    path = EVIDENCE_CASES[name]().path
    return path, corpus.sha256_of(path)


def record(name: str) -> dict:
    """{"passed": bool, "forms": [...], "error": str}: one run of a case."""
    case = EVIDENCE_CASES[name]()
    path, _ = object_of(name)
    recorder = FormRecorder()
    try:
        emu.load(path).kernel(case.symbol).launch(
            grid=case.grid, block=case.block, kernarg=case.kernarg, buffers=case.buffers, strict=True,
            waive=WAIVED.get(case.co, ()), trace=recorder)
        case.check()
    except (emu.EmulatorError, AssertionError) as exc:
        return {"passed": False, "forms": sorted(recorder.forms), "error": str(exc)[:300]}
    return {"passed": True, "forms": sorted(recorder.forms), "error": ""}
