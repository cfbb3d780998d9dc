"""Fake quantization (quantize.py): round-to-nearest against a naive loop, what is and is not rounded, and why a
Hadamard rotation helps a state with one massive coordinate."""
import pytest
import torch

from lgpt.method.maps import make_projection
from lgpt.method.quantize import Quantization, activation_outliers, block_linears, fake_quantized, rtn_rows, rtn_weight
from lgpt.plumbing.errors import ConfigError
from test_transform import outputs, random_model


def naive_rtn(row: list[float], bits: int) -> list[float]:
    qmax = 2 ** (bits - 1) - 1
    scale = max(max(abs(v) for v in row), 1e-12) / qmax
    return [max(-qmax, min(qmax, round(v / scale))) * scale for v in row]


@pytest.mark.parametrize("bits", [4, 8])
def test_round_to_nearest_per_row_and_per_group_match_a_naive_loop(bits):
    W = torch.randn(5, 12, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    expected = torch.tensor([naive_rtn(r, bits) for r in W.tolist()], dtype=torch.float64)
    torch.testing.assert_close(rtn_rows(W, bits), expected)
    grouped = torch.tensor([sum((naive_rtn(r[g:g + 4], bits) for g in range(0, 12, 4)), []) for r in W.tolist()],
                           dtype=torch.float64)
    torch.testing.assert_close(rtn_weight(W, bits, group=4), grouped)
    assert len(rtn_rows(W, bits)[0].unique()) <= 2 ** bits - 1
    with pytest.raises(ConfigError, match="does not divide"):
        rtn_weight(W, bits, group=5)


def test_fake_quantization_rounds_the_blocks_and_keeps_the_embedding_head_and_original():
    model = random_model(0, n_embd=16, head="linear")
    before = {n: p.clone() for n, p in model.named_parameters()}
    q = fake_quantized(model, Quantization(weight_bits=4))
    for name, p in q.named_parameters():
        torch.testing.assert_close(dict(model.named_parameters())[name], before[name])  # the original is untouched
        linear = name.removesuffix(".weight") in block_linears(model)
        assert torch.equal(p, before[name]) != (linear and name.endswith("weight")), name
    assert torch.equal(q.transformer.wte.weight, model.transformer.wte.weight)
    assert torch.equal(q.lm_head.weight, model.lm_head.weight)


def test_activation_rounding_happens_at_the_chosen_inputs_per_token():
    model = random_model(1, n_embd=16)
    idx = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(0))
    seen = {}
    for where in ("readers", "all"):
        q = fake_quantized(model, Quantization(act_bits=3, act_at=where))
        captured: list[torch.Tensor] = []
        handles = [m.register_forward_pre_hook(lambda _m, i, into=captured: into.append(i[0]))
                   for m in block_linears(q, where).values()]  # runs after the rounding hook
        outputs(q, idx)
        for h in handles:
            h.remove()
        assert all(len(x.reshape(-1, x.shape[-1])[0].unique()) <= 7 for x in captured)
        seen[where] = len(captured)
    assert seen["readers"] == 2 * model.config.n_layer < seen["all"] == 4 * model.config.n_layer
    torch.testing.assert_close(outputs(fake_quantized(model, Quantization()), idx), outputs(model, idx))
    with pytest.raises(ConfigError, match="act_at"):
        fake_quantized(model, Quantization(act_bits=4, act_at="heads"))


def test_a_hadamard_rotation_spreads_an_outlier_coordinate_so_per_token_rounding_loses_less():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 36, generator=g, dtype=torch.float64)
    x[:, 7] *= 20.0  # one outlier feature: its size sets every token's step, which the rotation shares out
    T, _ = make_projection("hadamard", 36, 36, seed=0)
    plain = (rtn_rows(x, 4) - x).norm() / x.norm()
    rotated = (rtn_rows(x @ T.T, 4) @ T - x).norm() / x.norm()
    assert rotated < plain / 2
    model = random_model(2, n_embd=16)
    stats = activation_outliers(model, torch.randint(0, 11, (2, 8)))
    assert 1.0 <= stats["max_over_rms"] <= 4.0  # ≤ √d for d = 16
