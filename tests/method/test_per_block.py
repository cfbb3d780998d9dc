"""Per-block maps with shortcut matrices (per_block.py, SliceGPT's construction): exact at m ≥ d for orthonormal
per-site maps, the shortcut rule against its formula, per-site calibration against a naive collection, and what it
refuses."""
import pytest
import torch

from conftest import spec
from lgpt.method.maps import Calibration, PortMaps, make_projection, unit_second_moment
from lgpt.method.per_block import (
    collect_site_calibration,
    port_shortcut,
    sequential_site_maps,
    site_groups,
    site_maps,
    site_norms,
)
from lgpt.method.pipeline import transform_model
from lgpt.method.porting import canonicalize, model_from_state
from lgpt.plumbing.dataset import CALIBRATION_SEED_STRIDE, BatchLoader
from lgpt.plumbing.errors import ConfigError, TransformError
from model import GPT, GPTConfig
from test_transform import outputs, random_model
from transform import TransformConfig

IDX = torch.randint(0, 11, (3, 8), generator=torch.Generator().manual_seed(0))
ARCHITECTURES = {
    "gpt2-like: LayerNorm, vector gains, biases, tied": dict(head="tied"),
    "llama-like: RMSNorm, SwiGLU, rope, GQA, linear head": dict(norm_type="rmsnorm", mlp="swiglu", pos="rope",
                                                                n_head=4, n_kv_head=2, bias=False),
    "peri-LN, scalar gains": dict(norm_placement="peri", norm_gain="scalar", norm_type="rmsnorm"),
}


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
@pytest.mark.parametrize("width", [16, 24])
def test_orthonormal_per_site_maps_keep_the_function(arch, width):
    model = random_model(0, **ARCHITECTURES[arch])
    new, record = transform_model(model, spec(width, kind="orthogonal", porting="per_block", seed=3))
    assert record["exact"] and record["site_maps"] == 2 * model.config.n_layer + 1
    assert new.config.shortcuts and new.config.n_embd == width and new.config.head == "linear"
    torch.testing.assert_close(outputs(new, IDX), outputs(model, IDX), atol=2e-5, rtol=0)
    # the shortcuts really change the basis: distinct maps per site, so S is not the identity
    assert not torch.allclose(new.transformer.h[0].shortcut_1.weight, torch.eye(width), atol=1e-3)


def test_a_per_block_model_ports_exactly_again_with_one_global_map():
    """S → T·S·T⁺ (porting.port_shortcut): a model with shortcuts grows exactly under residual porting."""
    once, _ = transform_model(random_model(1, norm_type="rmsnorm"), spec(16, kind="orthogonal", porting="per_block"))
    twice, record = transform_model(once, spec(24, kind="orthogonal", porting="residual", seed=5))
    assert record["exact"]
    torch.testing.assert_close(outputs(twice, IDX), outputs(once, IDX), atol=2e-5, rtol=0)


def test_the_shortcut_rule_is_its_formula():
    g = torch.Generator().manual_seed(0)
    S = torch.randn(6, 6, generator=g, dtype=torch.float64)
    a, b = (PortMaps(*make_projection("gaussian", 6, 4, seed), make_projection("gaussian", 6, 4, seed)[1])
            for seed in (1, 2))
    expected = b.T @ S @ torch.linalg.pinv(a.T)
    torch.testing.assert_close(port_shortcut(S, b, a), expected)


