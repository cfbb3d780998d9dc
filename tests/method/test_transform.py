import math
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ROOT, spec
from lgpt.method.maps import (
    KINDS,
    Calibration,
    hadamard_matrix,
    hadamard_transform,
    jl_min_width,
    make_projection,
    pseudo_inverse,
)
from lgpt.method.pipeline import transform_model
from lgpt.method.porting import canonical_model, canonicalize, port_model
from lgpt.plumbing.checkpoint import load_checkpoint, load_model
from lgpt.plumbing.dataset import BatchLoader, evaluate_loss
from lgpt.plumbing.errors import ConfigError, TransformError
from model import GPT, GPTConfig
from transform import TransformConfig


def random_model(seed: int, **kw) -> GPT:
    """A small GPT with non-trivial gains and biases, so that folding them is actually tested."""
    torch.manual_seed(seed)
    cfg = dict(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=11)
    cfg.update(kw)
    model = GPT(GPTConfig(**cfg)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln_" in name or "ln_f" in name:
                p.add_(0.3 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
            elif "wte" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


def outputs(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(idx, all_logits=True)[0]


variant = st.fixed_dictionaries({
    "norm_type": st.sampled_from(["layernorm", "rmsnorm"]),
    "norm_gain": st.sampled_from(["vector", "scalar", "none"]),
    "norm_placement": st.sampled_from(["pre", "peri"]),
    "head": st.sampled_from(["linear", "tied", "knn"]),
    "pos": st.sampled_from(["learned", "rope"]),
    "mlp": st.sampled_from(["gelu", "swiglu"]),
    "bias": st.booleans(),
    "qkv_bias": st.sampled_from([None, True, False]),  # Qwen2: Q/K/V biases alone
    "n_kv_head": st.sampled_from([None, 1]),  # multi-head or multi-query (n_head = 2)
})


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(variant=variant, extra=st.integers(0, 24), grow_noise=st.sampled_from([0.0, 0.5]), seed=st.integers(0, 99))
def test_head_porting_with_orthogonal_T_is_exact_for_m_at_least_d(variant, extra, grow_noise, seed):
    model = random_model(seed, **variant)
    idx = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(seed))
    ref = outputs(model, idx)
    width = 16 + extra
    new, record = transform_model(model, spec(width, kind="orthogonal", porting="residual", norms="fold", seed=seed,
                                              grow_noise=grow_noise if width > 16 else 0.0))
    assert new.config.n_embd == width
    assert new.config.head_dim == model.config.head_dim and new.config.mlp_hidden == model.config.mlp_hidden
    out = outputs(new, idx)
    peri_vector = variant["norm_placement"] == "peri" and variant["norm_gain"] == "vector"
    assert record["exact"] == (not peri_vector)
    if peri_vector:
        assert any(n.startswith("APPROXIMATE") for n in record["notes"])
        return
    # log-probabilities always; raw logits too unless a KNN head had to become a linear one
    assert torch.allclose(out.log_softmax(-1), ref.log_softmax(-1), atol=2e-5)
    if not (variant["head"] == "knn" and variant["norm_gain"] == "vector"):
        assert torch.allclose(out, ref, atol=5e-5)


@pytest.mark.slow
@settings(max_examples=20, deadline=None)
@given(variant=variant, seed=st.integers(0, 99))
def test_fold_alone_preserves_the_function(variant, seed):
    if variant["norm_placement"] == "peri" and variant["norm_gain"] == "vector":
        variant["norm_gain"] = "scalar"
    model = random_model(seed, **variant)
    canon, _ = canonical_model(model, "fold")
    assert canon.config.norm_type == "rmsnorm" and canon.config.norm_gain == "scalar"
    idx = torch.randint(0, 11, (2, 8))
    assert torch.allclose(outputs(canon, idx).log_softmax(-1), outputs(model, idx).log_softmax(-1), atol=2e-5)


def test_sandwich_mixes_heads_even_at_the_same_width(trained_dir, char_data_dir):
    """The paper's T·W·T⁺ on Q, K, V, O re-splits heads: an orthogonal T at m = d changes the function."""
    model, _ = load_model(trained_dir)
    loader = BatchLoader(char_data_dir, model.config.block_size, 8)
    d = model.config.n_embd
    idx, _ = loader.get_batch("val", seed=0)
    ref = outputs(model, idx).log_softmax(-1)
    head, _ = transform_model(model, spec(d, kind="orthogonal", porting="residual", norms="fold", seed=3))
    sandwich, _ = transform_model(model, spec(d, kind="orthogonal", porting="sandwich", norms="fold", seed=3))
    assert torch.allclose(outputs(head, idx).log_softmax(-1), ref, atol=5e-5)
    assert (outputs(sandwich, idx).log_softmax(-1) - ref).abs().max() > 0.1
    before = evaluate_loss(model, loader, "val", eval_iters=5)
    assert evaluate_loss(sandwich, loader, "val", eval_iters=5) > before + 2e-3  # (a tiny model: small effect)
    identity, _ = transform_model(model, spec(d, kind="truncate", porting="sandwich",
                                              norms="fold"))  # T = I: nothing to mix
    assert torch.allclose(outputs(identity, idx).log_softmax(-1), ref, atol=5e-5)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("d,m", [(24, 12), (24, 24), (20, 40), (12, 17)])
def test_projection_shapes_and_pseudo_inverse(kind, d, m):
    if kind == "hadamard" and m != d:
        with pytest.raises(TransformError, match="same width"):
            make_projection(kind, d, m)
        return
    if kind == "pca" and m > d:
        with pytest.raises(TransformError, match="m ≤ d"):
            make_projection(kind, d, m, calibration=torch.randn(100, d))
        return
    if kind == "split" and not d < m <= d + d // 2:
        with pytest.raises(TransformError, match="grows by pairs of coordinates"):
            make_projection(kind, d, m)
        return
    T, P = make_projection(kind, d, m, seed=1, calibration=torch.randn(200, d, dtype=torch.float64))
    assert T.shape == (m, d) and P.shape == (d, m)
    assert torch.allclose(P, torch.linalg.pinv(T), atol=1e-8)
    if m <= d:
        assert torch.allclose(T @ P, torch.eye(m, dtype=torch.float64), atol=1e-9)
    else:
        assert torch.allclose(P @ T, torch.eye(d, dtype=torch.float64), atol=1e-9)
    if kind in ("orthogonal", "hadamard", "pca", "truncate"):
        gram = T @ T.T if m <= d else T.T @ T
        assert torch.allclose(gram, torch.eye(min(m, d), dtype=torch.float64), atol=1e-9)


def test_random_kinds_have_their_distributions():
    d, m = 400, 300
    T, _ = make_projection("gaussian", d, m, seed=0)
    assert abs(T.var().item() * m - 1) < 0.02
    T, _ = make_projection("rademacher", d, m, seed=0)
    assert set(torch.unique(torch.round(T * math.sqrt(m))).tolist()) == {-1.0, 1.0}
    T, _ = make_projection("sparse", d, m, seed=0)
    values = torch.round(T * math.sqrt(m / 3)).flatten()
    assert abs((values == 0).double().mean().item() - 2 / 3) < 0.01
    assert abs((values == 1).double().mean().item() - 1 / 6) < 0.01
    for kind in ("gaussian", "rademacher", "sparse", "srht"):  # E‖Tx‖² = ‖x‖²
        T, _ = make_projection(kind, d, m, seed=0)
        x = torch.randn(d, 500, dtype=torch.float64)
        ratio = ((T @ x).pow(2).sum(0) / x.pow(2).sum(0)).mean().item()
        assert abs(ratio - 1) < 0.05, kind


def test_hadamard_transform_matches_sylvester_matrix():
    H = torch.ones(1, 1, dtype=torch.float64)
    for _ in range(4):
        H = torch.cat([torch.cat([H, H], 1), torch.cat([H, -H], 1)], 0)
    x = torch.randn(3, 16, dtype=torch.float64)
    assert torch.allclose(hadamard_transform(x), x @ H.T / 4, atol=1e-12)


def test_srht_works_for_any_d_and_is_orthonormal_at_the_padded_size():
    T, _ = make_projection("srht", 12, 16, seed=0)  # d = 12 pads to 16 = m: orthonormal columns
    assert torch.allclose(T.T @ T, torch.eye(12, dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize("n", [1, 2, 4, 12, 20, 28, 36, 44, 60, 576, 640, 768])
def test_hadamard_matrices_of_paley_and_sylvester_orders(n):
    H = hadamard_matrix(n)
    assert H.abs().eq(1).all() and torch.equal(H @ H.T, n * torch.eye(n, dtype=torch.float64))


def test_the_hadamard_rotation_is_exact_and_spreads_a_coordinate_evenly():
    T, T_pinv = make_projection("hadamard", 12, 12, seed=3)
    assert torch.allclose(T @ T.T, torch.eye(12, dtype=torch.float64), atol=1e-12) and torch.equal(T_pinv, T.T)
    assert torch.allclose(T[:, 5].abs(), torch.full((12,), 12 ** -0.5, dtype=torch.float64))  # |T·e_k| = 1/√d each
    assert not torch.equal(T, make_projection("hadamard", 12, 12, seed=4)[0])  # the signs are the seed's
    model = random_model(0, n_embd=12, n_head=2)
    new, record = transform_model(model, spec(12, kind="hadamard", seed=1))
    assert record["exact"]
    idx = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(outputs(new, idx), outputs(model, idx), atol=2e-5, rtol=0)
    with pytest.raises(TransformError, match="same width"):
        make_projection("hadamard", 12, 8)
    with pytest.raises(TransformError, match="no Hadamard matrix of order 52"):
        make_projection("hadamard", 52, 52)


def test_pca_finds_the_dominant_subspace():
    g = torch.Generator().manual_seed(0)
    basis = torch.linalg.qr(torch.randn(10, 3, generator=g, dtype=torch.float64))[0]
    points = torch.randn(500, 3, generator=g, dtype=torch.float64) @ basis.T
    T, _ = make_projection("pca", 10, 3, calibration=Calibration.from_points(points))
    assert torch.allclose(T.T @ T @ points.T, points.T, atol=1e-6)


def test_jl_min_width_against_its_formula():
    n, eps, delta = 1000, 0.25, 0.1
    expected = (4 * math.log(n) + 2 * math.log(1 / delta)) / (eps**2 / 2 - eps**3 / 3)
    assert jl_min_width(n, eps, delta) == math.ceil(expected)
    assert jl_min_width(10 * n, eps, delta) > jl_min_width(n, eps, delta)


def test_calibration_points_counts_what_the_calibration_pass_sees(trained_dir, char_data_dir):
    """A random map skips the calibration pass; the JL bound's N it reports must be the pass's own count."""
    from lgpt.method.maps import calibration_points, collect_calibration
    model, _ = load_model(trained_dir)
    loader = BatchLoader(char_data_dir, model.config.block_size, 3)
    assert calibration_points(model.config, loader, 2) == collect_calibration(model, loader, 2).count
    assert calibration_points(model.config, None, 2) == model.config.vocab_size


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 50), st.integers(0, 50), st.integers(1, 64))
def test_calibration_draws_are_disjoint_and_draw_0_is_unchanged(a, b, batches):
    """Two calibration draws never share a batch (``seed + k`` made draws 0–2 of 8 batches share 6–7); draw 0 reads
    batch k at seed k, as before the scheme changed."""
    from lgpt.plumbing.dataset import calibration_seed
    first, second = ({calibration_seed(s, k) for k in range(batches)} for s in (a, b))
    assert len(first) == batches
    assert (first == second) if a == b else not (first & second)
    assert [calibration_seed(0, k) for k in range(batches)] == list(range(batches))
    from lgpt.plumbing.dataset import CALIBRATION_SEEDS, calibration_scheme  # cache keys: draw 0's runs stay valid
    assert calibration_scheme(0) == {} and calibration_scheme(b or 1) == {"calibration_seeds": CALIBRATION_SEEDS}


def test_calibration_pass_reads_its_draws_batches(trained_dir, char_data_dir):
    """collect_calibration(seed=s) is the moment of batches calibration_seed(s, k), computed naively here."""
    from lgpt.method.maps import collect_calibration
    from lgpt.plumbing.dataset import calibration_seed
    model, _ = load_model(trained_dir)
    loader = BatchLoader(char_data_dir, model.config.block_size, 3)
    states = []
    with torch.no_grad():
        for k in range(2):
            states += model(loader.get_batch("train", calibration_seed(2, k))[0], return_hidden=True)[2]
    u = torch.cat([h.reshape(-1, h.shape[-1]) for h in states]).double()
    u = torch.cat([u, model.transformer.wte.weight.double()])
    u = u / u.norm(dim=1, keepdim=True).clamp_min(1e-12)
    torch.testing.assert_close(collect_calibration(model, loader, 2, seed=2).second_moment, u.T @ u / len(u))


def test_pseudo_inverse_rejects_rank_deficient_maps():
    with pytest.raises(TransformError, match="rank-deficient"):
        pseudo_inverse(torch.zeros(3, 5, dtype=torch.float64))


def test_grow_symmetry_breaking_lets_readers_see_new_directions():
    model = random_model(0)
    plain, rec = transform_model(model, spec(32, kind="orthogonal", porting="residual", norms="fold", seed=0))
    broken, _ = transform_model(model, spec(32, kind="orthogonal", porting="residual", norms="fold", seed=0,
                                            grow_noise=0.5))
    T = rec["T"].double()
    outside = torch.eye(32, dtype=torch.float64) - T @ T.T  # projector on the new, empty directions
    W_plain = plain.transformer.h[0].attn.c_attn.weight.double()
    W_broken = broken.transformer.h[0].attn.c_attn.weight.double()
    assert (W_plain @ outside).abs().max() < 1e-6
    assert (W_broken @ outside).abs().max() > 1e-2


def test_pca_shrink_beats_random_shrink(trained_dir, char_data_dir):
    model, _ = load_model(trained_dir)
    loader = BatchLoader(char_data_dir, model.config.block_size, 8)
    losses = {}
    for kind in ("pca", "gaussian", "orthogonal"):
        new, _ = transform_model(model, spec(16, kind=kind, porting="residual", norms="fold", seed=0), loader)
        losses[kind] = evaluate_loss(new, loader, "val", eval_iters=10)
    assert losses["pca"] < losses["orthogonal"] and losses["pca"] < losses["gaussian"]


def _cli(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "transform.py"), *args], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))


