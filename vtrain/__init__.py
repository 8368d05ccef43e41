"""vtrain: verifiable training on the FP32 grid with certified rounding logs.

The package imports lazily so `import vtrain` stays cheap (no torch) for the chain side:
    round_to_grid, rev          rounding onto the b-bit grid (vtrain.grid)
    VtrainError                 root of every deliberate error (vtrain.errors)
    Spec, load_spec             run specs (vtrain.spec)
    TrainingSession             a spec's model and optimizer executing steps (vtrain.train)
    replay_step, AuditReport    the referee's tool and the auditor's report (vtrain.audit)
    Run                         reading a run directory (vtrain.run)
The trainer and the auditor themselves are vtrain.train.train and vtrain.audit.audit: at package
level those two names are the submodules.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from vtrain.errors import VtrainError
from vtrain.numba_cache import use_source_keyed_cache

use_source_keyed_cache(Path(__file__).parent)  # (before any module compiles: see vtrain.numba_cache)

_EXPORTS = {
    "round_to_grid": "vtrain.grid", "rev": "vtrain.grid",
    "Spec": "vtrain.spec", "load_spec": "vtrain.spec", "SpecError": "vtrain.spec",
    "TrainingSession": "vtrain.train", "replay_step": "vtrain.audit", "AuditReport": "vtrain.audit",
    "Run": "vtrain.run", "RunError": "vtrain.run",
}

__all__ = ["VtrainError", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'vtrain' has no attribute {name!r}")
