"""gfxasm: hand-written gfx950 kernels, their loader, and a strict gfx950 emulator."""
from .launch import launch

__all__ = ["launch"]