def test_per_site_calibration_is_each_sites_unit_second_moment(char_data_dir):
    """Sites 2l (each block's input) and 2L (the final norm's) equal the hidden states return_hidden gives; site 0
    also counts every token embedding."""
    model = random_model(2, n_layer=2, vocab_size=65, block_size=16)
    loader = BatchLoader(char_data_dir, 16, 4, "cpu")
    sites = collect_site_calibration(model, loader, batches=2, seed=7)
    assert len(sites) == len(site_norms(model.config)) == 5
    hidden = [[], [], []]
    with torch.no_grad():
        for k in range(2):
            x, _ = loader.get_batch("train", seed=7 * CALIBRATION_SEED_STRIDE + k)
            for i, h in enumerate(model(x, return_hidden=True)[2]):
                hidden[i].append(h)
    for site, states in ((0, hidden[0]), (2, hidden[1]), (4, hidden[2])):
        moment, n = unit_second_moment(torch.cat(states))
        if site == 0:
            e, ne = unit_second_moment(model.transformer.wte.weight)
            moment, n = moment + e, n + ne
        assert sites[site].count == n
        torch.testing.assert_close(sites[site].second_moment, moment / n)
    text_only = collect_site_calibration(model, loader, batches=2, seed=7, vocabulary=False)[0]
    moment, n = unit_second_moment(torch.cat(hidden[0]))
    assert text_only.count == n
    torch.testing.assert_close(text_only.second_moment, moment / n)


def test_pca_per_block_shrinks_with_one_calibration_per_site(char_data_dir):
    model = random_model(3, vocab_size=65, block_size=16, norm_type="rmsnorm")
    loader = BatchLoader(char_data_dir, 16, 4, "cpu")
    new, record = transform_model(model, spec(12, kind="pca", porting="per_block", calib_batches=2), loader)
    assert not record["exact"] and new.config.n_embd == 12
    shortcut_params = 2 * model.config.n_layer * 12 * 12
    assert sum(p.numel() for n, p in new.named_parameters() if ".shortcut_" in n) == shortcut_params
    assert torch.isfinite(outputs(new, torch.randint(0, 65, (2, 16)))).all()


def projected_model_logits(model: GPT, calibration: list[torch.Tensor], idx: torch.Tensor, m: int,
                           weighting: str, vocabulary: bool = True) -> torch.Tensor:
    """A naive sequential fit, written out: cut the residual stream of the d-wide canonical model to each site's
    top-m principal subspace (P = TᵀT), in order, each PCA on the calibration states already cut before it; then
    the cut model's logits on ``idx`` (what the ported m-wide model must compute). Peri-LN's output norm reads the
    output cut to the next site (norm_out(P_{s+1}·y)); that site's PCA sees it uncut."""
    sd, cfg, _ = canonicalize(model.state_dict(), model.config, "fold")
    canon = model_from_state(sd, cfg).eval()
    peri = cfg.norm_placement == "peri"
    with torch.no_grad():
        h_cal, h = torch.cat([canon.embed(x) for x in calibration]), canon.embed(idx)
        y_cal = y = out_norm = None
        for site in range(2 * cfg.n_layer + 1):
            fit_on = h_cal if y_cal is None else h_cal + out_norm(y_cal)
            moment, n = unit_second_moment(fit_on, weighting)
            if site == 0 and vocabulary:
                e, ne = unit_second_moment(canon.transformer.wte.weight, weighting)
                moment, n = moment + e, n + ne
            T, _ = make_projection("pca", cfg.n_embd, m, 0, moment / n)
            P = (T.T @ T).float()
            if y_cal is not None:
                h_cal, h = h_cal + out_norm(y_cal @ P), h + out_norm(y @ P)
            h_cal, h = h_cal @ P, h @ P
            if site == 2 * cfg.n_layer:
                return canon.lm_head(canon.transformer.ln_f(h))
            block, which = canon.transformer.h[site // 2], site % 2 + 1
            norm, f = (block.ln_1, block.attn) if which == 1 else (block.ln_2, block.mlp)
            y_cal, y = f(norm(h_cal)), f(norm(h))
            if peri:
                out_norm = getattr(block, f"ln_{which}_out")
            else:
                h_cal, h, y_cal, y = h_cal + y_cal, h + y, None, None


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
@pytest.mark.parametrize("weighting", ["unit", "raw"])
def test_sequential_calibration_fits_each_site_to_the_model_already_cut(arch, weighting, char_data_dir):
    """SliceGPT's order: the ported m-wide model computes exactly the d-wide model cut site by site, each cut the
    PCA of the states left by the cuts before it (against the naive loop above); independent per-site PCAs differ."""
    model = random_model(5, vocab_size=65, block_size=16, **ARCHITECTURES[arch])
    loader = BatchLoader(char_data_dir, 16, 4, "cpu")
    new, record = transform_model(model, spec(10, kind="pca", porting="per_block", calib_batches=2, seed=0,
                                              calib_weighting=weighting, sequential_calibration=True), loader)
    assert any("in order" in note for note in record["notes"])
    calibration = [loader.get_batch("train", seed=k)[0] for k in range(2)]
    idx = torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(1))
    expected = projected_model_logits(model, calibration, idx, 10, weighting)
    torch.testing.assert_close(outputs(new, idx), expected, atol=1e-4, rtol=1e-4)
    independent, _ = transform_model(model, spec(10, kind="pca", porting="per_block", calib_batches=2, seed=0,
                                                 calib_weighting=weighting), loader)
    assert (outputs(independent, idx) - expected).abs().max() > 1e-3


