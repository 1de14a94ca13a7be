"""Errors raised by the gfx950 emulator. Each names where it happened."""
from __future__ import annotations


class EmulatorError(RuntimeError):
    """Base class: something the emulated program did, or that the emulator cannot model."""


class DecodeError(EmulatorError):
    pass


class UnsupportedInstruction(EmulatorError):
    """An instruction (or a form/modifier of one) the emulator does not implement."""


class MemoryFault(EmulatorError):
    """An access outside every registered buffer, or outside the LDS allocation."""


class HazardError(EmulatorError):
    """Strict mode: a missing s_waitcnt, a missing wait state, or a race on LDS."""


class LaunchError(EmulatorError):
    """Launch arguments the kernel descriptor cannot run with."""


class DeadlockError(EmulatorError):
    """Workgroups wait on memory that nothing left to run can change (named with their pcs)."""
