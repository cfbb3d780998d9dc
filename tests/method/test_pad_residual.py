"""Zero-padding the residual with the gains kept (grow.pad_residual): the same function at a wider width, a tied
head still tied — what llama.cpp's block quantizers need of a width like 432 (lgpt/formats/llama_cpp.py)."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lgpt.method.grow import pad_residual
from lgpt.plumbing.errors import TransformError
from test_transform import outputs, random_model

RMS = dict(norm_type="rmsnorm", bias=False)


@settings(max_examples=25, deadline=None)
@given(gain=st.sampled_from(["vector", "scalar"]), placement=st.sampled_from(["pre", "peri"]),
       head=st.sampled_from(["linear", "tied", "knn"]), pos=st.sampled_from(["learned", "rope"]),
       mlp=st.sampled_from(["gelu", "swiglu"]), bias=st.booleans(), qk_norm=st.booleans(),
       n_kv_head=st.sampled_from([None, 1]), pad=st.integers(1, 20))
def test_padding_is_the_same_function(gain, placement, head, pos, mlp, bias, qk_norm, n_kv_head, pad):
    model = random_model(pad, norm_type="rmsnorm", norm_gain=gain, norm_placement=placement, head=head, pos=pos,
                         mlp=mlp, bias=bias, qk_norm=qk_norm, n_kv_head=n_kv_head, norm_eps=1e-2)
    idx = torch.randint(0, 11, (2, 8))
    padded = pad_residual(model, 16 + pad)
    torch.testing.assert_close(outputs(padded, idx).log_softmax(-1), outputs(model, idx).log_softmax(-1),
                               atol=2e-5, rtol=0)
    assert padded.config.n_embd == 16 + pad and padded.config.head_dim == model.config.head_dim
    assert padded.config.mlp_hidden == model.config.mlp_hidden
    if qk_norm:  # the q/k norms act on head_dim: their ε is not the residual norms' rescaled one
        assert padded.config.qk_norm_eps == pytest.approx(1e-2)


def test_a_tied_head_stays_tied_and_the_parameters_grow_by_the_padding_alone():
    model = random_model(0, head="tied", **RMS)
    padded = pad_residual(model, 32)
    assert padded.lm_head.weight is padded.transformer.wte.weight
    assert torch.equal(padded.transformer.wte.weight[:, 16:], torch.zeros(11, 16))
    assert sum(p.numel() for p in padded.parameters()) > sum(p.numel() for p in model.parameters())


def test_the_naive_padding_without_the_gain_and_epsilon_rule_is_not_the_same_function():
    """The rule matters: zero columns alone (gains padded, ε kept) change every norm's output by √(m'/d)."""
    model = random_model(1, **RMS, norm_eps=1e-2)
    padded = pad_residual(model, 24)
    sd = padded.state_dict()
    for name in sd:
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            sd[name][:16] = model.state_dict()[name]
    naive = type(padded).from_state_dict(padded.config, sd).eval()
    idx = torch.randint(0, 11, (2, 8))
    assert (outputs(naive, idx) - outputs(model, idx)).abs().max() > 1e-2


@pytest.mark.parametrize("kw,words", [(dict(norm_type="layernorm"), "RMSNorm"),
                                      (dict(norm_type="rmsnorm", norm_gain="none"), "RMSNorm")])
def test_norms_it_cannot_pad_exactly_are_refused(kw, words):
    with pytest.raises(TransformError, match=words):
        pad_residual(random_model(0, **kw), 24)


def test_narrowing_is_refused():
    with pytest.raises(TransformError, match="widens"):
        pad_residual(random_model(0, **RMS), 8)
