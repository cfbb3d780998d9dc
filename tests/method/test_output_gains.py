"""Peri-LN output gains carried through T (porting.diagonal_fit, porting.carry_output_norms) and the exact growth
map that mixes coordinates (maps.split_map): exactness where the algebra allows it, a flagged approximation where
it does not, and the fit against a naive least squares."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lgpt.method.maps import make_projection, split_map
from lgpt.method.pipeline import output_gains, transform_model
from lgpt.method.porting import canonicalize, diagonal_fit, length_fit, length_residual, model_from_state, port_weights
from lgpt.plumbing.errors import TransformError
from test_transform import outputs, random_model

PERI = dict(norm_type="rmsnorm", norm_gain="vector", norm_placement="peri", bias=False, norm_eps=1e-2)


def spread_gains(model, low: float = 0.05, high: float = 20.0, seed: int = 0):
    """Output gains far from equal, with a negative and a zero one, as in Gemma 3 270M (0 … 1649)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("_out.weight"):
                p.copy_(torch.exp(torch.empty(p.shape).uniform_(math.log(low), math.log(high), generator=g)))
                p[0] = -p[0]
                p[1] = 0.0
    return model


def ported(model, T, output_gains_mode="carry"):
    sd, cfg, _ = canonicalize(model.state_dict(), model.config, "fold", output_gains_mode)
    notes: list[str] = []
    new = model_from_state(*port_weights(sd, cfg, T, T.T.clone(), "residual", None, True, notes))
    return new, notes


