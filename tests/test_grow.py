"""Growing heads and MLP neurons (grow.py): every mode function-preserving, alone and with the residual map;
the grown model has exactly the architecture of a from-scratch model of the target size."""
import pytest
import torch

from errors import ConfigError, TransformError
from model import GPT, GPTConfig
from test_transform import outputs, random_model
from transform import TransformConfig, transform_model

VARIANTS = [{}, {"mlp": "swiglu", "pos": "rope", "norm_type": "rmsnorm"},
            {"norm_placement": "peri", "bias": True, "norm_gain": "scalar"},  # (vector gains: the port is approximate)
            {"head": "tied", "bias": True}]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode,noise", [("zero", 0.0), ("clone", 0.0), ("clone", 0.05)])
@pytest.mark.parametrize("width", [16, 32])  # heads/MLP alone, and with the residual doubled by an orthogonal T
def test_growing_heads_and_mlp_preserves_the_function(variant, mode, noise, width):
    model = random_model(5, **variant)
    idx = torch.randint(0, 11, (2, 8))
    ref = outputs(model, idx).log_softmax(-1)
    hidden = 2 * model.config.mlp_hidden
    grown, record = transform_model(model, width, kind="orthogonal", seed=1, n_head=4, mlp_hidden=hidden,
                                    grow_mode=mode, clone_noise=noise)
    torch.testing.assert_close(outputs(grown, idx).log_softmax(-1), ref, atol=2e-5, rtol=0)
    assert (grown.config.n_head, grown.config.mlp_hidden, grown.config.n_embd) == (4, hidden, width)
    assert any(n.startswith("grown (") for n in record["notes"])


def test_the_grown_model_has_the_architecture_of_a_scratch_model_of_the_target_size():
    """Half width and half the heads (RMSNorm, scalar gains: the canonical form) grown to the standard model of
    width 32 (as grow_staging does) is that model: same config (the norm ε, scaled for exactness, aside) and
    the same tensors."""
    model = random_model(0, norm_type="rmsnorm", norm_gain="scalar")  # 16 wide, 2 heads of 8, MLP 64
    grown, _ = transform_model(model, 32, kind="orthogonal", n_head=4, mlp_hidden=128)
    scratch = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=8, vocab_size=11, norm_type="rmsnorm",
                            norm_gain="scalar"))  # its defaults: head_dim 32 / 4 = 8, MLP 4 · 32 = 128
    ours, theirs = grown.config.to_dict(), scratch.config.to_dict()
    assert ours.pop("norm_eps") == theirs.pop("norm_eps") / 2 and ours == theirs
    assert {k: v.shape for k, v in grown.state_dict().items()} == {k: v.shape for k, v in scratch.state_dict().items()}


def test_new_units_learn_and_cloned_copies_differ_with_noise():
    model = random_model(2)
    zero, _ = transform_model(model, 16, kind="orthogonal", n_head=4, grow_mode="zero")
    W = zero.transformer.h[0].attn.c_proj.weight
    assert W[:, 16:].abs().max() == 0 and zero.transformer.h[0].attn.c_attn.weight[16:32].abs().max() > 0
    idx = torch.randint(0, 11, (2, 8))
    _, loss = zero(idx, idx)
    loss.backward()
    assert W.grad[:, 16:].abs().max() > 0  # the zero output columns get gradient at once
    cloned, _ = transform_model(model, 16, kind="orthogonal", n_head=4, grow_mode="clone", clone_noise=0.1)
    Wc = cloned.transformer.h[0].attn.c_proj.weight
    assert (Wc[:, :16] - Wc[:, 16:]).abs().max() > 1e-3  # copies start apart: the symmetry is broken


def test_bad_growth_requests_fail_with_one_clear_error():
    model = random_model(0)  # 2 heads, mlp_hidden 64
    with pytest.raises(TransformError, match="n_head=1 is below the model's 2"):
        transform_model(model, 16, n_head=1)
    with pytest.raises(TransformError, match="mlp_hidden=96 must be a multiple of the model's 64"):
        transform_model(model, 16, mlp_hidden=96, grow_mode="clone")
    with pytest.raises(TransformError, match="mlp_hidden=32 is below"):
        transform_model(model, 16, mlp_hidden=32)
    with pytest.raises(ConfigError, match="grow_mode='copy' is not one of"):
        TransformConfig(out_dir="x", width=8, grow_mode="copy").validate()
    with pytest.raises(ConfigError, match="n_head must be >= 0"):
        TransformConfig(out_dir="x", width=8, n_head=-1).validate()