def test_sequential_calibration_without_the_vocabulary_fits_site_0_to_the_texts_embeddings(char_data_dir):
    """calib_vocabulary=False (SliceGPT's): the first site's PCA sees only the calibration text's embeddings."""
    model = random_model(5, vocab_size=65, block_size=16, **ARCHITECTURES["llama-like: RMSNorm, SwiGLU, rope, GQA, "
                                                                        "linear head"])
    loader = BatchLoader(char_data_dir, 16, 4, "cpu")
    calibration = [loader.get_batch("train", seed=k)[0] for k in range(2)]
    idx = torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(1))
    new, record = transform_model(model, spec(10, kind="pca", porting="per_block", calib_batches=2,
                                              calib_weighting="raw", sequential_calibration=True,
                                              calib_vocabulary=False), loader)
    assert record["calib_vocabulary"] is False
    expected = projected_model_logits(model, calibration, idx, 10, "raw", vocabulary=False)
    torch.testing.assert_close(outputs(new, idx), expected, atol=1e-4, rtol=1e-4)
    assert (projected_model_logits(model, calibration, idx, 10, "raw") - expected).abs().max() > 1e-3


def test_sequential_calibration_at_full_width_keeps_the_function(char_data_dir):
    model = random_model(6, vocab_size=65, block_size=16, norm_type="rmsnorm")
    loader = BatchLoader(char_data_dir, 16, 4, "cpu")
    maps = sequential_site_maps(model, 16, loader, batches=1)
    assert len(maps) == len(site_norms(model.config))
    new, record = transform_model(model, spec(16, kind="pca", porting="per_block", calib_batches=1,
                                              sequential_calibration=True), loader)
    assert record["exact"]
    torch.testing.assert_close(outputs(new, IDX), outputs(model, IDX), atol=2e-5, rtol=0)


def test_sequential_calibration_is_refused_outside_per_block_pca():
    for options in (dict(porting="residual", kind="pca"), dict(porting="per_block", kind="orthogonal")):
        with pytest.raises(ConfigError, match="sequential_calibration"):
            TransformConfig(in_dir="x", out_dir="y", width=8, sequential_calibration=True, **options).validate()
    with pytest.raises(TransformError, match="sequential_calibration"):
        transform_model(random_model(7), spec(8, kind="orthogonal", sequential_calibration=True))
    with pytest.raises(TransformError, match="sequential_calibration"):
        transform_model(random_model(7), spec(8, kind="orthogonal", porting="per_block", sequential_calibration=True))


def test_shortcuts_start_as_the_identity_when_trained_from_scratch():
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=8, block_size=4, vocab_size=7, shortcuts=True))
    for block in model.transformer.h:
        assert torch.equal(block.shortcut_1.weight, torch.eye(8)) and torch.equal(block.shortcut_2.weight, torch.eye(8))


