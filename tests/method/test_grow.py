"""Growing heads and MLP neurons (grow.py): every mode function-preserving, alone and with the residual map;
the grown model has exactly the architecture of a from-scratch model of the target size."""
import pytest
import torch

from conftest import spec
from lgpt.method.pipeline import transform_model
from lgpt.plumbing.errors import ConfigError, TransformError
from model import GPT, GPTConfig
from test_transform import outputs, random_model
from transform import TransformConfig

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
    grown, record = transform_model(model, spec(width, kind="orthogonal", seed=1, n_head=4, mlp_hidden=hidden,
                                                grow_mode=mode, clone_noise=noise))
    torch.testing.assert_close(outputs(grown, idx).log_softmax(-1), ref, atol=2e-5, rtol=0)
    assert (grown.config.n_head, grown.config.mlp_hidden, grown.config.n_embd) == (4, hidden, width)
    assert any(n.startswith("grown (") for n in record["notes"])


def test_the_grown_model_has_the_architecture_of_a_scratch_model_of_the_target_size():
    """Half width and half the heads (RMSNorm, scalar gains: the canonical form) grown to the standard model of
    width 32 (as grow_staging does) is that model: same config (the norm ε, scaled for exactness, aside) and
    the same tensors."""
    model = random_model(0, norm_type="rmsnorm", norm_gain="scalar")  # 16 wide, 2 heads of 8, MLP 64
    grown, _ = transform_model(model, spec(32, kind="orthogonal", n_head=4, mlp_hidden=128))
    scratch = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=8, vocab_size=11, norm_type="rmsnorm",
                            norm_gain="scalar"))  # its defaults: head_dim 32 / 4 = 8, MLP 4 · 32 = 128
    ours, theirs = grown.config.to_dict(), scratch.config.to_dict()
    assert ours.pop("norm_eps") == theirs.pop("norm_eps") / 2 and ours == theirs
    assert {k: v.shape for k, v in grown.state_dict().items()} == {k: v.shape for k, v in scratch.state_dict().items()}


def test_new_units_learn_and_cloned_copies_differ_with_noise():
    model = random_model(2)
    zero, _ = transform_model(model, spec(16, kind="orthogonal", n_head=4, grow_mode="zero"))
    W = zero.transformer.h[0].attn.c_proj.weight
    assert W[:, 16:].abs().max() == 0 and zero.transformer.h[0].attn.c_attn.weight[16:32].abs().max() > 0
    idx = torch.randint(0, 11, (2, 8))
    _, loss = zero(idx, idx)
    loss.backward()
    assert W.grad[:, 16:].abs().max() > 0  # the zero output columns get gradient at once
    cloned, _ = transform_model(model, spec(16, kind="orthogonal", n_head=4, grow_mode="clone", clone_noise=0.1))
    Wc = cloned.transformer.h[0].attn.c_proj.weight
    assert (Wc[:, :16] - Wc[:, 16:]).abs().max() > 1e-3  # copies start apart: the symmetry is broken


def test_bad_growth_requests_fail_with_one_clear_error():
    model = random_model(0)  # 2 heads, mlp_hidden 64
    with pytest.raises(TransformError, match="n_head=1 is below the model's 2"):
        transform_model(model, spec(16, n_head=1))
    with pytest.raises(TransformError, match="mlp_hidden=96 must be a multiple of the model's 64"):
        transform_model(model, spec(16, mlp_hidden=96, grow_mode="clone"))
    with pytest.raises(TransformError, match="mlp_hidden=32 is below"):
        transform_model(model, spec(16, mlp_hidden=32))
    with pytest.raises(ConfigError, match="grow_mode='copy' is not one of"):
        TransformConfig(out_dir="x", width=8, grow_mode="copy").validate()
    with pytest.raises(ConfigError, match="n_head must be >= 0"):
        TransformConfig(out_dir="x", width=8, n_head=-1).validate()


# ----------------------------------------------------------------------------------------------
# Depth (transform.py --n_layer): new blocks are copies with zero writers


