"""Helpers for the engine tests: example specs, cached runs, the CLI in- and out-of-process.

A module of its own (not conftest.py): several test folders have a conftest.py, and test modules
import helpers by module name.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import torch

from vtrain.spec import Spec, load_spec, to_toml

ROOT = Path(__file__).resolve().parents[2]

# one thread: several test processes share 2 cores, and oversubscribed OpenMP threads spin; the
# thread-count independence of results is tested explicitly (test_replication)
torch.set_num_threads(1)
EXAMPLES = ROOT / "examples"


def example(name: str, **changes) -> Spec:
    """An example spec (e.g. "mlp" or "scale/mlp"), optionally with some fields changed."""
    return dataclasses.replace(load_spec(EXAMPLES / f"{name}.toml"), **changes)


def emulated_devices() -> list[str]:
    from vtrain.devices import list_devices
    return [d.name for d in list_devices() if d.name.startswith("emu:")]


@dataclasses.dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def cli(*args: str, threads: int = 1, process: bool = False) -> CliResult:
    """Run `vtrain ARGS`: in this process through click's runner (cheap), or with `process` in a
    fresh process, exactly as a user runs it (costs a few seconds of imports)."""
    env = {"VTRAIN_THREADS": str(threads)}
    if process:
        r = subprocess.run([str(Path(sys.executable).parent / "vtrain"), *args], cwd=ROOT,
                           env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
        return CliResult(r.returncode, r.stdout, r.stderr)
    from click.testing import CliRunner

    from protocol.cli import main
    try:
        r = CliRunner().invoke(main, list(args), env=env)
    finally:
        torch.set_num_threads(1)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception   # an unexpected exception: show its traceback in the test report
    return CliResult(r.exit_code, r.stdout, r.stderr)


class RunCache:
    """Train each (spec, device, faults) once per test session."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.runs: dict[tuple, Path] = {}

    def get(self, spec: Spec, device: str = "cpu", faults: tuple = ()) -> Path:
        from vtrain.train import train
        key = (spec.to_json(), device, faults)
        if key not in self.runs:
            out = self.base / f"run{len(self.runs)}"
            train(spec, out, spec_toml=to_toml(spec), device=device, faults=faults)
            self.runs[key] = out
        return self.runs[key]
