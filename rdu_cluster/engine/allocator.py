"""The C allocator's thresholds for a run: freed memory kept for reuse instead of handed back
to the kernel and faulted in again.

glibc's malloc returns the free top of its heap to the kernel past M_TRIM_THRESHOLD and serves
blocks past M_MMAP_THRESHOLD from mmap, unmapped when freed; it starts both low (128 KiB) and
raises them as a process frees such blocks, up to 32 MiB for mmap and twice that for trimming.
A serving run makes and frees numpy arrays and Python objects window after window, and at
light load each new window touched pages the last one had given back: measured with
`/usr/bin/time -v` on `benchmarks/bench_serve.py`'s light workload (80,000 requests at 50/s,
Llama 3.1 8B on sn40l-8), 290,000 minor page faults and 2.0 s of system time against 48,000
and 0.9 s with the thresholds fixed at those maxima from the start (the saturated run: 63,000
and 1.0 s against 49,000 and 0.9 s). That is the setting here: what glibc converges to, at once.
Elsewhere (musl, macOS) nothing is changed. Results do not depend on it.
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt(3) parameter numbers (malloc.h)
MMAP_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # glibc's dynamic rule: twice the mmap threshold

_applied: bool | None = None  # None: not tried yet in this process


def keep_freed_memory() -> bool:
    """Fix glibc's thresholds (once a process: mallopt has no way back to the dynamic ones);
    whether they are set."""
    global _applied
    if _applied is None:
        _applied = _mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and _mallopt(
            M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    return _applied


def _mallopt(param: int, value: int) -> bool:
    try:
        # the process's own symbols: glibc's mallopt where Python runs on glibc
        return bool(ctypes.CDLL(None).mallopt(param, value))  # 1 on success (musl: 0)
    except (OSError, AttributeError):  # no mallopt to call (macOS, Windows)
        return False
