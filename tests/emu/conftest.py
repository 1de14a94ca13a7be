"""tests/emu: the emulator's compiled bookkeeping (gfxasm.emu.fast) serves every strict
launch here, however small (it normally waits for launches of fast.MIN_WAVES waves), so
the strict-mode tests check it as they check the numpy paths; where numba is absent they
check the numpy paths alone."""
import pytest

from gfxasm.emu import fast


@pytest.fixture(autouse=True)
def _compiled_bookkeeping_for_every_launch(monkeypatch):
    monkeypatch.setattr(fast, "MIN_WAVES", 1)
