"""Helpers of the model-family tests: small files in the CIFAR-10 and text-corpus formats.

The files are generated, not downloaded, but in exactly the formats the loaders read: pickled
python batches (dict with b"data" uint8 (N, 3072) and b"labels") and a UTF-8 text file. Both
carry learnable structure so that the loss visibly falls in a few dozen steps.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from vtrain.loaders import CIFAR_TRAIN_FILES

WORDS = ("the king", "a queen", "my lord", "good sir", "fair lady", "this night", "thy sword", "our crown")
VERBS = ("doth speak", "shall rise", "hath fallen", "will sing", "must go", "doth weep")


def write_cifar(directory: Path, per_batch: int = 64, seed: int = 0) -> Path:
    """A cifar-10-batches-py-like directory: 5 train batches; class k has a colour and a stripe."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for name in CIFAR_TRAIN_FILES:
        labels = rng.integers(0, 10, per_batch)
        img = rng.integers(0, 96, (per_batch, 3, 32, 32))
        for i, k in enumerate(labels):
            img[i, k % 3] += 80 + 12 * k                     # class colour
            img[i, :, (k * 3) % 32, :] += 60                  # class stripe
        data = np.clip(img, 0, 255).astype(np.uint8).reshape(per_batch, 3072)
        with open(directory / name, "wb") as f:
            pickle.dump({b"batch_label": name.encode(), b"labels": labels.tolist(), b"data": data,
                         b"filenames": [b"x.png"] * per_batch}, f)
    return directory


def write_corpus(path: Path, lines: int = 400, seed: int = 0) -> Path:
    """A small play-like text: speaker lines made of a few phrases, so characters are predictable."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(lines):
        speaker = ("KING", "QUEEN", "HAMLET")[i % 3]
        out.append(f"{speaker}:\n{WORDS[rng.integers(len(WORDS))]} {VERBS[rng.integers(len(VERBS))]}.\n")
    path.write_text("\n".join(out), encoding="utf-8")
    return path


ROOT = Path(__file__).resolve().parents[2]


def family_spec(name: str, data: dict[str, Path], **changes):
    """An example spec (e.g. "gpt2-tiny" or "scale/resnet-tiny") pointed at the generated data."""
    import dataclasses

    from vtrain.spec import load_spec
    spec = load_spec(ROOT / "examples" / f"{name}.toml")
    return dataclasses.replace(spec, data_path=str(data[spec.dataset]), **changes)


class RunCache:
    """Train each (spec, device) once per test session."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.runs: dict[tuple, Path] = {}

    def get(self, spec, device: str = "cpu") -> Path:
        from vtrain.spec import to_toml
        from vtrain.train import train
        key = (spec.to_json(), device)
        if key not in self.runs:
            out = self.base / f"run{len(self.runs)}"
            train(spec, out, spec_toml=to_toml(spec), device=device)
            self.runs[key] = out
        return self.runs[key]


def cli(*args: str):
    """Run `vtrain ARGS` in this process through click's runner; (exit code, stdout, stderr)."""
    from click.testing import CliRunner

    from protocol.cli import main
    r = CliRunner().invoke(main, list(args), env={"VTRAIN_THREADS": "1"})
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, r.stdout, r.stderr
