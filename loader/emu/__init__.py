"""gfxasm's gfx950 functional emulator (see kernel.py for the public API)."""
from .errors import (DeadlockError, DecodeError, EmulatorError, HazardError, LaunchError, MemoryFault,
                     UnsupportedInstruction)
from .kernel import Kernel, LaunchResult, Module, load

__all__ = ["load", "Module", "Kernel", "LaunchResult", "EmulatorError", "DecodeError",
           "HazardError", "DeadlockError", "LaunchError", "MemoryFault", "UnsupportedInstruction"]
