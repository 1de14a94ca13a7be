#!/usr/bin/env python3
"""A stand-in llvm-objdump for a machine without LLVM (the device machine): it replays the
output the real llvm-objdump gave for the same code object on the build machine.

    python3 bench/objdump_standin.py record DIR build           # every .co under build/ (here)
    DIR/bin/llvm-objdump -d --mcpu=gfx950 x.co                   # there: the recorded output

`record` runs the real `llvm-objdump -d --mcpu=gfx950` (gfxasm.toolchain finds it) on each
object and stores its output, gzipped, under DIR/records/<sha256 of the object>, and installs this
script as DIR/bin/llvm-objdump (LLVM_BIN=DIR/bin then makes gfxasm's decoder use it, and
llvm-objdump-22 is the same script for tools that look for the versioned name). Replaying,
it accepts only the arguments gfxasm.disasm.objdump passes and an object it has a record
of; anything else fails, naming what is missing, so nothing is decoded from a guess.
"""
from __future__ import annotations

import gzip
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

MCPU = "--mcpu=gfx950"


def record(folder: Path, trees: list[Path]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from gfxasm.toolchain import find_tool
    objdump = find_tool("llvm-objdump")
    records = folder / "records"
    records.mkdir(parents=True, exist_ok=True)
    n = 0
    for tree in trees:
        for co in sorted(tree.rglob("*.co")):
            out = subprocess.run([objdump, "-d", MCPU, str(co)], capture_output=True, text=True, check=True).stdout
            (records / hashlib.sha256(co.read_bytes()).hexdigest()).write_bytes(gzip.compress(out.encode()))
            n += 1
    bin_dir = folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("llvm-objdump", "llvm-objdump-22"):
        shutil.copy(__file__, bin_dir / name)
        (bin_dir / name).chmod(0o755)
    print(f"recorded {n} objects into {records}")


def replay(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "-d" or argv[1] != MCPU:
        print(f"stand-in llvm-objdump: only '-d {MCPU} FILE' is recorded, got {argv}", file=sys.stderr)
        return 2
    digest = hashlib.sha256(Path(argv[2]).read_bytes()).hexdigest()
    found = Path(__file__).resolve().parents[1] / "records" / digest
    if not found.is_file():
        print(f"stand-in llvm-objdump: no recorded disassembly of {argv[2]} (sha256 {digest})", file=sys.stderr)
        return 1
    sys.stdout.write(gzip.decompress(found.read_bytes()).decode())
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["record"]:
        record(Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]])
    else:
        sys.exit(replay(sys.argv[1:]))
