"""Loaders for local files (CIFAR-10 python batches, a text corpus), the new spec keys, and the
state of batch norm's running statistics."""

from __future__ import annotations

import pickle

import pytest
import torch

from familykit import family_spec, write_cifar, write_corpus
from vtrain.data import DatasetError, batch_indices, load_dataset
from vtrain.grid import round_to_grid
from vtrain.leaves import keccak256
from vtrain.loaders import LoaderError, load_cifar10, load_text
from vtrain.spec import SpecError, spec_from_dict
from vtrain.train import TrainingSession


def test_cifar_batches_load_in_order_and_on_the_grid(tmp_path):
    d = write_cifar(tmp_path / "c", per_batch=10)
    pixels, labels, digest = load_cifar10(d)
    assert digest == keccak256(b"".join((d / f"data_batch_{i}").read_bytes() for i in range(1, 6)))
    assert pixels.shape == (50, 3072) and pixels.dtype == torch.uint8 and labels.shape == (50,)
    with open(d / "data_batch_2", "rb") as f:
        raw = pickle.load(f, encoding="bytes")
    assert torch.equal(pixels[10:20], torch.from_numpy(raw[b"data"]))
    assert labels[10:20].tolist() == raw[b"labels"]
    data = load_dataset("cifar10", torch.float64, path=str(d), bits=20)
    assert data.image_shape == (3, 32, 32) and data.n == 50
    assert torch.equal(round_to_grid(data.x, 20), data.x) and float(data.x.max()) <= 1.0


def test_cifar_loader_refuses_code_and_names_the_file(tmp_path):
    d = write_cifar(tmp_path / "c", per_batch=4)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    (d / "data_batch_3").write_bytes(pickle.dumps({b"data": Evil(), b"labels": []}))
    with pytest.raises(LoaderError, match="data_batch_3.*forbidden global"):
        load_cifar10(d)
    (d / "data_batch_3").unlink()
    with pytest.raises(LoaderError, match="data_batch_3: missing"):
        load_cifar10(d)
    with pytest.raises(DatasetError, match="not a directory"):
        load_dataset("cifar10", torch.float64, path=str(tmp_path / "nowhere"))


def test_text_corpus_is_character_level_and_windows_shift_by_one(tmp_path):
    path = write_corpus(tmp_path / "t.txt", lines=20)
    tokens, vocab, digest = load_text(path)
    assert digest == keccak256(path.read_bytes())
    text = path.read_text(encoding="utf-8")
    assert "".join(vocab[i] for i in tokens.tolist()) == text and vocab == sorted(set(text))
    data = load_dataset("text", torch.float64, path=str(path), context=16)
    assert data.n == len(text) - 16 and data.num_classes == len(vocab)
    idx = batch_indices(3, 2, 4, data.n)
    x, y = data.batch(idx)
    assert x.shape == y.shape == (4, 16)
    assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(x[0], tokens[idx[0]:idx[0] + 16])
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(DatasetError, match="bad.txt: not UTF-8"):
        load_dataset("text", torch.float64, path=str(tmp_path / "bad.txt"), context=4)


def test_data_hash_pins_the_data(tmp_path):
    path = write_corpus(tmp_path / "t.txt", lines=20)
    good = "0x" + keccak256(path.read_bytes()).hex()
    assert load_dataset("text", torch.float64, path=str(path), context=4, data_hash=good).n > 0
    path.write_text(path.read_text(encoding="utf-8") + "X", encoding="utf-8")   # one character more
    with pytest.raises(DatasetError, match=f"t.txt: the data hashes to 0x[0-9a-f]{{64}} but the spec's data_hash is {good}"):
        load_dataset("text", torch.float64, path=str(path), context=4, data_hash=good)
    with pytest.raises(SpecError, match="data_hash"):
        spec_from_dict({"model": "gpt2", "dataset": "text", "data_path": "x", "data_hash": "0x12"})


def test_spec_checks_family_and_dataset():
    with pytest.raises(SpecError, match="gpt2 needs text"):
        spec_from_dict({"model": "gpt2", "dataset": "digits"})
    with pytest.raises(SpecError, match="needs data_path"):
        spec_from_dict({"model": "resnet", "dataset": "cifar10"})
    with pytest.raises(SpecError, match="must divide d_model"):
        spec_from_dict({"model": "gpt2", "dataset": "text", "data_path": "x", "heads": 3})


def test_batch_norm_running_statistics_are_state(family_data):
    spec = family_spec("resnet-tiny", family_data, steps=6)
    s = TrainingSession(spec)
    s.step(1, "record")
    state = s.state_bytes()
    assert b"model/bn1.running_mean" in state and b"model/bn1.running_var" in state
    assert not torch.equal(s.model.bn1.running_mean, torch.zeros_like(s.model.bn1.running_mean))
    other = TrainingSession(spec)
    other.load_state(state, "<test>")
    assert torch.equal(other.model.bn1.running_var, s.model.bn1.running_var) and other.state_bytes() == state


def test_gpt2_dropout_masks_cover_every_site(family_data):
    spec = family_spec("gpt2-tiny", family_data)
    s = TrainingSession(spec)
    shapes = s.model.dropout_shapes()
    assert len(shapes) == 1 + 3 * spec.layers and shapes[1] == (spec.heads, spec.context, spec.context)
