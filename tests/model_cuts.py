"""Cutting a decoder-only transformers model to its first layers, for tests whose subject (positions,
chunked log-probs, a long context's memory) does not need all of them; imported as
``model_cuts`` (tests/ is on the path, as for ``float_tolerance``)."""

from torch import nn


def first_layers(model: nn.Module, layers: int = 2) -> nn.Module:
    """``model`` (changed in place and returned) with its embedding, its first ``layers`` decoder
    layers and its head."""
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    return model
