"""Static coverage: can the emulator run a code object, judged without running it?

An object is covered when LLVM's disassembler output for it decodes, every mnemonic has
a handler in the registry, and every instruction passes its handler's data-independent
`check` (formats and operand shapes; see registry.py). Limits that depend on data (a
partial EXEC mask on an MFMA, an out-of-range scalar buffer load) only show when a case
runs: coverage is necessary for running a kernel, not proof that every launch of it runs.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..codeobj import CodeObjectError, load_code_object
from . import families  # noqa: F401  (registers every handler)
from .decode import decode
from .errors import EmulatorError
from .registry import HANDLERS


@dataclass
class ObjectCoverage:
    path: Path
    decode_error: str = ""
    missing: set[str] = field(default_factory=set)            # mnemonics with no handler
    rejected: dict[str, str] = field(default_factory=dict)    # mnemonic -> first check error

    @property
    def covered(self) -> bool:
        return not (self.decode_error or self.missing or self.rejected)


def instructions(path: Path) -> list:
    """Every decoded instruction of a code object (the evidence ledger reads forms from these)."""
    return decode(load_code_object(path).data)


def object_coverage(path: Path) -> ObjectCoverage:
    result = ObjectCoverage(Path(path))
    try:
        insts = instructions(path)
    except (EmulatorError, CodeObjectError) as exc:
        result.decode_error = str(exc)
        return result
    for inst in insts:
        handler = HANDLERS.get(inst.name)
        if handler is None:
            result.missing.add(inst.name)
        elif handler.check is not None and inst.name not in result.rejected:
            try:
                handler.check(inst)
            except EmulatorError as exc:
                result.rejected[inst.name] = str(exc)
    return result


@dataclass
class CoverageReport:
    objects: list[ObjectCoverage]

    @property
    def covered(self) -> int:
        return sum(o.covered for o in self.objects)

    def blockers(self) -> Counter:
        """How many objects each missing mnemonic, rejected format or decode error blocks."""
        count: Counter = Counter()
        for o in self.objects:
            if o.decode_error:
                count[f"decode: {o.decode_error.splitlines()[0][:100]}"] += 1
            for name in o.missing:
                count[f"missing: {name}"] += 1
            for name, why in o.rejected.items():
                count[f"format: {name}: {why[:100]}"] += 1
        return count


def coverage(paths) -> CoverageReport:
    return CoverageReport([object_coverage(p) for p in paths])
