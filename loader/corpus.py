"""The corpus: hardware-proven gfx950 code objects from a pinned public aiter wheel.

`amd-aiter==0.1.7.post2.dev18` on the package index carries 1,220 gfx950 code objects
(`aiter_meta/hsa/gfx950/**`) that AMD ships and runs on MI350X/MI355X, the host code that
launches each (`aiter_meta/csrc/**`) and aiter's tuning tables with MI355X timings
(`aiter/configs/**`). gfxasm treats it as test data fetched by version and hash, like a
data set: nothing of it is committed to this repository.

`fetch()` downloads the wheel with pip (no dependencies), checks its sha256 and extracts
those three trees into the cache (`$GFXASM_CORPUS_DIR`, else `$XDG_CACHE_HOME/gfxasm` or
`~/.cache/gfxasm`). `root()` is where every reader finds it; when it is absent it raises
`CorpusMissing` naming the command that fetches it, never a silent skip.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "amd-aiter"
VERSION = "0.1.7.post2.dev18"
WHEEL = "amd_aiter-0.1.7.post2.dev18-py3-none-any.whl"
SHA256 = "fe139d74438217c35e87e3b961166bac8db2d381eadccb371da2e63615f05a31"
# The parts of the wheel gfxasm reads: code objects (all archs' CSV manifests sit beside
# them), the host launch code, and the tuning tables.
MEMBERS = ("aiter_meta/hsa/", "aiter_meta/csrc/", "aiter/configs/")
GFX950_DIR = "aiter_meta/hsa/gfx950"
FETCH_COMMAND = "gfxasm corpus fetch"
CACHE_ENV = "GFXASM_CORPUS_DIR"
_COMPLETE = ".complete"            # written last: a half-extracted tree is never taken


class CorpusMissing(FileNotFoundError):
    pass


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gfxasm"


def _tree() -> Path:
    return cache_dir() / f"{PACKAGE}-{VERSION}"


def root() -> Path:
    """The extracted wheel (holds aiter_meta/ and aiter/configs/)."""
    tree = _tree()
    if not (tree / _COMPLETE).is_file():
        raise CorpusMissing(f"the gfx950 corpus ({PACKAGE}=={VERSION}) is not in {tree}: run "
                            f"`{FETCH_COMMAND}` (downloads a 40 MB wheel with pip, checks its sha256)")
    return tree


def path(relative: str) -> Path:
    """A file of the corpus, e.g. 'aiter_meta/hsa/gfx950/pa/pa_bf16_noquant_gqa8_1tg_4w.co'."""
    p = root() / relative
    if not p.exists():
        raise FileNotFoundError(f"{relative} is not in the corpus {PACKAGE}=={VERSION}")
    return p


def gfx950_code_objects() -> list[Path]:
    return sorted((root() / GFX950_DIR).rglob("*.co"))


def sha256_of(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download(into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-d", str(into), f"{PACKAGE}=={VERSION}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheel = into / WHEEL
    if done.returncode != 0 or not wheel.is_file():
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({done.returncode}):\n{done.stderr.strip()[-2000:]}")
    return wheel


def fetch(wheel: Path | None = None, log=print) -> Path:
    """Make the corpus available (idempotent). `wheel`: a copy already on disk, else pip."""
    tree = _tree()
    if (tree / _COMPLETE).is_file():
        return tree
    tree.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tree.parent) as tmp:
        if wheel is None:
            log(f"downloading {PACKAGE}=={VERSION} with pip ...")
            wheel = _download(Path(tmp))
        got = sha256_of(Path(wheel))
        if got != SHA256:
            raise RuntimeError(f"{wheel}: sha256 {got} is not the pinned {SHA256}; refusing it")
        staging = Path(tmp) / "tree"
        with zipfile.ZipFile(wheel) as z:
            for member in z.namelist():
                if member.startswith(MEMBERS) and not member.endswith("/"):
                    z.extract(member, staging)
        (staging / _COMPLETE).write_text(f"{WHEEL} sha256 {SHA256}\n")
        if tree.exists():                       # an earlier, interrupted extraction
            shutil.rmtree(tree)
        staging.rename(tree)
    log(f"corpus ready: {tree} ({len(gfx950_code_objects())} gfx950 code objects)")
    return tree
