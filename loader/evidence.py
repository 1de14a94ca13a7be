"""The evidence ledger: which instruction forms of our kernels hardware-built code confirms.

A *form* is a mnemonic with what changes its meaning: the encoding (e32/e64/dpp/sdwa),
each operand's kind and width (with neg/abs), and the modifiers that select behaviour
(op_sel/op_sel_hi/neg_lo/neg_hi, cbsz/abid/blgp, DPP controls and masks, SDWA selects,
the `lds` bit, offen/idxen, glc/slc/nt/sc0/sc1, and whether an immediate offset is there
at all — its value does not change the meaning). Forms of our kernels are taken from the
built objects (build/*.co), every decoded instruction: a superset of what the tests run,
so nothing executed is left out. Forms with evidence are those the hardware-built
conformance cases *executed* in launches whose output matched the reference (recorded
with the emulator's trace hook, cached per case by `gfxasm corpus evidence`).

A form with no such case rests on our reading alone; `settle_hint` says what would
settle it.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .emu.coverage import instructions

# Modifiers whose value changes what an instruction does. Offsets (offset, offset0/1,
# inst_offset) are reduced to "present"; everything else printed is kept whole.
_OFFSETS = ("offset", "offset0", "offset1")
_IGNORED = ("wait_va_vdst", "wait_vdst", "wait_exp")     # scheduling hints, no data meaning


def _operand(op) -> str:
    width = f"x{op.count}" if op.count > 1 else ""
    return ("-" if op.neg else "") + ("|" if op.abs else "") + op.kind + width


def form_of(inst) -> str:
    """The form of a decoded instruction (module docstring)."""
    parts = [inst.name + (f"_{inst.enc}" if inst.enc else "")]
    parts.append(",".join(_operand(op) for op in inst.ops))
    mods = []
    for key in sorted(inst.mods):
        if key in _IGNORED:
            continue
        value = inst.mods[key]
        if key in _OFFSETS:
            if value:
                mods.append(key)
        elif value is True or value is None:
            mods.append(key)
        else:
            mods.append(f"{key}:{value}")
    return " ".join(p for p in parts + [" ".join(mods)] if p)


def static_forms(path: Path) -> set[str]:
    """Every form that occurs in a code object."""
    return {form_of(inst) for inst in instructions(path)}


class FormRecorder:
    """A Kernel.launch trace hook that records the forms executed."""

    def __init__(self):
        self.forms: set[str] = set()
        self._seen: set[int] = set()

    def __call__(self, inst, w):
        key = id(inst)
        if key not in self._seen:
            self._seen.add(key)
            self.forms.add(form_of(inst))


def settle_hint(form: str) -> str:
    """What would settle a form that no hardware-built case executes."""
    name = form.split(" ", 1)[0]
    if name.startswith(("v_mfma", "v_smfmac")):
        what = "a corpus object whose passing case runs this MFMA with these modifiers (operand layout, scales)"
    elif name.startswith(("buffer_", "global_", "flat_", "scratch_")):
        what = "a conformance case whose kernel issues this access form (addressing, range check, cache bits)"
    elif name.startswith("ds_"):
        what = "a conformance case using this LDS access form (offsets, lane pattern)"
    elif name.startswith(("s_load", "s_buffer_load", "s_store")):
        what = "a conformance case using this scalar memory form"
    elif "_dpp" in name or " row_" in form or "quad_perm" in form:
        what = "a conformance case with this DPP control"
    elif name.startswith("v_cvt") or "_f8" in name or "fp8" in name or "bf8" in name:
        what = "a conformance case exercising this conversion (rounding, saturation, NaN) or an ISA test vector"
    else:
        what = "a conformance case executing it, or an LLVM/ISA-documented test vector for its semantics"
    return what


@dataclass
class Ledger:
    ours: dict[str, set[str]]                  # form -> our objects that contain it
    evidence: dict[str, set[str]]              # form -> passing hardware-built cases that executed it
    covered: list[str] = field(init=False)
    uncovered: list[str] = field(init=False)

    def __post_init__(self):
        self.covered = sorted(f for f in self.ours if self.evidence.get(f))
        self.uncovered = sorted(f for f in self.ours if not self.evidence.get(f))

    def to_json(self) -> dict:
        return {"forms": len(self.ours), "covered": len(self.covered), "uncovered": len(self.uncovered),
                "covered_by": {f: sorted(self.evidence[f]) for f in self.covered},
                "uncovered_forms": {f: {"in": sorted(self.ours[f]), "would_settle": settle_hint(f)}
                                    for f in self.uncovered}}


def our_forms(objects) -> dict[str, set[str]]:
    forms: dict[str, set[str]] = defaultdict(set)
    for path in objects:
        for form in static_forms(path):
            forms[form].add(Path(path).stem)
    return dict(forms)


def load_case_forms(cache: Path) -> dict[str, dict]:
    return json.loads(cache.read_text()) if cache.is_file() else {}


def evidence_forms(case_forms: dict[str, dict]) -> dict[str, set[str]]:
    """form -> cases that executed it and passed, from the per-case cache."""
    out: dict[str, set[str]] = defaultdict(set)
    for case, entry in case_forms.items():
        if entry["passed"]:
            for form in entry["forms"]:
                out[form].add(case)
    return dict(out)
