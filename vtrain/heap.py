"""Freed memory kept in the process for the next step's tensors.

A training step allocates and frees the same large tensors in every step. glibc's malloc hands memory back to
the kernel in two ways: a request above M_MMAP_THRESHOLD gets a mapping of its own, unmapped when freed (the
threshold follows the largest mapping freed so far, up to 32 MiB), and free memory at the top of the heap beyond
M_TRIM_THRESHOLD (twice that) is released. Either way the next step's tensors land in fresh pages, and the
kernel faults in and zeroes every 4 KiB page of them again:

- GPT-2-tiny at d_model 512: the heap grew and shrank by 16.8 MB some 13 times a step, 10,000-80,000 faults
  a step, 25-250 ms of an 850-1,100 ms step in the kernel;
- resnet-tiny at width 64: torch's float64 convolutions unfold a whole batch into a 151 MB buffer (64 channels
  x 3 x 3 taps x 32 x 32 pixels x 32 images), mapped and unmapped ~3 times a step, 147,000-213,000 faults,
  190-270 ms of a 1,000-1,250 ms step (the plain float64 step's too: 850 against 1,030 ms without them).

With no mappings and no trimming, the main thread's heap grows to a step's peak once and serves every later step
from pages already mapped: 0 faults a step from the third step or so on. Other threads' arenas are not covered
above 64 MiB: such a request gets a mapping of its own whatever M_MMAP_MAX says (glibc's last resort after its
64 MiB heaps), and still faults.

The price is resident memory: the process keeps its heap, and freed blocks of one size do not always fit the
next step's requests of another. A trainer and an auditor stepping in one process for 40 steps held 1,190 MB at
GPT-2-tiny d_model 256 against 1,074 (peak 1,138) without the settings, 1,326 against 1,034 (peak 1,106) at
resnet-tiny width 32, flat from step 20-30 on. With two threads working on large tensors it can be far more: a
review's loop of 4000 x 4000 float64 ops settled at 1.7-2.7 GB against a 1.0 GB peak (its steps 1.7-1.8 against
2.1-2.2 s). Set VTRAIN_KEEP_FREED_MEMORY=0 to leave malloc as it is. Only glibc has these settings; elsewhere
this does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

# glibc's malloc.h
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_NEVER = -1  # as M_TRIM_THRESHOLD: no trimming at all (mallopt(3))
_NO_MAPPINGS = 0  # as M_MMAP_MAX: no request gets a mapping of its own (the main arena's; see above)
OPT_OUT = "VTRAIN_KEEP_FREED_MEMORY"


@functools.cache
def keep_freed_memory() -> bool:
    """Stop this process's malloc from returning freed memory to the kernel (see the module docstring), once per
    process, unless the environment sets VTRAIN_KEEP_FREED_MEMORY=0. True where the C library's mallopt took
    both settings: glibc's (which accepts any parameter, so a malloc preloaded in its place may ignore them)."""
    if os.environ.get(OPT_OUT, "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # (musl's mallopt exists and refuses everything: 0)
    return mallopt(_M_MMAP_MAX, _NO_MAPPINGS) == 1 and mallopt(_M_TRIM_THRESHOLD, _NEVER) == 1
