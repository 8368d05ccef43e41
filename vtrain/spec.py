"""The run spec: one frozen dataclass of plain values, read from TOML, hashed as canonical JSON.

The spec hash is committed on-chain, so the spec is data only (no code, no includes) and it
round-trips: TOML -> Spec -> canonical JSON -> Spec gives the same hash. An unknown key, a wrong
type or an out-of-range value is a SpecError naming the key and the file.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vtrain.errors import VtrainError
from vtrain.leaves import keccak256


class SpecError(VtrainError):
    """A spec file is unreadable, has an unknown key, a wrong type or a value out of range."""


@dataclass(frozen=True)
class Spec:
    name: str = ""                 # free text; part of the hash like everything else
    # model
    model: str = "mlp"             # logreg | mlp | cnn | gpt2 | resnet
    hidden: int = 64               # mlp: width of each hidden layer
    depth: int = 2                 # mlp: number of hidden layers
    dropout: float = 0.0           # mlp: dropout probability after each hidden ReLU (masks from the seed)
    channels1: int = 8             # cnn: channels of the first 3x3 convolution
    channels2: int = 16            # cnn: channels of the second 3x3 convolution
    layers: int = 2                # gpt2: transformer blocks
    heads: int = 2                 # gpt2: attention heads (must divide d_model)
    d_model: int = 64              # gpt2: embedding width
    context: int = 64              # gpt2: tokens per training sequence
    stages: int = 2                # resnet: residual stages (width doubles, stride 2 after the first)
    blocks: int = 1                # resnet: basic blocks per stage
    width: int = 16                # resnet: channels of the stem and the first stage
    # data
    dataset: str = "digits"        # digits (sklearn, pixels/16, exact) | cifar10 (python batches) | text (chars)
    data_path: str = ""            # cifar10: the cifar-10-batches-py directory; text: a UTF-8 file
    data_hash: str = ""            # "0x" + keccak-256 of the data files' bytes: pins the data (empty: not pinned)
    batch_size: int = 32           # examples per step; epochs are seeded permutations, last partial batch dropped
    shards: int = 1                # micro-batches per step (gradients summed, canonically rounded); any
                                   # divisor of it may train or audit it as processes (--workers)
    # optimisation
    optimizer: str = "sgd"         # sgd | adam | adamw (torch.optim, foreach=False)
    lr: float = 0.05               # peak learning rate
    momentum: float = 0.9          # sgd: momentum (0 disables the buffer)
    weight_decay: float = 0.0      # sgd/adam: L2 added to the gradient; adamw: decoupled decay
    beta1: float = 0.9             # adam/adamw
    beta2: float = 0.999           # adam/adamw
    eps: float = 1e-8              # adam/adamw
    schedule: str = "constant"     # constant | cosine | warmup-cosine
    warmup_steps: int = 0          # warmup-cosine: linear warm-up length in steps
    min_lr: float = 0.0            # cosine schedules: learning rate reached at the last step
    steps: int = 100               # optimizer steps; the run has steps + 1 leaves (leaf 0 = initial state)
    seed: int = 0                  # data order, initialisation and dropout masks derive from it
    # numerics
    dtype: str = "float64"         # work dtype: float64 (production) or float32 (the scale model)
    bits: int = 32                 # grid width b: FP32-shaped with b - 9 mantissa bits; 32 = FP32
    resolution: str = "log"        # log: ambiguous roundings decided by the trainer and logged (the paper's
                                   # method) | exact: every op output is the correctly rounded exact value, no log
    canonical_version: int = 1     # exact: version of the op decompositions that define the computation
    log_policy: str = "bound"      # bound (a-priori error bounds) | tau (the paper's threshold)
    tau: float = 0.25              # tau policy: log when |v - rounded| > tau grid ulps
    checkpoint_interval: int = 1   # k: a state and a leaf after every k-th step and after the last one

    def __post_init__(self) -> None:
        _check(self)   # also guards dataclasses.replace: no Spec object is ever out of range

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no whitespace. This exact text is what the spec hash covers."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))

    @property
    def hash(self) -> bytes:
        """keccak-256 of the canonical JSON."""
        return keccak256(self.to_json().encode())


_CHOICES = {
    "model": ("logreg", "mlp", "cnn", "gpt2", "resnet"),
    "dataset": ("digits", "cifar10", "text"),
    "optimizer": ("sgd", "adam", "adamw"),
    "schedule": ("constant", "cosine", "warmup-cosine"),
    "dtype": ("float64", "float32"),
    "log_policy": ("bound", "tau"),
    "resolution": ("log", "exact"),
}
_RANGES: dict[str, tuple[float, float]] = {
    "hidden": (1, 1 << 16), "depth": (1, 64), "channels1": (1, 1024), "channels2": (1, 1024),
    "batch_size": (1, 1 << 16),
    "layers": (1, 64), "heads": (1, 64), "d_model": (1, 1 << 14), "context": (1, 1 << 14), "stages": (1, 8),
    "blocks": (1, 16), "width": (1, 1024), "shards": (1, 1024), "steps": (1, 10_000_000), "seed": (0, (1 << 63) - 1),
    "bits": (10, 32), "warmup_steps": (0, 10_000_000), "checkpoint_interval": (1, 10_000_000),
    "canonical_version": (1, 1),
    "dropout": (0.0, 0.95), "lr": (0.0, 10.0), "momentum": (0.0, 1.0), "weight_decay": (0.0, 1.0),
    "beta1": (0.0, 1.0), "beta2": (0.0, 1.0), "eps": (0.0, 1.0), "min_lr": (0.0, 10.0), "tau": (0.0, 0.5),
}


def _check(spec: Spec) -> None:
    """Types, choices and ranges of every field; a message without the source (the caller adds it)."""
    for f in dataclasses.fields(Spec):
        key, value = f.name, getattr(spec, f.name)
        if f.type == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif f.type == "float":
            ok = isinstance(value, float)
        else:
            ok = isinstance(value, str)
        if not ok:
            raise SpecError(f"key {key!r} must be {f.type}, got {type(value).__name__} {value!r}")
        if key in _CHOICES and value not in _CHOICES[key]:
            raise SpecError(f"key {key!r} must be one of {', '.join(_CHOICES[key])}, got {value!r}")
        if key in _RANGES and not _RANGES[key][0] <= value <= _RANGES[key][1]:
            lo, hi = _RANGES[key]
            raise SpecError(f"key {key!r} must lie in [{lo}, {hi}], got {value!r}")
    if spec.batch_size % spec.shards:
        raise SpecError(f"shards ({spec.shards}) must divide batch_size ({spec.batch_size})")
    if spec.model == "gpt2" and spec.d_model % spec.heads:
        raise SpecError(f"heads ({spec.heads}) must divide d_model ({spec.d_model})")
    if (spec.model == "gpt2") != (spec.dataset == "text"):
        raise SpecError(f"model {spec.model!r} cannot train on dataset {spec.dataset!r}: gpt2 needs text, "
                        "and text needs gpt2")
    if spec.data_hash and not re.fullmatch(r"0x[0-9a-fA-F]{64}", spec.data_hash):
        raise SpecError(f"key 'data_hash' must be 0x and 64 hex digits (keccak-256), got {spec.data_hash!r}")
    if spec.dataset != "digits" and not spec.data_path:
        raise SpecError(f"dataset {spec.dataset!r} needs data_path (a local directory or file)")
    if spec.resolution == "exact" and spec.dtype == "float32" and spec.bits > 19:
        # float32 work rounds IEEE ops twice (to float32, then to the grid): that is the correctly rounded
        # result only when 24 >= 2 (bits - 8) + 2
        raise SpecError(f"resolution 'exact' with dtype float32 needs bits <= 19, got {spec.bits}; "
                        "use dtype float64")
    if spec.schedule == "warmup-cosine" and spec.warmup_steps >= spec.steps:
        raise SpecError(f"warmup_steps ({spec.warmup_steps}) must be below steps ({spec.steps})")


def spec_from_dict(data: dict[str, Any], source: str = "<dict>") -> Spec:
    """Build a Spec from plain values, checking every key, type and range."""
    fields = {f.name: f for f in dataclasses.fields(Spec)}
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            raise SpecError(f"{source}: unknown key {key!r}; valid keys: {', '.join(sorted(fields))}")
        # TOML writes 1 for 1.0: an integer where a float is wanted is that float (same hash)
        if fields[key].type == "float" and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        values[key] = value
    try:
        return Spec(**values)
    except SpecError as exc:
        raise SpecError(f"{source}: {exc}") from None


def load_spec(path: str | Path) -> Spec:
    """Read a TOML spec file (flat keys, see Spec)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"{path}: spec file not found") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SpecError(f"{path}: not a readable TOML spec ({exc})") from None
    return spec_from_dict(data, str(path))


def spec_from_json(text: str, source: str) -> Spec:
    """Parse canonical JSON (as written to RUN/spec.json) and check that it is canonical."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{source}: not JSON ({exc}); copy spec.json from the trainer's run again") from None
    if not isinstance(data, dict):
        raise SpecError(f"{source}: a spec must be a JSON object")
    spec = spec_from_dict(data, source)
    if spec.to_json() != text.strip():
        raise SpecError(f"{source}: not in canonical form (sorted keys, no whitespace, all keys); "
                        "regenerate it from the TOML spec")
    return spec


def to_toml(spec: Spec) -> str:
    """A TOML text that loads back to `spec` (every key written, so defaults cannot drift)."""
    lines = []
    for f in dataclasses.fields(Spec):
        v = getattr(spec, f.name)
        lines.append(f"{f.name} = {json.dumps(v) if not isinstance(v, float) else repr(v)}")
    return "\n".join(lines) + "\n"