@pytest.mark.parametrize("options, words", [
    (dict(refit="all"), "takes no refit"),
    (dict(n_head=4), "takes no n_head"),
])
def test_what_per_block_refuses(options, words, char_data_dir):
    loader = BatchLoader(char_data_dir, 8, 2, "cpu")
    with pytest.raises(TransformError, match=words):
        transform_model(random_model(4, vocab_size=65), spec(24 if "n_head" in options else 12, kind="orthogonal",
                                                             porting="per_block", **options), loader)
    with pytest.raises(TransformError, match="KNN head"):
        transform_model(random_model(4, head="knn", norm_gain="scalar"), spec(16, kind="orthogonal",
                                                                              porting="per_block"))
    with pytest.raises(ConfigError, match="carry_optimizer"):
        TransformConfig(in_dir="x", out_dir="y", width=8, porting="per_block", carry_optimizer=True).validate()


# ----------------------------------------------------------------------------------------------
# A few maps (--map_groups): runs of consecutive sites share one map, a shortcut only where the map changes


def test_site_groups_are_runs_of_consecutive_sites_as_equal_as_they_come():
    assert site_groups(9, 0) == list(range(9))
    assert site_groups(9, 4) == [0, 0, 0, 1, 1, 2, 2, 3, 3]
    assert site_groups(9, 1) == [0] * 9 and site_groups(9, 9) == list(range(9))
    for bad in (-1, 10):
        with pytest.raises(TransformError, match="map_groups must lie in 1 … 9"):
            site_groups(9, bad)


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_grouped_orthonormal_maps_keep_the_function_with_a_shortcut_only_where_the_map_changes(arch):
    model = random_model(0, **ARCHITECTURES[arch])
    n_layer = model.config.n_layer
    new, record = transform_model(model, spec(24, kind="orthogonal", porting="per_block", seed=3, map_groups=3))
    assert record["exact"] and record["map_groups"] == 3
    paths = [p for p in range(2 * n_layer) if site_groups(2 * n_layer + 1, 3)[p] != site_groups(2 * n_layer + 1, 3)
             [p + 1]]
    assert new.config.shortcuts == tuple(paths) and len(paths) == 2
    assert sum(p.numel() for n, p in new.named_parameters() if ".shortcut_" in n) == 2 * 24 * 24
    torch.testing.assert_close(outputs(new, IDX), outputs(model, IDX), atol=2e-5, rtol=0)
    again, _ = transform_model(new, spec(32, kind="orthogonal", porting="residual", seed=5))  # a partial set ports too
    torch.testing.assert_close(outputs(again, IDX), outputs(model, IDX), atol=3e-5, rtol=0)


def test_a_group_per_site_is_the_per_site_construction(char_data_dir):
    model = random_model(3, vocab_size=65, block_size=16, norm_type="rmsnorm")
    loader = BatchLoader(char_data_dir, 16, 4, "cpu")
    common = dict(kind="pca", porting="per_block", calib_batches=2)
    per_site, _ = transform_model(model, spec(12, **common), loader)
    groups, _ = transform_model(model, spec(12, map_groups=2 * model.config.n_layer + 1, **common), loader)
    assert groups.config.shortcuts is True
    idx = torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(outputs(groups, idx), outputs(per_site, idx), atol=0, rtol=0)


def test_a_groups_pca_is_that_of_its_sites_moments_weighted_by_their_counts(char_data_dir):
    model = random_model(3, vocab_size=65, block_size=16, norm_type="rmsnorm")
    loader = BatchLoader(char_data_dir, 16, 4, "cpu")
    sites = collect_site_calibration(model, loader, batches=2)
    maps = site_maps("pca", 16, 12, len(sites), 0, sites, 1e-6, groups=2)
    first = [c for c, g in zip(sites, site_groups(len(sites), 2)) if g == 0]
    moment = sum(c.second_moment * c.count for c in first) / sum(c.count for c in first)
    T, _ = make_projection("pca", 16, 12, 0, Calibration(moment, sum(c.count for c in first)), 1e-6)
    torch.testing.assert_close(maps[0][0], T)
    assert all(torch.equal(maps[s][0], maps[0][0]) for s in range(len(first)))
    assert not torch.equal(maps[-1][0], maps[0][0])