def naive_diagonal_fit(T: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """min_a ‖Tᵀ·diag(a)·T − diag(b)‖_F as one least squares over the d² entries, column i = vec(t_i t_iᵀ)."""
    columns = torch.stack([torch.outer(T[i], T[i]).flatten() for i in range(T.shape[0])], 1)
    return torch.linalg.lstsq(columns, torch.diag(b).flatten()[:, None]).solution[:, 0]


@settings(max_examples=20, deadline=None)
@given(d=st.integers(3, 9), extra=st.integers(-2, 3), seed=st.integers(0, 99))
def test_the_diagonal_fit_is_the_least_squares_fit(d, extra, seed):
    m = max(1, d + extra)
    g = torch.Generator().manual_seed(seed)
    T = torch.randn(m, d, generator=g, dtype=torch.float64)
    b = torch.rand(d, generator=g, dtype=torch.float64) + 0.1
    a, residual = diagonal_fit(T, b)
    naive = naive_diagonal_fit(T, b)
    fit = lambda x: (T.T @ (x[:, None] * T) - torch.diag(b)).norm()  # noqa: E731
    assert float(fit(a)) <= float(fit(naive)) * (1 + 1e-6) + 1e-10 * float(b.norm())
    assert residual == pytest.approx(float(fit(a) / b.norm()), rel=1e-6, abs=1e-12)


@settings(max_examples=20, deadline=None)
@given(d=st.integers(4, 24), seed=st.integers(0, 99), data=st.data())
def test_split_maps_are_orthonormal_mixing_and_carry_every_diagonal_exactly(d, seed, data):
    r = data.draw(st.integers(1, d // 2))
    g = torch.Generator().manual_seed(seed)
    gains = torch.exp(torch.randn(5, d, generator=g, dtype=torch.float64) * 2)
    T = split_map(d, d + r, gains, seed)
    assert torch.allclose(T.T @ T, torch.eye(d, dtype=torch.float64), atol=1e-12)
    assert int(((T != 0).sum(1) == 2).sum()) == 2 * r  # 2r rows read two coordinates: no coordinate map
    A = torch.stack([length_fit(T, gains[k]) for k in range(5)], 1)  # the output norms' lengths, each exact
    residual = length_residual(T, A, gains.T)
    assert residual < 1e-9 and bool((A > 0).all())


@settings(max_examples=15, deadline=None)
@given(head=st.sampled_from(["linear", "tied"]), mlp=st.sampled_from(["gelu", "swiglu"]), qk_norm=st.booleans(),
       n_kv_head=st.sampled_from([None, 1]), grow=st.integers(1, 7), seed=st.integers(0, 20))
def test_split_and_padding_carry_peri_ln_output_gains_exactly(head, mlp, qk_norm, n_kv_head, grow, seed):
    model = random_model(seed, head=head, mlp=mlp, qk_norm=qk_norm, n_kv_head=n_kv_head, **PERI)
    model = spread_gains(model, seed=seed)
    idx = torch.randint(0, 11, (2, 8))
    reference = outputs(model, idx).log_softmax(-1)
    for T in (split_map(16, 16 + grow, output_gains(model), seed), torch.eye(16 + grow, 16, dtype=torch.float64)):
        new, notes = ported(model, T)
        assert not notes
        torch.testing.assert_close(outputs(new, idx).log_softmax(-1), reference, atol=5e-5, rtol=0)


def test_a_dense_rotation_carries_unequal_output_gains_approximately_and_says_so():
    """A Haar-random rotation cannot carry unequal gains exactly (the length's equation has no solution): flagged,
    measurably off where split growth is exact, and far closer than the plain average (on this random model's
    near-isotropic f, the isotropic length fit leaves 2e-4 of the logits, the average 0.85)."""
    model = spread_gains(random_model(3, **PERI))
    T, _ = make_projection("orthogonal", 16, 20, seed=1)
    idx = torch.randint(0, 11, (2, 8))
    reference = outputs(model, idx)

    def error(new) -> float:
        return float((outputs(new, idx) - reference).norm() / reference.norm())

    carried, notes = ported(model, T)
    assert len(notes) == 1 and notes[0].startswith("APPROXIMATE: peri-LN output gains carried")
    exact = error(ported(model, split_map(16, 20, output_gains(model), 0))[0])
    assert 100 * exact < error(carried) < 0.01 * error(ported(model, T, "average")[0])


def test_carrying_without_the_writer_rule_is_not_exact():
    """The rule matters: on a split map, the gain kept in the norm as each row's average (the coordinate rule,
    T·γ for a coordinate map) with the writer T·W changes the function; the writer rule does not."""
    model = spread_gains(random_model(4, **PERI))
    T = split_map(16, 20, output_gains(model), 0)
    exact, _ = ported(model, T)
    canonical = canonicalize(model.state_dict(), model.config, "fold", "carry")[0]
    naive = exact.state_dict()
    squares = T.pow(2)
    for name in naive:
        if name.endswith("_out.weight"):
            gamma = canonical[name].double()
            naive[name] = (math.sqrt(16 / 20) * (squares @ gamma) / squares.sum(1)).float()
        elif name.endswith("c_proj.weight"):
            naive[name] = (T @ canonical[name].double()).float()
    idx = torch.randint(0, 11, (2, 8))
    broken = type(exact).from_state_dict(exact.config, naive).eval()
    assert (outputs(broken, idx) - outputs(model, idx)).abs().max() > 1e-3
    torch.testing.assert_close(outputs(exact, idx).log_softmax(-1), outputs(model, idx).log_softmax(-1), atol=5e-5,
                               rtol=0)


def test_transform_grows_gemma_style_models_exactly_with_split_and_refuses_what_it_cannot():
    model = spread_gains(random_model(5, head="tied", **PERI))
    with torch.no_grad():
        model.transformer.ln_f.weight.copy_(torch.linspace(-3, 40, 16))  # a final gain far from equal
    grown, record = transform_model(model, _spec(20, "split"))
    assert record["exact"] and int(((record["T"] != 0).sum(1) == 2).sum()) == 8
    assert grown.config.head == "tied" and grown.lm_head.weight is grown.transformer.wte.weight  # kept tied
    idx = torch.randint(0, 11, (2, 8))
    torch.testing.assert_close(outputs(grown, idx).log_softmax(-1), outputs(model, idx).log_softmax(-1), atol=5e-5,
                               rtol=0)
    for width in (16, 12, 25):
        with pytest.raises(TransformError, match="grows by pairs of coordinates"):
            transform_model(model, _spec(width, "split"))


def _spec(width: int, kind: str, **kw):
    from conftest import spec
    return spec(width, kind=kind, **kw)


def test_output_keep_keeps_the_most_outlying_output_gains_as_rows_of_their_own(char_data_dir):
    from lgpt.method.pipeline import output_gain_outliers
    from lgpt.plumbing.dataset import BatchLoader
    model = random_model(6, vocab_size=65, **PERI)
    with torch.no_grad():
        model.transformer.h[1].ln_2_out.weight[7] = 500.0  # far above its norm's median
        model.transformer.h[0].ln_1_out.weight[3] = 1e-3  # far below
    assert set(output_gain_outliers(model, 2)) == {3, 7}
    loader = BatchLoader(char_data_dir, 8, 4, "cpu")
    _, record = transform_model(model, _spec(12, "pca", output_keep=2, calib_batches=2), loader)
    T = record["T"]
    for j in (3, 7):
        rows = torch.nonzero(T[:, j].abs() > 1e-6).flatten()
        assert len(rows) == 1 and torch.allclose(T[rows[0]].abs(), torch.eye(16)[j])
    with pytest.raises(TransformError, match="output_keep must be a count"):
        transform_model(model, _spec(12, "pca", output_keep=-1), loader)


def test_gain_groups_keep_every_row_of_a_pca_map_inside_one_group_of_near_equal_gains(char_data_dir):
    from lgpt.method.maps import gain_groups
    from lgpt.plumbing.dataset import BatchLoader
    model = spread_gains(random_model(7, vocab_size=65, **PERI), low=0.01, high=100)
    labels = gain_groups(output_gains(model), 4)
    assert labels.shape == (16,) and set(labels.tolist()) <= set(range(4)) and len(set(labels.tolist())) > 1
    loader = BatchLoader(char_data_dir, 8, 4, "cpu")
    _, record = transform_model(model, _spec(12, "pca", gain_groups=4, calib_batches=2), loader)
    for row in record["T"]:
        assert len(set(labels[row.abs() > 1e-9].tolist())) == 1
    _, plain = transform_model(model, _spec(12, "pca", calib_batches=2), loader)
    assert any(len(set(labels[row.abs() > 1e-9].tolist())) > 1 for row in plain["T"])  # a plain PCA mixes groups
    with pytest.raises(TransformError, match="gain_groups=4 groups a PCA map's coordinates"):
        transform_model(random_model(7, norm_type="rmsnorm", norm_placement="pre"), _spec(12, "pca", gain_groups=4),
                        loader)


def test_fitted_lengths_are_the_weighted_least_squares_of_the_true_lengths(char_data_dir):
    """--fit_lengths: on the calibration tokens' writer outputs f, a minimises Σ ((zᵀa − ‖f‖²)/(‖f‖² + ε·d))²,
    z = (T·diag(γ)·f)², a ≥ a₀/1000 (checked against a naive bounded least squares, one row per token, without the
    ridge), so it matches the true lengths there better than the data-free fit."""
    import numpy as np
    from scipy.optimize import lsq_linear

    from lgpt.method.refit import fit_output_lengths
    from lgpt.method.roles import residual_roles
    from lgpt.plumbing.dataset import BatchLoader
    model = spread_gains(random_model(8, vocab_size=65, n_embd=32, **PERI), low=0.01, high=100, seed=8)
    batches = [BatchLoader(char_data_dir, 8, 8, "cpu").get_batch("train", seed=10_000 + i)[0] for i in range(3)]
    sd, cfg, _ = canonicalize(model.state_dict(), model.config, "fold", "carry")
    canonical = model_from_state(sd, cfg).eval()
    T = torch.linalg.qr(torch.randn(32, 32, generator=torch.Generator().manual_seed(0), dtype=torch.float64))[0][:24]
    norms = residual_roles(cfg).output_norms
    seen = {n: [] for n in norms}
    modules = dict(canonical.named_modules())
    hooks = [modules[n].register_forward_pre_hook(lambda _m, args, n=n: seen[n].append(args[0].reshape(-1, 32)))
             for n in norms]
    with torch.no_grad():
        for batch in batches:
            canonical(batch, features=True)
    for hook in hooks:
        hook.remove()
    fitted = fit_output_lengths(canonical, T, batches, ridge=0.0)
    for j, norm in enumerate(norms):
        gamma = sd[f"{norm}.weight"].double()
        gamma = torch.where(gamma.abs() < 1e-6 * gamma.abs().max(), 1e-6 * gamma.abs().max(), gamma)
        rows, targets = [], []
        for f in torch.cat(seen[norm]).double():
            scale = 1.0 / (float(f @ f) + cfg.norm_eps * 32)
            rows.append((T @ (gamma * f)) ** 2 * scale)
            targets.append(float(f @ f) * scale)
        Z, y = torch.stack(rows), torch.tensor(targets, dtype=torch.float64)
        floor = 1e-3 * length_fit(T, gamma)
        naive = torch.from_numpy(lsq_linear(Z.numpy(), y.numpy(), bounds=(floor.numpy(), np.inf), tol=1e-12).x)
        error = lambda a, Z=Z, y=y: float((Z @ a - y).pow(2).sum())  # noqa: E731
        assert error(fitted[:, j]) == pytest.approx(error(naive), rel=1e-6)
        assert bool((fitted[:, j] >= floor * (1 - 1e-9)).all())
        assert error(fitted[:, j]) < error(length_fit(T, gamma))


@settings(max_examples=20, deadline=None)
@given(d=st.integers(2, 8), extra=st.integers(-3, 3), seed=st.integers(0, 99))
def test_the_length_fit_minimises_the_isotropic_length_error(d, extra, seed):
    """length_fit against a naive least squares over M's d² entries and its trace (the same objective written
    out), and that objective against its meaning: E_f (fᵀMf − fᵀf)² for f ~ N(0, I), by sampling."""
    m = max(1, d + extra)
    g = torch.Generator().manual_seed(seed)
    T = torch.randn(m, d, generator=g, dtype=torch.float64)
    gamma = torch.exp(torch.randn(d, generator=g, dtype=torch.float64) * 2)
    a = length_fit(T, gamma)
    U = T * gamma
    design = torch.cat([math.sqrt(2) * torch.stack([torch.outer(u, u).flatten() for u in U], 1),
                        U.pow(2).sum(1)[None]])
    target = torch.cat([math.sqrt(2) * torch.eye(d, dtype=torch.float64).flatten(), torch.tensor([float(d)],
                                                                                                 dtype=torch.float64)])
    naive = torch.linalg.lstsq(design, target[:, None], driver="gelsd").solution[:, 0]

    def objective(x: torch.Tensor) -> float:
        M = U.T @ (x[:, None] * U) - torch.eye(d, dtype=torch.float64)
        return float(2 * M.pow(2).sum() + M.trace() ** 2)

    assert bool((a > 0).all())
    if bool((naive * U.pow(2).sum(1) > 1e-3).all()):  # the unconstrained optimum is allowed: it is found
        assert objective(a) <= objective(naive) * (1 + 1e-6) + 1e-9
    f = torch.randn(200_000, d, generator=g, dtype=torch.float64)
    M = U.T @ (a[:, None] * U)
    sampled = float((((f @ M) * f).sum(1) - f.pow(2).sum(1)).pow(2).mean())
    assert sampled == pytest.approx(objective(a), rel=0.1, abs=1e-6)


def test_a_zero_output_gain_is_carried_exactly_by_a_coordinate_map():
    """Its coordinate still counts in the norm's length (the writer row is kept) and is never written (γ' = 0)."""
    model = spread_gains(random_model(9, **PERI))
    assert any(bool((p == 0).any()) for n, p in model.named_parameters() if n.endswith("_out.weight"))
    new, notes = ported(model, torch.eye(16, dtype=torch.float64)[torch.randperm(16)])
    assert not notes
    gains = [p for n, p in new.named_parameters() if n.endswith("_out.weight")]
    assert all(int((p == 0).sum()) == 1 for p in gains)
    idx = torch.randint(0, 11, (2, 8))
    torch.testing.assert_close(outputs(new, idx).log_softmax(-1), outputs(model, idx).log_softmax(-1), atol=5e-5,
                               rtol=0)


def test_an_output_norm_of_all_zero_gains_is_carried_exactly_and_a_damaged_one_is_refused():
    """A block that writes nothing (every gain 0) stays silent at any width, exactly; a NaN gain is one clear error,
    never NaN weights recorded exact."""
    model = spread_gains(random_model(10, **PERI))
    with torch.no_grad():
        model.transformer.h[1].ln_2_out.weight.zero_()
    idx = torch.randint(0, 11, (2, 8))
    for T in (torch.eye(20, 16, dtype=torch.float64), split_map(16, 20, output_gains(model), 0)):
        new, notes = ported(model, T)
        assert not notes
        torch.testing.assert_close(outputs(new, idx).log_softmax(-1), outputs(model, idx).log_softmax(-1), atol=5e-5,
                                   rtol=0)
    with torch.no_grad():
        model.transformer.h[0].ln_1_out.weight[2] = float("nan")
    with pytest.raises(TransformError, match="not finite"):
        transform_model(model, _spec(20, "truncate"))


def test_lengths_fitted_on_text_keep_an_exact_map_exact(char_data_dir):
    """On zero padding the data-free lengths are already exact; fitting them on calibration text (its ridge pulls
    towards them, zero gains make a span ~10 orders of magnitude) must not make the record approximate."""
    from lgpt.plumbing.dataset import BatchLoader
    model = spread_gains(random_model(11, vocab_size=65, n_embd=32, **PERI), low=0.01, high=100, seed=11)
    loader = BatchLoader(char_data_dir, 8, 8, "cpu")
    grown, record = transform_model(model, _spec(40, "truncate", calib_batches=2, fit_lengths=2), loader)
    assert record["exact"] and not [n for n in record["notes"] if n.startswith("APPROXIMATE")]
    idx = loader.get_batch("val", seed=1)[0]
    torch.testing.assert_close(outputs(grown, idx).log_softmax(-1), outputs(model, idx).log_softmax(-1), atol=5e-5,
                               rtol=0)
