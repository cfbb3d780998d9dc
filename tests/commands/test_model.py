import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from model import (
    GPT,
    HEADS,
    MLPS,
    NORM_GAINS,
    NORM_PLACEMENTS,
    NORM_TYPES,
    POSITIONS,
    GPTConfig,
    KVCache,
    apply_rope,
    rope_tables,
)

VARIANTS = list(itertools.product(NORM_TYPES, NORM_GAINS, NORM_PLACEMENTS, HEADS, POSITIONS, MLPS, (True, False)))


def tiny(**kw) -> GPTConfig:
    base = dict(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=13)
    base.update(kw)
    return GPTConfig(**base)


@pytest.mark.parametrize("norm_type,norm_gain,placement,head,pos,mlp,bias", VARIANTS)
def test_every_variant_runs_forward_and_backward(norm_type, norm_gain, placement, head, pos, mlp, bias):
    torch.manual_seed(0)
    model = GPT(tiny(norm_type=norm_type, norm_gain=norm_gain, norm_placement=placement, head=head, pos=pos,
                     mlp=mlp, norm_reg=0.1, bias=bias))
    assert (model.transformer.h[0].mlp.c_fc.bias is not None) == bias
    idx = torch.randint(0, 13, (3, 8))
    logits, loss = model(idx, idx)
    assert logits.shape == (3, 8, 13) and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert set(model.last_loss_terms) == {"lm", "norm_reg"}
    logits, loss = model(idx)  # inference: last position only
    assert logits.shape == (3, 1, 13) and loss is None


@pytest.mark.parametrize("variant", [{}, {"head": "knn", "norm_type": "rmsnorm", "pos": "rope", "mlp": "swiglu"},
                                     {"norm_placement": "peri", "norm_gain": "scalar", "head": "tied"}])
