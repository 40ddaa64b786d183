"""The transformers-version shims, on the installed transformers with the tiny-random model: each
name they pick must be one the model takes, and a cache must survive the trip through them."""

from __future__ import annotations

import inspect

import torch

from searchrl import compat
from searchrl.assets import load_model


def test_cache_round_trip_and_forward_keywords():
    model, _ = load_model("tiny-random")
    params = inspect.signature(model.forward).parameters
    assert compat.cache_kwarg(model) in params
    assert compat.takes_logits_to_keep(model)
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        first = model(input_ids=ids, use_cache=True)
        kv = compat.cache_tensors(compat.output_cache(first))
        assert len(kv) == model.config.num_hidden_layers and kv[0][0].shape[-2] == 3
        # The next token fed on a rebuilt cache gives the logits of the whole sequence fed at once.
        cache = compat.dynamic_cache(kv)
        step = model(input_ids=torch.tensor([[4]]), use_cache=True, **{compat.cache_kwarg(model): cache})
        full = model(input_ids=torch.tensor([[1, 2, 3, 4]]))
    torch.testing.assert_close(step.logits[:, -1], full.logits[:, -1])


def test_checkpointing_switches_on_the_decoder_layers():
    model, _ = load_model("tiny-random")
    layers = compat.checkpointing_layers(model)
    assert len(layers) == model.config.num_hidden_layers
    compat.enable_checkpointing(model, use_reentrant=False)
    assert all(layer.gradient_checkpointing for layer in layers)