def test_depth_plans_put_the_copies_where_they_say():
    from lgpt.method.grow import depth_plan
    assert depth_plan(2, 4, "interleave") == [(0, False), (0, True), (1, False), (1, True)]
    assert depth_plan(3, 5, "interleave") == [(0, False), (1, False), (1, True), (2, False), (2, True)]
    assert depth_plan(2, 5, "stack") == [(0, False), (1, False), (0, True), (1, True), (0, True)]
    assert depth_plan(2, 4, "gstack") == depth_plan(2, 4, "stack")
    for n_old, n_new in ((1, 3), (4, 8), (3, 7)):
        plan = depth_plan(n_old, n_new, "interleave")
        assert len(plan) == n_new and [j for j, new in plan if not new] == list(range(n_old))
        assert [j for j, _ in plan] == sorted(j for j, _ in plan)  # each copy right after its block


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", ["interleave", "stack"])
@pytest.mark.parametrize("width", [16, 32])  # depth alone, and with the residual doubled
def test_growing_depth_preserves_the_function(variant, mode, width):
    model = random_model(7, **variant)
    idx = torch.randint(0, 11, (2, 8))
    ref = outputs(model, idx).log_softmax(-1)
    grown, record = transform_model(model, spec(width, kind="orthogonal", seed=1, n_layer=5, depth_mode=mode))
    torch.testing.assert_close(outputs(grown, idx).log_softmax(-1), ref, atol=2e-5, rtol=0)
    assert grown.config.n_layer == 5 and len(grown.transformer.h) == 5
    assert any(n.startswith(f"grown in depth ({mode})") for n in record["notes"])
    assert record["exact"] == (variant.get("norm_placement") != "peri" or variant.get("norm_gain") == "scalar")


def test_gstack_copies_keep_their_writers_and_change_the_function():
    model = random_model(7)
    idx = torch.randint(0, 11, (2, 8))
    grown, record = transform_model(model, spec(16, kind="orthogonal", n_layer=4, depth_mode="gstack"))
    assert not record["exact"] and (outputs(grown, idx) - outputs(model, idx)).abs().max() > 1e-2
    torch.testing.assert_close(grown.transformer.h[2].mlp.c_proj.weight, grown.transformer.h[0].mlp.c_proj.weight)


def test_new_blocks_learn_from_the_first_step():
    """The zero writers of a new block get gradient at once; its readers only once the writers are non-zero."""
    grown, _ = transform_model(random_model(2), spec(16, kind="orthogonal", n_layer=4, depth_mode="stack"))
    new = grown.transformer.h[3]
    assert new.attn.c_proj.weight.abs().max() == 0 and new.mlp.c_proj.weight.abs().max() == 0
    idx = torch.randint(0, 11, (2, 8))
    _, loss = grown(idx, idx)
    loss.backward()
    assert new.attn.c_proj.weight.grad.abs().max() > 0 and new.mlp.c_proj.weight.grad.abs().max() > 0


def test_carried_moments_follow_the_old_blocks_and_new_blocks_start_without_history():
    from test_carry import adam_state_from, gradients

    from lgpt.method.carry import carry_moments
    model = random_model(3, norm_type="rmsnorm", norm_gain="scalar")
    idx = torch.randint(0, 11, (3, 8))
    state = adam_state_from(model, gradients(model, idx))
    flat, record = transform_model(model, spec(32, kind="orthogonal", seed=2))
    deep, record_deep = transform_model(model, spec(32, kind="orthogonal", seed=2, n_layer=4, depth_mode="interleave"))
    same = carry_moments(model, state, record["T"], flat)["moments"]
    grown = carry_moments(model, state, record_deep["T"], deep, n_layer=4, depth_mode="interleave")["moments"]
    for name, moments in grown.items():
        if not name.startswith("transformer.h."):
            torch.testing.assert_close(moments["exp_avg"], same[name]["exp_avg"])
            continue
        i = int(name.split(".")[2])
        rest = name.split(".", 3)[3]
        if i % 2:  # interleave 2 → 4: blocks 1 and 3 are the new copies
            assert all(m.abs().max() == 0 for m in moments.values()), name
        else:
            torch.testing.assert_close(moments["exp_avg"], same[f"transformer.h.{i // 2}.{rest}"]["exp_avg"])


def test_bad_depth_requests_fail_with_one_clear_error():
    model = random_model(0)
    with pytest.raises(TransformError, match="n_layer=1 is below the model's 2"):
        transform_model(model, spec(16, kind="orthogonal", n_layer=1))
    with pytest.raises(TransformError, match="depth_mode='deep' is not one of"):
        transform_model(model, spec(16, kind="orthogonal", n_layer=4, depth_mode="deep"))
    with pytest.raises(TransformError, match="drop --porting=paper_code"):
        transform_model(model, spec(12, kind="gaussian", porting="paper_code", n_layer=4))
    with pytest.raises(ConfigError, match="depth_mode='x' is not one of"):
        TransformConfig(out_dir="o", width=8, depth_mode="x").validate()
