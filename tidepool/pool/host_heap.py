"""The process's C heap as the host pool's second tier: torch's own CPU tensors come from glibc
malloc, which by default unmaps large freed blocks, so every execution page-faults them in again.
`retain_freed_memory` makes glibc keep them for the next execution instead."""

from __future__ import annotations

import ctypes
import resource
from dataclasses import dataclass

# mallopt parameters (glibc malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

DEFAULT_MAX_RETAINED_BLOCK = 1 << 30  # blocks above this are still mapped and unmapped per use
_INT_MAX = 2**31 - 1  # mallopt takes an int


@dataclass(frozen=True)
class HeapRetention:
    """What `retain_freed_memory` did: whether glibc took the settings, and why not if it did not."""

    applied: bool
    reason: str
    max_retained_block: int = 0


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    if not (hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt")):
        return None  # musl, macOS: another malloc with other knobs
    libc.gnu_get_libc_version.restype = ctypes.c_char_p
    return libc


def retain_freed_memory(max_retained_block: int = DEFAULT_MAX_RETAINED_BLOCK) -> HeapRetention:
    """Keep freed heap memory in the process: blocks up to `max_retained_block` come from the heap
    rather than fresh mappings, and the heap's top is never given back on free. Process-wide, so
    meant for a process that serves one model instance (a Triton Python stub is one). The memory
    kept is bounded by the heap's high-water mark: the largest execution seen, plus glibc's
    fragmentation (see `release_free_pages`)."""
    if not 0 < max_retained_block <= _INT_MAX:
        raise ValueError(f"max_retained_block must be in 1..{_INT_MAX}, got {max_retained_block}")
    libc = _glibc()
    if libc is None:
        return HeapRetention(False, "not glibc: the C library has no mallopt; freed memory is not retained")
    if not libc.mallopt(_M_MMAP_THRESHOLD, max_retained_block):
        return HeapRetention(False, f"glibc refused an mmap threshold of {max_retained_block} bytes")
    if not libc.mallopt(_M_TRIM_THRESHOLD, _INT_MAX):
        return HeapRetention(False, "glibc refused a trim threshold")
    version = libc.gnu_get_libc_version().decode()
    return HeapRetention(
        True, f"glibc {version}: heap keeps freed blocks up to {max_retained_block} bytes", max_retained_block
    )


def release_free_pages() -> bool:
    """Give the pages of the heap's free chunks back to the kernel (malloc_trim), keeping the
    chunks themselves; True if any page went back (never where the C library is not glibc)."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))


def minor_page_faults() -> int:
    """Minor page faults of this process so far: memory touched for the first time (or again after
    it was given back). Zero growth across an execution means it allocated nothing fresh."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