@pytest.mark.slow
def test_cli_writes_a_checkpoint_every_script_can_load(trained_dir, tmp_path):
    out = tmp_path / "m48"
    result = _cli(f"--in_dir={trained_dir}", f"--out_dir={out}", "--width=48", "--eval_iters=4")
    assert result.returncode == 0, result.stderr
    assert "exact: True" in result.stdout
    ckpt = load_checkpoint(str(out))
    record = ckpt["transform"]
    assert record["d"] == 32 and record["m"] == 48 and record["T"].shape == (48, 32)
    assert record["val_loss_after"] == pytest.approx(record["val_loss_before"], abs=1e-4)
    assert ckpt["model_args"]["n_embd"] == 48 and ckpt["meta"]["tokenizer"] == "char"
    model, _ = load_model(str(out))
    assert model.config.norm_type == "rmsnorm"


def test_transformed_model_shares_no_storage_with_the_source():
    model = random_model(0, bias=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    new, _ = transform_model(model, spec(16, kind="orthogonal", porting="residual", norms="fold"))
    with torch.no_grad():
        for p in new.parameters():
            p.add_(1.0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_keep_layernorm_is_exact_and_checked():
    for placement in ("pre", "peri"):
        model = random_model(3, norm_gain="scalar" if placement == "peri" else "vector", norm_placement=placement)
        idx = torch.randint(0, 11, (2, 8))
        for width in (16, 21, 40):
            new, _ = transform_model(model, spec(width, kind="orthogonal", porting="residual", norms="fold", seed=width,
                                                 keep_layernorm=True))
            assert new.config.norm_type == "layernorm"
            assert torch.allclose(outputs(new, idx), outputs(model, idx), atol=5e-5)
    with pytest.raises(TransformError, match="keep_layernorm needs"):
        transform_model(random_model(0), spec(8, kind="orthogonal", porting="residual", norms="fold",
                                              keep_layernorm=True))


def test_port_model_applies_a_given_map_by_the_formulas():
    """port_model with a user's (T, T⁺): every parameter is the canonical one mapped by its rule, and an orthogonal
    T at m ≥ d keeps the function."""
    model = random_model(5, norm_type="rmsnorm")
    canon, _ = canonical_model(model, "fold")
    T, P = make_projection("gaussian", 16, 12, seed=4)
    ported = port_model(model, T, P).state_dict()
    c = {k: v.double() for k, v in canon.state_dict().items()}
    T, P = T.double(), P.double()
    expected = {"transformer.wte.weight": c["transformer.wte.weight"] @ T.T,
                "transformer.h.0.attn.c_attn.weight": c["transformer.h.0.attn.c_attn.weight"] @ P,
                "transformer.h.0.mlp.c_proj.weight": T @ c["transformer.h.0.mlp.c_proj.weight"],
                "transformer.h.0.mlp.c_proj.bias": T @ c["transformer.h.0.mlp.c_proj.bias"],
                "transformer.h.1.ln_2.weight": c["transformer.h.1.ln_2.weight"] * math.sqrt(16 / 12),
                "transformer.h.0.mlp.c_fc.bias": c["transformer.h.0.mlp.c_fc.bias"]}
    for name, value in expected.items():
        assert torch.allclose(ported[name].double(), value, atol=1e-5), name
    idx = torch.randint(0, 11, (2, 8))
    T, P = make_projection("orthogonal", 16, 20, seed=1)
    assert torch.allclose(outputs(port_model(model, T, P), idx), outputs(model, idx), atol=5e-5)
    with pytest.raises(TransformError, match="T must be m×d"):
        port_model(model, T.T, P)


def test_porting_head_is_an_alias_of_residual():
    model = random_model(2)
    idx = torch.randint(0, 11, (2, 8))
    new, record = transform_model(model, spec(20, kind="orthogonal", porting="head", norms="fold", seed=1))
    same, _ = transform_model(model, spec(20, kind="orthogonal", porting="residual", norms="fold", seed=1))
    assert record["porting"] == "residual" and record["exact"]
    assert torch.equal(outputs(new, idx), outputs(same, idx))
    with pytest.raises(TransformError, match="porting='heads' is not one of"):
        transform_model(model, spec(20, porting="heads"))
    with pytest.raises(TransformError, match="norms='fodl' is not one of"):
        canonicalize(model.state_dict(), model.config, "fodl")


# ----------------------------------------------------------------------------------------------
# The paper's public code (porting='paper_code') and the attention-scale attribution


def test_paper_code_maps_every_axis_of_length_d_by_shape():
    model = random_model(4, bias=True, head="linear")  # LayerNorm with per-dimension gains and biases
    d, m = 16, 12
    new, record = transform_model(model, spec(m, kind="gaussian", porting="paper_code", seed=5))
    T = make_projection("gaussian", d, m, seed=5)[0].float()
    old, sd = model.state_dict(), new.state_dict()
    b = "transformer.h.0"
    close = dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sd["transformer.wte.weight"], old["transformer.wte.weight"] @ T.T, **close)
    torch.testing.assert_close(sd["lm_head.weight"], old["lm_head.weight"] @ T.T, **close)  # Tᵀ, not T⁺
    torch.testing.assert_close(sd[f"{b}.ln_1.weight"], T @ old[f"{b}.ln_1.weight"], **close)  # gains stay vectors
    torch.testing.assert_close(sd[f"{b}.ln_1.bias"], T @ old[f"{b}.ln_1.bias"], **close)
    for i in range(3):  # Q, K, V each T·W·Tᵀ, biases T·b
        block = old[f"{b}.attn.c_attn.weight"][i * d:(i + 1) * d]
        torch.testing.assert_close(sd[f"{b}.attn.c_attn.weight"][i * m:(i + 1) * m], T @ block @ T.T, **close)
        bias = old[f"{b}.attn.c_attn.bias"][i * d:(i + 1) * d]
        torch.testing.assert_close(sd[f"{b}.attn.c_attn.bias"][i * m:(i + 1) * m], T @ bias, **close)
    torch.testing.assert_close(sd[f"{b}.attn.c_proj.weight"], T @ old[f"{b}.attn.c_proj.weight"] @ T.T, **close)
    torch.testing.assert_close(sd[f"{b}.mlp.c_fc.weight"], old[f"{b}.mlp.c_fc.weight"] @ T.T, **close)
    torch.testing.assert_close(sd[f"{b}.mlp.c_fc.bias"], old[f"{b}.mlp.c_fc.bias"], **close)  # length 4d: kept
    torch.testing.assert_close(sd[f"{b}.mlp.c_proj.weight"], T @ old[f"{b}.mlp.c_proj.weight"], **close)
    cfg = new.config
    assert (cfg.norm_type, cfg.norm_gain, cfg.norm_eps) == ("layernorm", "vector", model.config.norm_eps)
    assert (cfg.n_embd, cfg.head_dim) == (m, m // model.config.n_head)
    assert record["porting"] == "paper_code" and record["norms"] == "kept" and not record["exact"]


def test_paper_code_orthogonal_map_is_q_transpose_over_sqrt_m():
    model = random_model(1)
    _, record = transform_model(model, spec(8, kind="orthogonal", porting="paper_code", seed=2))
    T = record["T"].double()
    torch.testing.assert_close(T @ T.T, torch.eye(8, dtype=torch.float64) / 8, atol=1e-6, rtol=0)
    torch.testing.assert_close(T * math.sqrt(8), make_projection("orthogonal", 16, 8, seed=2)[0], atol=1e-6, rtol=0)


def test_paper_code_tied_head_stays_tied():
    new, _ = transform_model(random_model(2, head="tied"), spec(12, kind="gaussian", porting="paper_code"))
    assert new.lm_head.weight.data_ptr() == new.transformer.wte.weight.data_ptr()


def test_restoring_the_attention_scale_makes_a_one_head_orthogonal_sandwich_growth_exact():
    model = random_model(3, n_head=1, norm_type="rmsnorm", norm_gain="scalar", bias=False)
    with torch.no_grad():  # sharp attention and a confident head, so the scale visibly matters
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(8)
        model.lm_head.weight.mul_(20)
    idx = torch.randint(0, 11, (2, 8))
    ref = outputs(model, idx).log_softmax(-1)
    plain, _ = transform_model(model, spec(32, kind="orthogonal", porting="sandwich", seed=1))
    restored, record = transform_model(model, spec(32, kind="orthogonal", porting="sandwich", seed=1,
                                                   restore_attn_scale=True))
    assert (outputs(plain, idx).log_softmax(-1) - ref).abs().max() > 1e-3  # the scale update alone changes it
    torch.testing.assert_close(outputs(restored, idx).log_softmax(-1), ref, atol=1e-4, rtol=0)
    assert record["restore_attn_scale"] and any("attention scale restored" in n for n in record["notes"])
    # the paper's code is not exact even then: its readers get Tᵀ ≠ T⁺ for Qᵀ/√m, and it folds nothing
    code, _ = transform_model(model, spec(32, kind="orthogonal", porting="paper_code", seed=1, restore_attn_scale=True))
    assert (outputs(code, idx).log_softmax(-1) - ref).abs().max() > 1e-2


def test_paper_code_and_attention_scale_bad_requests():
    model = random_model(0)
    with pytest.raises(TransformError, match="paper's code, whose maps are"):
        transform_model(model, spec(8, kind="srht", porting="paper_code"))
    with pytest.raises(TransformError, match="restore_attn_scale applies to porting='sandwich' or 'paper_code'"):
        transform_model(model, spec(8, kind="orthogonal", porting="residual", restore_attn_scale=True))
    with pytest.raises(TransformError, match="porting='paper_code' re-splits the heads"):
        transform_model(model, spec(9, kind="gaussian", porting="paper_code"))


def test_rescale_gains_off_keeps_gains_and_eps_and_breaks_exactness():
    """The paper's Algorithm 1 leaves the norm gains alone; ours multiplies scalar gains by √(d/m) and ε by d/m.
    Switching the rescale off keeps the canonical gains and ε exactly, and loses the exact port at m > d."""
    model = random_model(3)
    idx = torch.randint(0, 11, (2, 8))
    canon, _ = canonical_model(model)
    kept, record_kept = transform_model(model, spec(32, kind="orthogonal", rescale_gains=False))
    scaled, record = transform_model(model, spec(32, kind="orthogonal"))
    assert record["exact"] and not record_kept["exact"] and record_kept["rescale_gains"] is False
    assert torch.allclose(outputs(scaled, idx), outputs(model, idx), atol=1e-4)
    assert not torch.allclose(outputs(kept, idx), outputs(model, idx), atol=1e-2)
    assert kept.config.norm_eps == canon.config.norm_eps
    assert scaled.config.norm_eps == pytest.approx(canon.config.norm_eps * 16 / 32)
    for (name, g0), g1, g2 in zip(canon.state_dict().items(), kept.state_dict().values(), scaled.state_dict().values()):
        if ".ln_" in name or "ln_f" in name:
            assert torch.equal(g1, g0) and torch.allclose(g2, g0 * math.sqrt(16 / 32))


def test_rescale_gains_off_is_refused_for_paper_code():
    with pytest.raises(TransformError, match="rescale_gains=False applies to porting='residual' or 'sandwich'"):
        transform_model(random_model(0), spec(12, kind="gaussian", porting="paper_code", rescale_gains=False))


def test_raw_calibration_weighting_is_the_plain_second_moment(char_data_dir):
    """calib_weighting='raw' (SliceGPT's PCA of the residual stream) sums x·xᵀ as it is; 'unit' scales each state
    to unit length first."""
    from lgpt.method.maps import collect_calibration
    from lgpt.plumbing.dataset import BatchLoader
    model = random_model(6, vocab_size=65, block_size=16)
    loader = BatchLoader(char_data_dir, 16, 2, "cpu")
    raw = collect_calibration(model, loader, 1, weighting="raw")
    x, _ = loader.get_batch("train", seed=0)
    with torch.no_grad():
        states = [model.transformer.wte.weight] + [h.reshape(-1, 16) for h in model(x, return_hidden=True)[2]]
    points = torch.cat(states).double()
    torch.testing.assert_close(raw.second_moment, points.T @ points / len(points))
    unit = collect_calibration(model, loader, 1)
    u = points / points.norm(dim=1, keepdim=True)
    torch.testing.assert_close(unit.second_moment, u.T @ u / len(u))
    # calib_vocabulary=False (SliceGPT's): only the text's own states, the first of them its embeddings
    text = collect_calibration(model, loader, 1, weighting="raw", vocabulary=False)
    states = points[model.config.vocab_size:]
    torch.testing.assert_close(text.second_moment, states.T @ states / len(states))
    from lgpt.method.maps import calibration_points
    assert calibration_points(model.config, loader, 1, vocabulary=False) == text.count == len(states)


def test_pca_exclude_keeps_the_coordinates_out_of_range_and_is_the_pca_of_the_rest():
    """range(T) ⟂ e_i for every excluded i, and T spans the top-m principal subspace of the data with those
    coordinates zeroed (naive); without the exclusion the dominant coordinate is in range."""
    from lgpt.method.maps import Coordinates, pca_map
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 12, generator=g, dtype=torch.float64) * torch.linspace(1, 3, 12, dtype=torch.float64)
    x[:, 5] *= 40  # a massive coordinate
    plain = pca_map(x, 12, 6)
    assert plain[:, 5].pow(2).sum() > 0.99
    T = pca_map(x, 12, 6, damping=0.0, coordinates=Coordinates(exclude=(2, 5)))
    assert T[:, [2, 5]].abs().max() < 1e-12
    torch.testing.assert_close(T @ T.T, torch.eye(6, dtype=torch.float64))
    cut = x.clone()
    cut[:, [2, 5]] = 0
    _, vectors = torch.linalg.eigh(cut.T @ cut)
    top = vectors[:, -6:]
    torch.testing.assert_close(T.T @ T, top @ top.T, atol=1e-9, rtol=0)


def test_pca_keep_puts_the_coordinates_in_range_as_rows_and_is_the_pca_of_the_rest():
    """T has the row e_iᵀ for every kept i; its other rows span the top principal subspace of the data with the kept
    and excluded coordinates zeroed (naive); all rows orthonormal, ordered by their variance."""
    from lgpt.method.maps import Coordinates, pca_map
    g = torch.Generator().manual_seed(1)
    x = torch.randn(500, 10, generator=g, dtype=torch.float64) @ torch.randn(10, 10, generator=g, dtype=torch.float64)
    T = pca_map(x, 10, 5, damping=0.0, coordinates=Coordinates(exclude=(0,), keep=(3, 8)))
    torch.testing.assert_close(T @ T.T, torch.eye(5, dtype=torch.float64))
    for i in (3, 8):
        hits = [r for r in range(5) if torch.allclose(T[r].abs(), torch.eye(10, dtype=torch.float64)[i])]
        assert len(hits) == 1 and T[hits[0], i] == 1.0
    assert T[:, 0].abs().max() < 1e-12
    rest = T[T[:, [3, 8]].abs().sum(1) < 1e-9]
    cut = x.clone()
    cut[:, [0, 3, 8]] = 0
    _, vectors = torch.linalg.eigh(cut.T @ cut)
    top = vectors[:, -3:]
    torch.testing.assert_close(rest.T @ rest, top @ top.T, atol=1e-9, rtol=0)
    variance = torch.einsum("id,nd->ni", T, x).pow(2).mean(0)
    assert (variance[:-1] >= variance[1:]).all()
    only_kept = pca_map(x, 10, 2, coordinates=Coordinates(keep=(8, 3)))  # every row a kept coordinate
    assert sorted(only_kept.abs().argmax(1).tolist()) == [3, 8]


def test_pca_exclude_through_the_transform_and_its_refusals(char_data_dir):
    from lgpt.plumbing.dataset import BatchLoader
    model = random_model(6, vocab_size=65, block_size=16)
    loader = BatchLoader(char_data_dir, 16, 2, "cpu")
    for porting in ("residual", "per_block"):
        new, record = transform_model(model, spec(10, kind="pca", porting=porting, calib_batches=1,
                                                  pca_exclude=(7, 0, 7)), loader)  # sorted and de-duplicated
        assert record["pca_exclude"] == [0, 7] and record["T"][:, [0, 7]].abs().max() < 1e-6
        assert torch.isfinite(outputs(new, torch.randint(0, 65, (2, 8)))).all()
    cases = [(dict(width=10, pca_exclude=(16,)), "outside this model's residual stream"),
             (dict(width=15, pca_exclude=(1, 2)), "leaves 14 directions for m=15"),
             (dict(width=10, pca_exclude=(1,), kind="orthogonal"), "use kind='pca'"),
             (dict(width=10, pca_exclude=(1,), given_map=torch.eye(10, 16)), "without a map file"),
             (dict(width=10, pca_keep=(1, 20)), r"pca_keep names coordinates \[20\]"),
             (dict(width=10, pca_keep=(1, 2), pca_exclude=(2,)), r"coordinates \[2\] are both in pca_exclude and in"),
             (dict(width=2, pca_keep=(1, 2, 3)), r"keeps 3 coordinates as rows of T, more than its m=2"),
             (dict(width=10, pca_keep=(1,), kind="gaussian"), "pca_keep chooses coordinates of a PCA map's range")]
    for options, message in cases:
        options = dict(dict(kind="pca", calib_batches=1), **options)
        with pytest.raises(TransformError, match=message):
            transform_model(model, spec(**options), loader)
    for options in (dict(kind="orthogonal"), dict(kind="pca", map_file="T.pt")):
        with pytest.raises(ConfigError, match="pca_exclude keeps coordinates out of a PCA map's range"):
            TransformConfig(in_dir="x", out_dir="y", width=8, pca_exclude=(1,), **options).validate()
        with pytest.raises(ConfigError, match="pca_keep keeps coordinates in a PCA map's range"):
            TransformConfig(in_dir="x", out_dir="y", width=8, pca_keep=(1,), **options).validate()
    new, record = transform_model(model, spec(10, kind="pca", calib_batches=1, pca_keep=(9, 4, 9)), loader)
    assert record["pca_keep"] == [4, 9] and record["T"][:, [4, 9]].abs().max(0).values.min() == 1.0


@pytest.mark.parametrize("norm_type, bias, gain", [("rmsnorm", False, "vector"), ("layernorm", True, "vector"),
                                                   ("layernorm", True, "scalar"), ("rmsnorm", False, "scalar")])
def test_moving_a_tied_heads_input_scale_keeps_the_model(norm_type, bias, gain):
    """porting.rescale_tied_input on every final norm that has a gain: E × c, the gain (and a LayerNorm's shift)
    ÷ c, the input scale √d → √m; the log-probs stay (a shift left alone moved the logits by (c − 1)·β·Eᵀ)."""
    import copy
    import math

    from lgpt.method.porting import rescale_tied_input
    d = 25  # as if shrunk from width 25 to 16: the input scale is still √25
    model = random_model(4, head="tied", norm_type=norm_type, bias=bias, norm_gain=gain, embed_scale=math.sqrt(d))
    moved = copy.deepcopy(model)
    assert rescale_tied_input(moved, d) == pytest.approx(math.sqrt(d / 16))
    assert moved.config.embed_scale == pytest.approx(4.0)
    x = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(torch.log_softmax(moved(x)[0], -1), torch.log_softmax(model(x)[0], -1),
                               atol=2e-5, rtol=0)
    assert rescale_tied_input(moved, d) is None  # already at √m