def test_overfits_a_tiny_batch(variant):
    torch.manual_seed(0)
    model = GPT(tiny(**variant))
    idx = torch.randint(0, 13, (2, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = None
    for _ in range(150):
        _, loss = model(idx[:, :-1], idx[:, 1:])
        first = first or loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1 < first


def test_knn_head_equals_naive_distance():
    torch.manual_seed(0)
    model = GPT(tiny(head="knn"))
    with torch.no_grad():
        model.lm_head.bias.normal_()
    h = torch.randn(2, 5, 16)
    e = model.transformer.wte.weight
    naive = -((h[:, :, None, :] - e[None, None]) ** 2).sum(-1) + model.lm_head.bias
    assert torch.allclose(model.lm_head(h), naive, atol=1e-4)


def test_norm_regularizer_equals_its_formula():
    torch.manual_seed(0)
    lam = 0.3
    model = GPT(tiny(norm_reg=lam))
    with torch.no_grad():  # make some hidden states exceed the threshold
        model.transformer.wte.weight.mul_(30)
    idx = torch.randint(0, 13, (2, 8))
    _, loss, hidden = model(idx, idx, return_hidden=True)
    norms_e = model.transformer.wte.weight.norm(dim=1)
    threshold = norms_e.mean() + 1.5 * (norms_e - norms_e.mean()).pow(2).mean().sqrt()  # population σ
    values = [max(0.0, h[b, t].norm().item() - threshold.item())
              for h in hidden[1:] for b in range(2) for t in range(8)]
    expected = lam * sum(values) / len(values)
    assert expected > 0
    assert math.isclose(model.last_loss_terms["norm_reg"].item(), expected, rel_tol=1e-4)
    assert math.isclose(loss.item(), model.last_loss_terms["lm"].item() + expected, rel_tol=1e-5)


def test_rope_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    cos, sin = rope_tables(8, 32, 10000.0)
    q, k = torch.randn(8), torch.randn(8)

    def score(i, j):
        qi = apply_rope(q.view(1, 1, 1, 8), cos[i:i + 1], sin[i:i + 1])
        kj = apply_rope(k.view(1, 1, 1, 8), cos[j:j + 1], sin[j:j + 1])
        return (qi * kj).sum().item()

    assert math.isclose(score(3, 1), score(13, 11), rel_tol=1e-4)
    assert math.isclose(score(7, 7), score(20, 20), rel_tol=1e-4)
    assert not math.isclose(score(3, 1), score(3, 2), rel_tol=1e-2)


def test_rope_model_has_no_position_embedding():
    model = GPT(tiny(pos="rope"))
    assert "wpe" not in model.transformer


def test_rope_tables_made_on_the_meta_device_never_reach_a_model_built_on_the_cpu():
    """GPT.from_state_dict builds on the meta device; the shared RoPE tables must not be cached there for the next
    model of the same shape (seen: a per-block shrink after a checkpoint load failed with 'Tensor on device meta')."""
    weights = GPT(tiny(pos="rope", block_size=11)).state_dict()  # the tables are buffers outside the state dict
    cfg = tiny(pos="rope", block_size=11, rope_base=1234.0)  # a table no other test makes first: made on meta
    loaded = GPT.from_state_dict(cfg, weights)
    fresh = GPT(cfg)
    for model in (loaded, fresh):
        assert model.transformer.h[0].attn.rope_cos.device.type == "cpu"
    idx = torch.randint(0, 13, (1, 11))
    torch.testing.assert_close(loaded(idx)[0], GPT.from_state_dict(cfg, loaded.state_dict())(idx)[0])
    assert torch.isfinite(fresh(idx)[0]).all()


def test_hidden_states_and_widths():
    cfg = tiny(n_embd=24, head_dim=5, n_head=3, mlp_hidden=40)
    model = GPT(cfg)
    assert model.transformer.h[0].attn.c_attn.weight.shape == (45, 24)
    assert model.transformer.h[0].mlp.c_fc.weight.shape == (40, 24)
    idx = torch.randint(0, 13, (2, 8))
    logits, _, hidden = model(idx, return_hidden=True, all_logits=True)
    assert len(hidden) == cfg.n_layer + 1 and hidden[0].shape == (2, 8, 24)
    assert torch.allclose(logits, model.lm_head(model.transformer.ln_f(hidden[-1])), atol=1e-6)


def test_norm_variants_match_reference_formulas():
    torch.manual_seed(0)
    x = torch.randn(4, 16)
    model = GPT(tiny(norm_type="rmsnorm", norm_gain="scalar"))
    norm = model.transformer.ln_f
    with torch.no_grad():
        norm.weight.fill_(2.5)
    expected = 2.5 * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    assert torch.allclose(norm(x), expected, atol=1e-5)
    ln = GPT(tiny(norm_gain="none")).transformer.ln_f
    assert torch.allclose(ln(x), F.layer_norm(x, (16,)), atol=1e-6)


def test_tied_head_shares_the_embedding():
    model = GPT(tiny(head="tied"))
    assert model.lm_head.weight is model.transformer.wte.weight


@pytest.mark.parametrize("field,value,needle", [
    ("norm_type", "batchnorm", "norm_type='batchnorm' is not one of"),
    ("head", "mlp", "head='mlp'"),
    ("n_embd", 15, "not divisible by n_head"),
    ("norm_reg", -1.0, "norm_reg must be >= 0"),
    ("mlp_hidden", 0, "mlp_hidden must be a positive integer"),
    ("head_dim", -2, "head_dim must be a positive integer"),
    ("norm_eps", -1e-5, "norm_eps must be > 0"),
    ("rope_base", 0.0, "rope_base must be > 0"),
])
def test_invalid_model_config_names_the_field(field, value, needle):
    with pytest.raises(ValueError, match=needle):
        tiny(**{field: value}, **({"pos": "rope"} if field == "rope_base" else {}))


def test_generate_extends_the_prompt():
    model = GPT(tiny())
    out = model.generate(torch.zeros(1, 3, dtype=torch.long), max_new_tokens=10, top_k=5)
    assert out.shape == (1, 13)


CACHE_VARIANTS = [
    {},  # learned positions, LayerNorm, GELU
    {"pos": "rope", "mlp": "swiglu", "norm_type": "rmsnorm", "n_head": 4, "n_kv_head": 2, "head": "tied"},  # Llama
    {"pos": "rope", "norm_placement": "peri", "attn_window": 3, "global_every": 2, "qk_norm": True},  # Gemma 3's
]


def sharp(model: GPT, scale: float = 4.0) -> GPT:
    """``model`` with every parameter scaled up: attention far from uniform, so a wrong mask or position shows."""
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    return model.eval()


@pytest.mark.parametrize("variant", CACHE_VARIANTS)
def test_cached_steps_give_the_logits_of_reading_the_whole_context(variant):
    torch.manual_seed(0)
    model = sharp(GPT(tiny(**variant)))
    x = torch.randint(0, 13, (2, 8))
    with torch.no_grad():
        full, _ = model(x, all_logits=True)
        cache = KVCache(model.config.n_layer)
        pieces = [model(x[:, :3], cache=cache, all_logits=True)[0]]  # a prompt of 3, then one token at a time
        pieces += [model(x[:, t:t + 1], cache=cache)[0] for t in range(3, 8)]
    assert cache.length == 8
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="longer than block_size"):
        model(x[:, :1], cache=cache)


def uncached_generation(model: GPT, idx: torch.Tensor, steps: int) -> torch.Tensor:
    """Greedy decoding the naive way: the whole (last block_size) context read again at every step."""
    for _ in range(steps):
        logits, _ = model(idx[:, -model.config.block_size:])
        idx = torch.cat((idx, logits[:, -1:].argmax(-1)), dim=1)
    return idx


@pytest.mark.parametrize("variant", CACHE_VARIANTS)
def test_generation_with_its_cache_equals_reading_the_whole_context_each_step(variant):
    torch.manual_seed(1)
    model = sharp(GPT(tiny(**variant)))  # greedy choices far apart, not float ties
    prompt = torch.randint(0, 13, (3, 2))
    steps = 14  # past block_size = 8: the window slides and the positions shift
    cached = model.generate(prompt, steps, top_k=1)
    torch.testing.assert_close(cached, uncached_generation(model, prompt, steps))


def test_model_imports_nothing_from_the_project():
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ours = {f[:-3] for f in os.listdir(root) if f.endswith(".py")} - {"model"}
    code = "import sys, model; print(' '.join(sorted(sys.modules)))"
    loaded = set(subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                                check=True).stdout.split())
    assert not loaded & ours, loaded & ours


@pytest.mark.parametrize("variant", [{}, {"norm_placement": "peri", "pos": "rope", "mlp": "swiglu", "head": "tied"}])
def test_run_with_cache_matches_forward_and_return_hidden(variant):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=11, **variant)).eval()
    x = torch.randint(0, 11, (2, 8))
    logits, cache = model.run_with_cache(x)
    with torch.no_grad():
        ref, _, hidden = model(x, all_logits=True, return_hidden=True)
    torch.testing.assert_close(logits, ref)
    for layer in range(2):
        torch.testing.assert_close(cache[f"blocks.{layer}.hook_resid_post"], hidden[layer + 1])
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
        torch.testing.assert_close(pattern.sum(-1), torch.ones(2, 2, 8))
        assert pattern.triu(1).abs().max() == 0  # causal