def grouped_projected_logits(model: GPT, calibration: list[torch.Tensor], idx: torch.Tensor, m: int,
                             groups: int) -> torch.Tensor:
    """The naive sequential fit with groups, pre-LN: each group's P = TᵀT is the PCA of the states at all its sites,
    carried through the group uncut from the cut states entering it; then the group's sites are cut by P."""
    sd, cfg, _ = canonicalize(model.state_dict(), model.config, "fold")
    canon = model_from_state(sd, cfg).eval()
    n_sites = 2 * cfg.n_layer + 1
    of = site_groups(n_sites, groups)

    def step(h: torch.Tensor, site: int) -> torch.Tensor:
        block, which = canon.transformer.h[site // 2], site % 2 + 1
        norm, f = (block.ln_1, block.attn) if which == 1 else (block.ln_2, block.mlp)
        return h + f(norm(h))

    with torch.no_grad():
        h_cal, h = torch.cat([canon.embed(x) for x in calibration]), canon.embed(idx)
        for g in range(groups):
            sites = [s for s in range(n_sites) if of[s] == g]
            moment, n, fit = 0, 0, h_cal
            for s in sites:
                a, b = unit_second_moment(fit, "unit")
                moment, n = moment + a, n + b
                if s == 0:
                    e, ne = unit_second_moment(canon.transformer.wte.weight, "unit")
                    moment, n = moment + e, n + ne
                fit = step(fit, s) if s < n_sites - 1 else fit
            T, _ = make_projection("pca", cfg.n_embd, m, 0, moment / n)
            P = (T.T @ T).float()
            for s in sites:
                h_cal, h = h_cal @ P, h @ P
                if s == n_sites - 1:
                    return canon.lm_head(canon.transformer.ln_f(h))
                h_cal, h = step(h_cal, s), step(h, s)


def test_grouped_sequential_calibration_fits_each_group_to_the_model_already_cut(char_data_dir):
    model = random_model(5, vocab_size=65, block_size=16, norm_type="rmsnorm")
    loader = BatchLoader(char_data_dir, 16, 4, "cpu")
    calibration = [loader.get_batch("train", seed=k)[0] for k in range(2)]
    idx = torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(1))
    new, record = transform_model(model, spec(10, kind="pca", porting="per_block", calib_batches=2,
                                              sequential_calibration=True, map_groups=2), loader)
    assert any("in 2 groups, 1 shortcut matrices" in note for note in record["notes"])
    torch.testing.assert_close(outputs(new, idx), grouped_projected_logits(model, calibration, idx, 10, 2),
                               atol=1e-4, rtol=1e-4)
    assert (grouped_projected_logits(model, calibration, idx, 10, 3) - outputs(new, idx)).abs().max() > 1e-3


def test_map_groups_is_refused_without_per_block_maps_and_shortcut_paths_are_checked():
    with pytest.raises(ConfigError, match="map_groups=2 shares per-block maps"):
        TransformConfig(in_dir="x", out_dir="y", width=8, map_groups=2).validate()
    with pytest.raises(ConfigError, match="map_groups=-1"):
        TransformConfig(in_dir="x", out_dir="y", width=8, porting="per_block", map_groups=-1).validate()
    with pytest.raises(TransformError, match="map_groups=2 shares per-block maps"):
        transform_model(random_model(7), spec(8, kind="orthogonal", map_groups=2))
    with pytest.raises(TransformError, match="map_groups must lie in 1 … "):
        transform_model(random_model(7), spec(8, kind="orthogonal", porting="per_block", map_groups=99))
    for bad in ((3, 1), (0, 0), (0, 99), (True,), [1, 2]):
        with pytest.raises(ValueError, match="shortcuts must be"):
            GPTConfig(n_layer=2, n_head=2, n_embd=8, block_size=4, vocab_size=7, shortcuts=bad)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=8, block_size=4, vocab_size=7, shortcuts=(1, 2))
    assert cfg.shortcuts == (1, 2) and [cfg.has_shortcut(i, j) for i in (0, 1) for j in (1, 2)] == [
        False, True, True, False]
