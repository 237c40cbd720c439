"""Keeping freed C-heap memory in the process: checked in fresh processes, since the setting is
process-wide and glibc's default behaviour is the baseline."""

import subprocess
import sys

import pytest

from tidepool.pool.host_heap import minor_page_faults, retain_freed_memory

# Allocates, writes and frees 64 MiB three times through malloc; prints the page faults of the
# last two rounds (the first one maps the memory in either case). Modes: default (glibc as it
# is), retain (freed memory kept), release (kept, and the free pages released before round 3).
ROUNDS = """
import ctypes, sys
from tidepool.pool.host_heap import minor_page_faults, release_free_pages, retain_freed_memory
if sys.argv[1] != "default":
    assert retain_freed_memory().applied
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
faults = []
for round_number in range(3):
    if sys.argv[1] == "release" and round_number == 2:
        assert release_free_pages()
    before = minor_page_faults()
    block = libc.malloc(64 << 20)
    ctypes.memset(block, 1, 64 << 20)
    libc.free(block)
    faults.append(minor_page_faults() - before)
print(faults[1], faults[2])
"""


def faults_of_later_rounds(mode: str) -> tuple[int, int]:
    done = subprocess.run([sys.executable, "-c", ROUNDS, mode], capture_output=True, text=True, check=True)
    second, third = done.stdout.split()
    return int(second), int(third)


def test_retained_memory_is_reused_without_fresh_page_faults():
    assert min(faults_of_later_rounds("default")) > 200  # glibc's default: 64 MiB mapped afresh
    assert max(faults_of_later_rounds("retain")) < 100


def test_released_free_pages_are_faulted_in_again():
    kept, after_release = faults_of_later_rounds("release")
    assert kept < 100 and after_release > 1000


def test_retention_reports_what_it_did():
    """In a process of its own: mallopt's settings are process-wide and cannot be read back."""
    check = (
        "from tidepool.pool.host_heap import retain_freed_memory\n"
        "retention = retain_freed_memory(max_retained_block=1 << 30)\n"
        "print(retention.applied, retention.max_retained_block, retention.reason)\n"
    )
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True)
    applied, limit, reason = done.stdout.split(maxsplit=2)
    assert applied == "True" and int(limit) == 1 << 30 and "glibc" in reason
    with pytest.raises(ValueError, match="max_retained_block"):
        retain_freed_memory(max_retained_block=0)  # refused before any setting changes


def test_page_faults_count_memory_touched_afresh():
    import mmap

    before = minor_page_faults()
    with mmap.mmap(-1, 4 << 20) as fresh:
        for offset in range(0, 4 << 20, 4096):
            fresh[offset] = 1
    assert minor_page_faults() - before >= 1000  # 1024 pages
