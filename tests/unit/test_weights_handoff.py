"""The weights hand-off between the trainer and an async rollout worker (rollout/weights.py):
versions published and loaded exactly, a retired version's file rewritten in place as the next
one, the folder in /dev/shm only where it has room."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from searchrl.assets import load_model
from searchrl.rollout.hf_backend import HFBackend
from searchrl.rollout.weights import (
    SPARE,
    latest_published,
    publish,
    published_path,
    read_published,
    retire,
    version_of,
    weights_bytes,
    weights_folder,
)


def load_published(model, folder: Path, version: int) -> None:
    """What a worker does with a version: the hf backend's `load_weights` of its pairs."""
    HFBackend(model, _TOKENIZER).load_weights(read_published(folder, version))


_TOKENIZER = load_model("tiny-random")[1]


def _perturbed(model, seed: int):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g))
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_versions_round_trip_and_a_retired_file_is_rewritten_in_place(tmp_path):
    trainer, _ = load_model("tiny-random")
    worker, _ = load_model("tiny-random")
    v0 = _perturbed(trainer, 0)
    publish(trainer, tmp_path, 0)
    inode = published_path(tmp_path, 0).stat().st_ino
    v1 = _perturbed(trainer, 1)
    publish(trainer, tmp_path, 1)
    load_published(worker, tmp_path, 0)
    assert all(torch.equal(p, v0[n]) for n, p in worker.named_parameters())
    # A valid safetensors file: any reader sees exactly the version's tensors.
    assert all(torch.equal(t, v1[n]) for n, t in load_file(str(published_path(tmp_path, 1))).items())

    retire(tmp_path, 0)
    assert not published_path(tmp_path, 0).exists() and (tmp_path / SPARE).exists()
    v2 = _perturbed(trainer, 2)
    publish(trainer, tmp_path, 2)
    assert published_path(tmp_path, 2).stat().st_ino == inode  # version 0's file, rewritten
    assert not (tmp_path / SPARE).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [published_path(tmp_path, v).name for v in (1, 2)]
    load_published(worker, tmp_path, 2)
    assert all(torch.equal(p, v2[n]) for n, p in worker.named_parameters())
    load_published(worker, tmp_path, 1)  # the older one is untouched by the rewrite
    assert all(torch.equal(p, v1[n]) for n, p in worker.named_parameters())


def test_a_spare_of_another_layout_is_replaced_not_written_into(tmp_path):
    small, _ = load_model("tiny-random")
    publish(small, tmp_path, 0)
    retire(tmp_path, 0)
    with torch.no_grad():  # another model: one tensor of another shape
        small.model.embed_tokens.weight = torch.nn.Parameter(torch.zeros(7, small.config.hidden_size))
    publish(small, tmp_path, 1)
    assert load_file(str(published_path(tmp_path, 1)))["model.embed_tokens.weight"].shape == (7, small.config.hidden_size)
    assert not (tmp_path / SPARE).exists()


def test_the_folder_is_in_shared_memory_only_where_it_fits_and_follows_the_run(tmp_path):
    model, _ = load_model("tiny-random")
    assert weights_bytes(model) == sum(p.numel() * 4 for p in model.parameters())
    run = tmp_path / "run"
    small, huge = weights_folder(run, 1), weights_folder(run, 1 << 60)
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        pytest.skip("no writable /dev/shm here")
    assert small.parent == shm and small == weights_folder(tmp_path / "." / "run", 1)  # a resume finds it again
    assert small != weights_folder(tmp_path / "other", 1)
    assert huge == run / "rollout-weights"  # no room: in the run directory


def test_versions_are_read_from_names_and_the_newest_is_found(tmp_path):
    assert version_of(published_path(tmp_path, 12)) == 12
    assert version_of(tmp_path / SPARE) == -1 and version_of(tmp_path / ".weights-000003.safetensors.tmp") == -1
    model, _ = load_model("tiny-random")
    assert latest_published(tmp_path) is None
    for v in (3, 5):
        publish(model, tmp_path, v)
    retire(tmp_path, 3)
    assert latest_published(tmp_path) == 5


def test_a_worker_of_another_dtype_loads_the_version_converted(tmp_path):
    trainer, _ = load_model("tiny-random")
    worker, _ = load_model("tiny-random", dtype="bfloat16")
    v0 = _perturbed(trainer, 0)
    publish(trainer, tmp_path, 0)
    load_published(worker, tmp_path, 0)
    assert all(p.dtype == torch.bfloat16 and torch.equal(p, v0[n].to(torch.bfloat16)) for n, p in worker.named_parameters())
