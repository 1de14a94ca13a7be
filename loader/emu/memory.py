"""Global memory as seen by the emulator: only registered buffers are addressable.

A buffer is a CPU torch tensor, a contiguous numpy array, or a span of a tensor's bytes
(tensor, byte offset, byte count): several buffers carved from one allocation, each
addressable only within its own bytes. The emulator reads and writes the storage in place at
its real host address, so the kernarg can hold `tensor.data_ptr()` values (plus a span's
offset) exactly as the HIP backend would pass device pointers.
"""
from __future__ import annotations

import numpy as np


class OutOfBounds(Exception):
    """Raised with the flat lane position and address of the first bad access."""

    def __init__(self, position: int, address: int, nbytes: int):
        super().__init__(position, address, nbytes)
        self.position, self.address, self.nbytes = position, address, nbytes


def _storage_bytes(buf) -> tuple[int, np.ndarray, str]:
    """(base address, uint8 view of the whole storage, or of a span's bytes, description) of a buffer."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        torch = None
    if isinstance(buf, tuple):
        return _span_bytes(*buf)
    if torch is not None and isinstance(buf, torch.Tensor):
        if buf.device.type != "cpu":
            raise TypeError(f"emulator buffers must be CPU tensors, got one on {buf.device}")
        storage = buf.untyped_storage()
        view = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
        return storage.data_ptr(), view, f"tensor{tuple(buf.shape)} {buf.dtype}"
    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous:
            raise TypeError("emulator numpy buffers must be C-contiguous")
        view = buf.reshape(-1).view(np.uint8)
        return buf.__array_interface__["data"][0], view, f"ndarray{buf.shape} {buf.dtype}"
    raise TypeError(f"emulator buffers must be torch tensors or numpy arrays, got {type(buf).__name__}")


def _span_bytes(tensor, offset: int, nbytes: int) -> tuple[int, np.ndarray, str]:
    """A span of `nbytes` bytes at byte `offset` from a CPU tensor's data pointer, within its storage."""
    start, view, desc = _storage_bytes(tensor)
    first = tensor.data_ptr() - start + offset
    if offset < 0 or nbytes < 0 or first + nbytes > view.size:
        raise ValueError(f"span of {nbytes} bytes at offset {offset} lies outside {desc}'s storage")
    return start + first, view[first:first + nbytes], f"{desc} bytes {offset}..{offset + nbytes}"


class Memory:
    def __init__(self):
        self._bases = np.zeros(0, dtype=np.uint64)
        self._ends = np.zeros(0, dtype=np.uint64)
        self._views: list[np.ndarray] = []
        self.names: list[str] = []
        # Bumped by every write (watch_values: only by a write that changes a byte): a wave
        # spinning on memory sees whether anything it could wait for happened (concurrent.py).
        self.version = 0
        self.watch_values = False

    def register(self, buf, name: str | None = None, base: int | None = None) -> int:
        """Make buf's storage addressable at its host address, or at `base` (a copy of a
        launch's memory in another process keeps the addresses the kernarg holds)."""
        real, view, desc = _storage_bytes(buf)
        base = real if base is None else base
        end = base + view.size
        for b, e, n in zip(self._bases, self._ends, self.names):
            if base < int(e) and int(b) < end:
                if int(b) == base and int(e) == end:
                    return base   # the same storage registered twice (e.g. two views)
                raise ValueError(f"buffer {name or desc} overlaps registered buffer {n}")
        order = np.searchsorted(self._bases, base)
        self._bases = np.insert(self._bases, order, np.uint64(base))
        self._ends = np.insert(self._ends, order, np.uint64(end))
        self._views.insert(order, view)
        self.names.insert(order, name or desc)
        return base

    def regions(self) -> list[tuple[int, np.ndarray, str]]:
        """(base address, uint8 view, name) of every registered buffer, by address."""
        return [(int(b), v, n) for b, v, n in zip(self._bases, self._views, self.names)]

    def _locate(self, addr: np.ndarray, nbytes: int) -> np.ndarray:
        """Region index of each address; raises OutOfBounds for the first bad one."""
        region = np.searchsorted(self._bases, addr, side="right").astype(np.int64) - 1
        ok = region >= 0
        safe = np.where(ok, region, 0)
        if self._ends.size:
            ok &= addr + np.uint64(nbytes) <= self._ends[safe]
        else:
            ok[:] = False
        if not ok.all():
            bad = int(np.argmin(ok))
            raise OutOfBounds(bad, int(addr[bad]), nbytes)
        return safe

    def read(self, addr: np.ndarray, nbytes: int) -> np.ndarray:
        """Bytes [len(addr), nbytes] at the given addresses (uint64)."""
        addr = np.asarray(addr, dtype=np.uint64).reshape(-1)
        out = np.empty((addr.size, nbytes), dtype=np.uint8)
        if addr.size == 0:
            return out
        span = np.arange(nbytes, dtype=np.int64)
        for r, sel in self._regions(addr, nbytes):
            off = (addr[sel] - self._bases[r]).astype(np.int64)
            view = self._views[r]
            if nbytes % 4 == 0 and view.size % 4 == 0 and not (off & 3).any():
                # whole aligned dwords: the same bytes, gathered four at a time
                words = view.view(np.uint32)[(off >> 2)[:, None] + span[:nbytes // 4]]
                out[sel] = words.view(np.uint8).reshape(-1, nbytes)
            else:
                out[sel] = view[off[:, None] + span]
        return out

    def _regions(self, addr: np.ndarray, nbytes: int):
        """[(region, selection of addr)]: one entry with every address (slice(None)) when
        all fall in one region, the common case, else a boolean selection per region."""
        region = self._locate(addr, nbytes)
        first = int(region[0])
        if int(region.min()) == first == int(region.max()):
            return [(first, slice(None))]
        return [(r, region == r) for r in np.unique(region)]

    def write(self, addr: np.ndarray, data: np.ndarray) -> None:
        """Store rows of bytes; later rows win where addresses repeat (lane order)."""
        addr = np.asarray(addr, dtype=np.uint64).reshape(-1)
        if addr.size == 0:
            return
        nbytes = data.shape[1]
        span = np.arange(nbytes, dtype=np.int64)
        for r, sel in self._regions(addr, nbytes):
            at = (addr[sel] - self._bases[r]).astype(np.int64)[:, None] + span
            view = self._views[r]
            if not self.watch_values or not np.array_equal(view[at], data[sel]):
                self.version += 1
            view[at] = data[sel]

    def view_at(self, addr: int, nbytes: int) -> np.ndarray:
        """A writable uint8 view of [addr, addr+nbytes) inside one registered buffer."""
        region = self._locate(np.array([addr], dtype=np.uint64), nbytes)[0]
        off = addr - int(self._bases[region])
        return self._views[region][off:off + nbytes]
