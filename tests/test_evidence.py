"""gfxasm.evidence: forms tell apart what changes an instruction's meaning, the recorder
sees what a launch executes (not what the object merely contains), and the ledger
counts a form as covered only through a case that passed."""
from __future__ import annotations

import json

import numpy as np
import pytest

from gfxasm import corpus, evidence
from gfxasm.emu.decode import parse_line


def form(text: str) -> str:
    return evidence.form_of(parse_line(text, 0, (0,)))


@pytest.mark.parametrize("a, b", [
    ("v_pk_fma_f32 v[0:1], v[2:3], v[4:5], v[6:7]", "v_pk_fma_f32 v[0:1], v[2:3], v[4:5], v[6:7] op_sel_hi:[1,0,1]"),
    ("buffer_load_dwordx4 v1, s[16:19], 0 offen", "buffer_load_dwordx4 v1, s[16:19], 0 offen lds"),
    ("buffer_load_dword v1, v2, s[4:7], 0 offen", "buffer_load_dword v1, v2, s[4:7], s3 offen"),
    ("buffer_load_dword v1, v2, s[4:7], 0 offen", "buffer_load_dword v1, v2, s[4:7], 0 offen offset:16"),
    ("s_load_dword s1, s[2:3], 0x10", "s_load_dword s1, s[2:3], s4"),
    ("v_add_f32_dpp v1, v2, v3 row_shr:1 row_mask:0xf bank_mask:0xf",
     "v_add_f32_dpp v1, v2, v3 row_shr:2 row_mask:0xf bank_mask:0xf"),
    ("v_add_f32_e64 v1, v2, v3", "v_add_f32_e64 v1, -v2, v3"),
    ("v_mfma_f32_32x32x64_f8f6f4 v[0:15], v[16:23], v[24:31], v[0:15]",
     "v_mfma_f32_32x32x64_f8f6f4 v[0:15], v[16:23], v[24:31], v[0:15] cbsz:1 blgp:1"),
])
def test_forms_separate_what_changes_meaning(a, b):
    assert form(a) != form(b)


def test_offset_values_and_registers_do_not_make_new_forms():
    assert form("ds_read_b128 v[20:23], v218 offset:16640") == form("ds_read_b128 v[4:7], v1 offset:16")
    assert form("s_add_u32 s1, s2, s3") == form("s_add_u32 s10, s20, s30")


def test_recorder_sees_only_executed_instructions():
    """A branch skips one instruction: its form is in the object, not in the record."""
    import gfxasm.emu as emu
    from kernel_source import assemble, kernel_source
    code = "  s_branch L_skip\n  v_mul_u32_u24 v1, v0, v0\nL_skip:\n  v_add_u32 v1, v0, v0\n  s_endpgm"
    obj = assemble(kernel_source("forms", code, args=()))
    recorder = evidence.FormRecorder()
    emu.load(obj).kernel("forms").launch(grid=(1, 1, 1), block=(64, 1, 1), trace=recorder)
    assert "v_add_u32_e32 v,v,v" in recorder.forms and "s_endpgm" in recorder.forms
    assert not any(f.startswith("v_mul_u32_u24") for f in recorder.forms)


def test_ledger_counts_only_passing_cases():
    ours = {"a": {"k1"}, "b": {"k1", "k2"}, "c": {"k2"}}
    cases = {"pass": {"passed": True, "forms": ["a", "z"]}, "fail": {"passed": False, "forms": ["b"]}}
    ledger = evidence.Ledger(ours, evidence.evidence_forms(cases))
    assert ledger.covered == ["a"] and ledger.uncovered == ["b", "c"]
    out = ledger.to_json()
    assert (out["forms"], out["covered"], out["uncovered"]) == (3, 1, 2)
    assert out["covered_by"] == {"a": ["pass"]} and set(out["uncovered_forms"]) == {"b", "c"}


def test_evidence_command_on_one_small_case(tmp_path, monkeypatch, capsys, fixture_manifest):
    """The real corpus (needs `gfxasm corpus fetch`): one conformance case recorded into a
    fresh cache, then reused; the figures add up (one fixture object stands for ours)."""
    from gfxasm.corpus_cli import corpus_main
    corpus.root()                                        # CorpusMissing names the fetch command
    monkeypatch.setattr("gfxasm.corpus_cli.EVIDENCE_CACHE", str(tmp_path / "cases.json"))
    out = tmp_path / "ledger.json"
    args = ["evidence", "--cases", "bf16gemm_outf32_48x64_M100_N128_K64", "--objects", "fixtures/axpb.co",
            "--jobs", "1", "--json", str(out)]
    assert corpus_main(args) == 0
    first = capsys.readouterr().out
    assert "running 1 conformance cases" in first
    ledger = json.loads(out.read_text())
    assert ledger["forms"] == ledger["covered"] + ledger["uncovered"] and ledger["covered"] > 0
    assert corpus_main(args) == 0
    assert "running" not in capsys.readouterr().out          # the cache answered
    assert json.loads((tmp_path / "cases.json").read_text())["bf16gemm_outf32_48x64_M100_N128_K64"]["passed"]
