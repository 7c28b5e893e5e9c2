"""utils/lm.py: activation checkpointing through the API every supported transformers version has."""
import copy
import warnings

import torch

from configs.model import MODEL_PRESETS, build_model
from utils.lm import checkpoint_activations, lm_loss


def test_checkpointed_layers_give_the_same_gradients_without_a_warning():
    """gradient_checkpointing_enable exists from transformers 5.17 (no activation_checkpointing_enable there) to
    5.23 (a deprecated alias there, silenced): each layer recomputes its activations, the gradients stay the same."""
    torch.manual_seed(0)
    plain = build_model(MODEL_PRESETS["rp2040-speed"])
    recomputing = copy.deepcopy(plain)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any deprecation warning fails the test
        checkpoint_activations(recomputing)
    assert recomputing.gpt_neox.gradient_checkpointing and not plain.gpt_neox.gradient_checkpointing
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    for model in (plain, recomputing):
        model.train()
        lm_loss(model, x, x).backward()
    for (name, a), b in zip(plain.named_parameters(), recomputing.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-7), name
