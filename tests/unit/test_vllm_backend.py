"""What the vllm backend hands vLLM to load (no vLLM needed)."""

from __future__ import annotations

import os

from searchrl.rollout.vllm_backend import _weights_view


def test_a_checkpoints_optimizer_file_is_left_out_of_the_folder_vllm_loads(tmp_path):
    ckpt = tmp_path / "step_0016"
    ckpt.mkdir()
    for name in ("model.safetensors", "optimizer.safetensors", "config.json", "tokenizer.json", "trainer_state.json"):
        (ckpt / name).write_text(name)
    view = _weights_view(ckpt)
    names = sorted(os.listdir(view.name))
    assert names == ["config.json", "model.safetensors", "tokenizer.json", "trainer_state.json"]
    assert (ckpt / "model.safetensors").samefile(os.path.join(view.name, "model.safetensors"))  # links, not copies
    view.cleanup()
    assert (ckpt / "model.safetensors").is_file()  # removing the view leaves the checkpoint alone


def test_a_plain_model_folder_or_name_is_loaded_as_it_is(tmp_path):
    (tmp_path / "model-00001-of-00002.safetensors").write_text("a")
    (tmp_path / "model-00002-of-00002.safetensors").write_text("b")
    assert _weights_view(tmp_path) is None
    assert _weights_view(tmp_path / "not-a-folder") is None
