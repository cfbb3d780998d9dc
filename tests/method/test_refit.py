"""Corrections after porting (refit.py): exact where they must be, the formulas against naive versions, the
learned map's guarantees, and the errors of requests that cannot apply."""
import math

import pytest
import torch

from conftest import spec
from lgpt.method import refit
from lgpt.method.pipeline import transform_model
from lgpt.method.porting import canonical_model
from lgpt.method.roles import residual_roles
from lgpt.plumbing.checkpoint import load_checkpoint, load_model
from lgpt.plumbing.configurator import load_config
from lgpt.plumbing.dataset import BatchLoader
from lgpt.plumbing.errors import ConfigError, TransformError
from transform import TransformConfig, transform_checkpoint
from transform import main as transform_main  # the CLI's printing


@pytest.fixture(scope="module")
def setup(trained_dir, char_data_dir):
    model, _ = load_model(trained_dir)
    loader = BatchLoader(char_data_dir, model.config.block_size, 8)
    return model, loader


def logits(model, batch):
    with torch.no_grad():
        return model(batch, all_logits=True)[0]


@pytest.mark.parametrize("mode", ["gains", "readers", "all"])
def test_refit_of_an_exact_port_changes_nothing(setup, mode):
    """Orthogonal T at m ≥ d ports exactly: each fit's optimum is the ported weights themselves."""
    model, loader = setup
    plain, _ = transform_model(model, spec(48, kind="orthogonal", seed=1), loader)
    fitted, record = transform_model(model, spec(48, kind="orthogonal", seed=1, refit=mode, refit_ridge=0.0), loader)
    batch = loader.get_batch("val", 0)[0]
    torch.testing.assert_close(logits(fitted, batch), logits(plain, batch), atol=2e-4, rtol=0)
    if mode == "gains":  # factor 1: the fitted gains are exactly scale_gain's √(d/m)
        for norm, factor in record["corrections"]["gain_factors"].items():
            assert factor == pytest.approx(1.0, abs=1e-5)
            gain = fitted.get_submodule(norm).weight.item()
            original = canonical_model(model)[0].get_submodule(norm).weight.item()
            assert gain == pytest.approx(original * math.sqrt(32 / 48), rel=1e-5)
    assert record["corrections"]["calibration_kl_after"] < 1e-6


def test_the_first_reader_refit_is_the_least_squares_solution(setup):
    """Layer 0's Q/K/V sees an input no earlier refit has touched: its refit equals lstsq on the captured data."""
    model, loader = setup
    batches = refit.calibration_batches(loader, 4, 0)
    plain, _ = transform_model(model, spec(16, kind="pca", calib_batches=4), loader)
    fitted, _ = transform_model(model, spec(16, kind="pca", calib_batches=4, refit="readers", refit_ridge=0.0), loader)
    original = canonical_model(model)[0]
    name = "transformer.h.0.attn.c_attn"
    X = torch.cat([refit.module_io(plain, name, b)[0] for b in batches]).double()
    Y = torch.cat([refit.module_io(original, name, b)[1] for b in batches]).double()
    bias = plain.get_submodule(name).bias
    if bias is not None:
        Y = Y - bias.double()
    naive = torch.linalg.lstsq(X, Y).solution.T
    torch.testing.assert_close(fitted.get_submodule(name).weight.double(), naive, atol=1e-4, rtol=1e-3)


RIDGE = 1e-3  # the writers' problems are ill-conditioned on 512 rows without one


def naive_sequential_refit(original, new, T, batches, mode):
    """The refit as first written: every module's data from whole-model forward passes (its input in the new
    model as refit so far, the original's output), Y formed explicitly, the ridge solved directly."""
    names = []
    for i in range(new.config.n_layer):
        names += [(f"transformer.h.{i}.attn.c_attn", "reader"), (f"transformer.h.{i}.attn.c_proj", "writer"),
                  (f"transformer.h.{i}.mlp.c_fc", "reader"), (f"transformer.h.{i}.mlp.c_proj", "writer")]
    names.append(("lm_head", "reader"))
    for name, role in names:
        if role == "writer" and mode != "all":
            continue
        X = torch.cat([refit.module_io(new, name, b)[0] for b in batches]).double()
        Y = torch.cat([refit.module_io(original, name, b)[1] for b in batches]).double()
        if role == "writer":
            Y = Y @ T.double().T
        bias = new.get_submodule(name).bias
        if bias is not None:
            Y = Y - bias.double()
        G = X.T @ X
        G = G + RIDGE * torch.trace(G) / len(G) * torch.eye(len(G), dtype=G.dtype)
        with torch.no_grad():
            new.get_submodule(name).weight.copy_(torch.linalg.solve(G, X.T @ Y).T.float())
    return new


@pytest.mark.parametrize("mode", ["readers", "all"])
def test_the_block_sequential_refit_equals_the_naive_whole_model_one(setup, mode):
    """The refit keeps per-block streams and never forms the original outputs; the naive version runs the whole
    model for every module. Same least-squares problems, so the same weights."""
    model, loader = setup
    batches = refit.calibration_batches(loader, 4, 3)  # the transform's seed picks its calibration batches
    fitted, record = transform_model(model, spec(16, kind="gaussian", seed=3, calib_batches=4, refit=mode,
                                                 refit_ridge=RIDGE), loader)
    plain, _ = transform_model(model, spec(16, kind="gaussian", seed=3, calib_batches=4), loader)
    naive = naive_sequential_refit(canonical_model(model)[0], plain, record["T"], batches, mode)
    for (name, got), (_, want) in zip(fitted.named_parameters(), naive.named_parameters()):
        torch.testing.assert_close(got, want, atol=1e-5 * (1 + want.abs().max().item()), rtol=1e-3, msg=name)
    assert all(0 <= e < 1 for e in record["corrections"]["relative_errors"].values())


def test_refit_reduces_the_calibration_loss_of_a_shrink(setup):
    model, loader = setup
    _, readers = transform_model(model, spec(16, kind="gaussian", refit="readers"), loader)
    _, everything = transform_model(model, spec(16, kind="gaussian", refit="all"), loader)
    for record in (readers, everything):
        c = record["corrections"]
        assert c["calibration_kl_after"] < 0.5 * c["calibration_kl_before"]
    assert everything["corrections"]["calibration_kl_after"] <= readers["corrections"]["calibration_kl_after"] + 1e-6
    assert set(everything["corrections"]["relative_errors"]) > set(readers["corrections"]["relative_errors"])


def test_learned_map_stays_orthonormal_and_never_loses_to_its_start(setup):
    model, loader = setup
    new, record = transform_model(model, spec(16, kind="pca", learn_steps=15, learn_lr=3e-3), loader)
    T = record["T"].double()
    torch.testing.assert_close(T @ T.T, torch.eye(16, dtype=torch.float64), atol=1e-6, rtol=0)
    learned = record["corrections"]["learned_map"]
    assert learned["learned"] < learned["initial"]  # 15 steps on a PCA start already help this model
    again, record_again = transform_model(model, spec(16, kind="pca", learn_steps=15, learn_lr=3e-3), loader)
    assert torch.equal(record["T"], record_again["T"])  # deterministic
    # a learning rate so large it wrecks T: the initial map is kept
    # whichever T is kept, it is the better of the two on the calibration loss, and 'initial' means the PCA start
    _, wrecked = transform_model(model, spec(16, kind="pca", learn_steps=3, learn_lr=10.0), loader)
    kept = wrecked["corrections"]["learned_map"]
    assert kept["kept"] == ("learned" if kept["learned"] <= kept["initial"] else "initial")
    if kept["kept"] == "initial":
        _, start = transform_model(model, spec(16, kind="pca"), loader)
        torch.testing.assert_close(wrecked["T"], start["T"], atol=1e-5, rtol=0)


def test_gain_readers_is_a_per_coordinate_norm_gain_folded_into_its_readers(setup):
    """W·diag(g)·n(x) = W·(g ⊙ n(x)): the folded gain acts as a per-dimension gain of the norm would."""
    model, _ = setup
    sites = refit.readers_by_norm(model)
    g = {norm: 0.5 + torch.rand(model.config.n_embd, generator=torch.Generator().manual_seed(i))
         for i, (norm, _) in enumerate(sites)}
    params = dict(model.named_parameters())
    folded = refit.gain_readers(params, sites, g)
    x = torch.randn(5, model.config.n_embd, generator=torch.Generator().manual_seed(9))
    for norm, readers in sites:
        for reader in readers:
            W = params[f"{reader}.weight"]
            torch.testing.assert_close(x @ folded[f"{reader}.weight"].T, (g[norm] * x) @ W.T, atol=1e-5, rtol=1e-5)
    assert all(torch.equal(params[k], v) for k, v in model.named_parameters())  # its input is left as it was
    assert {k for k in folded if not torch.equal(folded[k], params[k])} == {f"{r}.weight" for _, rs in sites
                                                                               for r in rs}


def test_learned_gains_lower_the_calibration_kl_and_are_in_the_saved_model(setup):
    """--learn_gain_lr learns each norm's per-coordinate gain with T: at the same steps the calibration KL ends
    lower than T's alone, and the returned model carries the gains (its KL is the one the learning recorded)."""
    model, loader = setup
    options = dict(kind="pca", calib_batches=4, learn_steps=12, learn_lr=3e-3)
    _, alone = transform_model(model, spec(16, **options), loader)
    new, both = transform_model(model, spec(16, learn_gain_lr=3e-2, **options), loader)
    learned, plain = both["corrections"]["learned_map"], alone["corrections"]["learned_map"]
    assert learned["kept"] == "learned" and learned["learned"] < plain["learned"]
    low, high = learned["gain_range"]
    assert low < 0.99 and high > 1.01  # the gains moved
    assert both["learn_gain_lr"] == 3e-2 and "map and norm gains learned" in " ".join(both["notes"])
    original = canonical_model(model)[0]
    batches = refit.calibration_batches(loader, 4, 0)
    assert refit.calibration_kl(original, new, batches) == pytest.approx(learned["learned"], rel=1e-3)


def test_gain_writers_is_a_per_coordinate_gain_on_each_writers_output(setup):
    """diag(c)·(W·x + b): the folded gain scales what each writer adds to the stream, coordinate by coordinate."""
    model, _ = setup
    writers = residual_roles(model.config).writers
    n = model.config.n_embd
    c = {w: 0.5 + torch.rand(n, generator=torch.Generator().manual_seed(i)) for i, w in enumerate(writers)}
    params = dict(model.named_parameters())
    folded = refit.gain_writers(params, writers, c)
    for writer in writers:
        module = model.get_submodule(writer)
        x = torch.randn(5, module.in_features, generator=torch.Generator().manual_seed(3))
        bias = folded.get(f"{writer}.bias")
        out = x @ folded[f"{writer}.weight"].T + (bias if bias is not None else 0)
        torch.testing.assert_close(out, c[writer] * module(x), atol=1e-5, rtol=1e-5)
    assert all(torch.equal(params[k], v) for k, v in model.named_parameters())  # its input is left as it was
    changed = {k for k in folded if not torch.equal(folded[k], params[k])}
    assert {k.rsplit(".", 1)[0] for k in changed} == set(writers)


def test_learned_writer_gains_are_learned_and_in_the_saved_model(setup):
    """--learn_writer_gains adds each writer's output gain to the norms' gains: they move, the calibration KL ends
    below the start, and the returned model carries both (its KL is the one the learning recorded). Whether they
    beat the norms' gains alone is the real model's question (results/real_model_tied), not this toy's."""
    model, loader = setup
    options = dict(kind="pca", calib_batches=4, learn_steps=12, learn_lr=3e-3,
                   learn_gain_lr=3e-2)
    _, readers = transform_model(model, spec(16, **options), loader)
    new, both = transform_model(model, spec(16, learn_writer_gains=True, **options), loader)
    learned, plain = both["corrections"]["learned_map"], readers["corrections"]["learned_map"]
    assert learned["kept"] == "learned" and learned["learned"] < learned["initial"] / 2
    assert learned["learned"] != plain["learned"]
    low, high = learned["writer_gain_range"]
    assert low < 0.99 and high > 1.01 and "writer_gain_range" not in plain
    assert both["learn_writer_gains"] and not readers["learn_writer_gains"]
    assert "map and norm and writer gains learned" in " ".join(both["notes"])
    original = canonical_model(model)[0]
    batches = refit.calibration_batches(loader, 4, 0)
    assert refit.calibration_kl(original, new, batches) == pytest.approx(learned["learned"], rel=1e-3)


def test_refit_records_travel_through_the_cli_path(trained_dir, char_data_dir, tmp_path):
    record = transform_checkpoint(TransformConfig(in_dir=trained_dir, out_dir=str(tmp_path / "t"), width=16,
                                                  kind="pca", data_dir=char_data_dir, eval_iters=2, refit="all"))
    saved = load_checkpoint(str(tmp_path / "t"))["transform"]
    assert saved["refit"] == "all" and "relative_errors" in saved["corrections"]
    assert record["val_loss_after"] > 0


def test_the_record_says_where_the_time_went(setup, trained_dir, char_data_dir, tmp_path, capsys):
    """phase_seconds: each step of the pipeline that ran, in order, adding up to the transform's seconds."""
    model, loader = setup
    _, record = transform_model(model, spec(16, kind="pca", calib_batches=2, learn_steps=1, refit="readers"), loader)
    phases = record["phase_seconds"]
    assert list(phases) == ["check", "calibrate", "learn", "port", "refit/tie"]
    assert all(t >= 0 for t in phases.values()) and sum(phases.values()) <= record["seconds"]
    _, plain = transform_model(model, spec(16, kind="orthogonal"))
    assert list(plain["phase_seconds"]) == ["check", "calibrate", "port"]  # no correction ran: none timed
    transform_main([f"--in_dir={trained_dir}", f"--out_dir={tmp_path / 't'}", "--width=16", "--kind=pca",
          f"--data_dir={char_data_dir}", "--eval_iters=0", "--refit=gains"])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("  seconds: "))
    assert line.startswith("  seconds: check ") and ", refit/tie " in line and line.endswith(")")


def test_bad_correction_requests_fail_with_one_clear_error(setup):
    model, loader = setup
    with pytest.raises(TransformError, match="refit='readers' needs calibration data"):
        transform_model(model, spec(16, kind="orthogonal", refit="readers"))
    with pytest.raises(TransformError, match="learn_steps must be >= 0"):
        transform_model(model, spec(16, kind="pca", learn_steps=-1), loader)
    with pytest.raises(TransformError, match="need porting='residual'"):
        transform_model(model, spec(16, kind="gaussian", porting="sandwich", refit="all"), loader)
    with pytest.raises(TransformError, match=r"shrink \(m < d, or m = d with --learn_label_weight > 0\)"):
        transform_model(model, spec(48, kind="orthogonal", learn_steps=5), loader)
    with pytest.raises(TransformError, match="refit='everything' is not one of"):
        transform_model(model, spec(16, kind="pca", refit="everything"), loader)
    with pytest.raises(ConfigError, match="learn_steps must be >= 0"):
        load_config(TransformConfig, ["--out_dir=x", "--width=8", "--learn_steps=-2"])
    with pytest.raises(ConfigError, match="refit='x' is not one of"):
        load_config(TransformConfig, ["--out_dir=x", "--width=8", "--refit=x"])
    with pytest.raises(ConfigError, match="learn_gain_lr=0.01 needs learn_steps > 0"):
        load_config(TransformConfig, ["--out_dir=x", "--width=8", "--learn_gain_lr=1e-2"])
    with pytest.raises(ConfigError, match="learn_gain_lr=-1.0 needs learn_steps > 0 and must be >= 0"):
        load_config(TransformConfig, ["--out_dir=x", "--width=8", "--learn_steps=2", "--learn_gain_lr=-1"])
    with pytest.raises(TransformError, match="learn_gain_lr=0.01 needs learn_steps > 0"):
        transform_model(model, spec(16, kind="pca", learn_gain_lr=1e-2), loader)
    with pytest.raises(ConfigError, match="learn_writer_gains=True learns the writers' gains at learn_gain_lr"):
        load_config(TransformConfig, ["--out_dir=x", "--width=8", "--learn_steps=2", "--learn_writer_gains=True"])
    with pytest.raises(TransformError, match="add --learn_gain_lr=R"):
        transform_model(model, spec(16, kind="pca", learn_steps=2, learn_writer_gains=True), loader)


def test_the_chunked_calibration_kl_equals_the_whole_batch_kl(setup):
    from lgpt.method.refit import calibration_kl
    model, loader = setup
    batches = refit.calibration_batches(loader, 2, 0)
    new, _ = transform_model(model, spec(16, kind="gaussian", seed=1))
    original = canonical_model(model)[0]
    naive = sum(refit.kl_to_original(torch.log_softmax(logits(original, b).flatten(0, -2), -1), logits(new, b)).item()
                for b in batches) / 2
    assert naive > 0.01
    assert calibration_kl(original, new, batches, chunk=7) == pytest.approx(naive, rel=1e-5)


def test_the_learned_map_is_the_same_when_batches_are_split_into_passes(setup, monkeypatch):
    """learn_map accumulates the gradient over passes of tokens_per_pass tokens (memory on big vocabularies):
    splitting a batch changes nothing but rounding."""
    import functools

    from lgpt.method import pipeline
    model, loader = setup
    _, whole = transform_model(model, spec(16, kind="pca", learn_steps=6, learn_lr=3e-3), loader)
    monkeypatch.setattr(pipeline, "learn_map", functools.partial(refit.learn_map, tokens_per_pass=40))
    _, split = transform_model(model, spec(16, kind="pca", learn_steps=6, learn_lr=3e-3), loader)
    a, b = split["corrections"]["learned_map"], whole["corrections"]["learned_map"]
    assert a["initial"] == pytest.approx(b["initial"], rel=1e-6)  # the same loss, computed in passes
    # Adam's first steps are ≈ lr·sign(g), so rounding in near-zero gradient entries moves T by up to ~lr:
    # the learned maps agree to that scale, and so do their losses
    torch.testing.assert_close(split["T"], whole["T"], atol=3e-3, rtol=0)
    assert a["learned"] == pytest.approx(b["learned"], rel=2e-3) and a["learned"] < a["initial"]


def _tied_model(char_data_dir):
    from test_transform import random_model
    model = random_model(5, head="tied", norm_type="rmsnorm", vocab_size=65, block_size=16, n_embd=24, n_head=4)
    return model, BatchLoader(char_data_dir, 16, 4, "cpu")


def test_tie_head_keeps_the_head_tied_and_fits_the_gain_by_least_squares(char_data_dir):
    """retie_head's m×m solve (M ⊙ E′ᵀE′)·γ = diag(E′ᵀ·A·M) equals the least-squares fit of the stacked logits
    A·y_t ≈ E′·diag(γ)·y_t; the head shares the embedding; the parameters drop by V·m."""
    model, loader = _tied_model(char_data_dir)
    untied, _ = transform_model(model, spec(16, kind="pca", calib_batches=2), loader)
    tied, record = transform_model(model, spec(16, kind="pca", calib_batches=2, tie_head=True), loader)
    assert tied.config.head == "tied" and tied.lm_head.weight is tied.transformer.wte.weight
    assert {p.dtype for p in tied.parameters()} == {torch.float32}  # the fit runs in float64, the model does not
    count = sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in tied.parameters())
    assert count == 65 * 16 - 5 * 15  # the head's V·m, less the 5 norms' gains now per dimension
    ys = torch.cat([refit.module_io(untied, "transformer.ln_f", b)[1] for b in
                    refit.calibration_batches(loader, 2, 0)]).double()
    E, A = untied.transformer.wte.weight.double(), untied.lm_head.weight.double()
    design = torch.cat([E * y for y in ys])  # row block t: E·diag(y_t), so that design·γ stacks E·diag(γ)·y_t
    gamma = torch.linalg.lstsq(design, torch.cat([A @ y for y in ys]).unsqueeze(1)).solution.squeeze(1)
    g_f = untied.transformer.ln_f.weight.double()
    torch.testing.assert_close(tied.transformer.ln_f.weight.double(), g_f * gamma, rtol=1e-4, atol=1e-6)
    fit = record["corrections"]["tied_head"]
    assert fit["relative_logit_residual"] <= fit["relative_logit_residual_untied_gain"]


def test_tie_head_fitted_to_the_original_is_the_least_squares_fit_of_the_originals_logits(char_data_dir):
    """retie_target='original': γ is the least-squares fit of the original's logits A₀·y₀_t by E′·diag(γ)·y_t
    (naive: the stacked design), its residual is that fit's, measured the same way; with a refit the head is left
    as ported (the tie replaces it) and every block's readers are still refit."""
    model, loader = _tied_model(char_data_dir)
    options = dict(kind="pca", calib_batches=2)
    untied, _ = transform_model(model, spec(16, **options), loader)
    tied, record = transform_model(model, spec(16, tie_head=True, retie_target="original", **options), loader)
    original = canonical_model(model)[0]
    batches = refit.calibration_batches(loader, 2, 0)
    ys = torch.cat([refit.module_io(untied, "transformer.ln_f", b)[1] for b in batches]).double()
    y0 = torch.cat([refit.module_io(original, "transformer.ln_f", b)[1] for b in batches]).double()
    E, A0 = untied.transformer.wte.weight.double(), original.lm_head.weight.double()
    design = torch.cat([E * y for y in ys])
    target = torch.cat([A0 @ y for y in y0])
    gamma = torch.linalg.lstsq(design, target.unsqueeze(1)).solution.squeeze(1)
    g_f = untied.transformer.ln_f.weight.double()
    torch.testing.assert_close(tied.transformer.ln_f.weight.double(), g_f * gamma, rtol=1e-4, atol=1e-6)
    fit = record["corrections"]["tied_head"]
    naive = ((target - design @ gamma).square().sum() / target.square().sum()).item()
    assert fit["relative_logit_residual"] == pytest.approx(naive, rel=1e-4, abs=1e-7)
    ones = torch.ones(16, dtype=torch.float64)
    before = ((target - design @ ones).square().sum() / target.square().sum()).item()
    assert fit["relative_logit_residual_untied_gain"] == pytest.approx(before, rel=1e-4)
    assert record["retie_target"] == "original" and "fitted to the original's logits" in record["notes"][-1]
    _, refit_record = transform_model(model, spec(16, tie_head=True, retie_target="original", refit="readers",
                                                  **options), loader)
    errors = refit_record["corrections"]["relative_errors"]
    assert "lm_head" not in errors and len(errors) == model.config.n_layer * 2
    _, own = transform_model(model, spec(16, tie_head=True, refit="readers", **options), loader)
    assert "lm_head" in own["corrections"]["relative_errors"] and own["retie_target"] == "head"


def test_retie_target_needs_a_head_kept_tied(char_data_dir, trained_dir, tmp_path):
    model, loader = _tied_model(char_data_dir)
    with pytest.raises(TransformError, match="retie_target='original' chooses what a head kept tied is fitted to"):
        transform_model(model, spec(16, kind="pca", retie_target="original"), loader)
    with pytest.raises(TransformError, match="retie_target='logits' chooses"):
        transform_model(model, spec(16, kind="pca", tie_head=True, retie_target="logits"), loader)
    for bad in (["--retie_target=original"], ["--tie_head=True", "--retie_target=logits"]):
        with pytest.raises(ConfigError, match="retie_target=.* one of \\('head', 'original'\\) with --tie_head"):
            load_config(TransformConfig, [f"--in_dir={trained_dir}", f"--out_dir={tmp_path / 'x'}", "--width=16",
                                          *bad])
    assert not (tmp_path / "x").exists()


def test_tie_head_is_exact_when_the_map_keeps_every_coordinate(char_data_dir):
    """With T = I (truncate at m = d) the fitted gain is the original final gain: the tied model is the original."""
    from test_transform import outputs
    model, loader = _tied_model(char_data_dir)
    tied, _ = transform_model(model, spec(24, kind="truncate", calib_batches=2, tie_head=True), loader)
    idx = torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(outputs(tied, idx), outputs(model, idx), atol=1e-4, rtol=0)


def test_tie_keep_keeps_the_gain_outliers_as_rows_and_lowers_the_logit_residual(char_data_dir):
    """A final gain with two outlying coordinates (negative among positive ones, as SmolLM2's): gain_outliers names
    them, farthest first; --tie_keep keeps them as rows of T, and the fitted m-space gain then reproduces the
    untied head's logits better than with the plain PCA map."""
    model, loader = _tied_model(char_data_dir)
    with torch.no_grad():
        gain = model.transformer.ln_f.weight
        gain.copy_(1.5 + 0.05 * torch.randn(24, generator=torch.Generator().manual_seed(2)))
        gain[7], gain[19] = -2.0, -1.0
    assert refit.gain_outliers(model, 2) == (7, 19) and refit.gain_outliers(model, 0) == ()
    with pytest.raises(TransformError, match=r"tie_keep's coordinates\) keeps 17 coordinates as rows of T, more than"):
        transform_model(model, spec(16, kind="pca", tie_head=True, tie_keep=17), loader)
    plain = transform_model(model, spec(16, kind="pca", calib_batches=2, tie_head=True), loader)[1]
    kept = transform_model(model, spec(16, kind="pca", calib_batches=2, tie_head=True, tie_keep=2), loader)[1]
    assert kept["pca_keep"] == [7, 19] and kept["tie_keep"] == 2
    assert kept["T"][:, [7, 19]].abs().max(0).values.min() == 1.0
    before = plain["corrections"]["tied_head"]["relative_logit_residual"]
    assert kept["corrections"]["tied_head"]["relative_logit_residual"] < 0.5 * before


def test_a_learned_map_holds_the_kept_and_excluded_coordinates(char_data_dir):
    """--learn_steps learns only the block of T off the held coordinates: a kept coordinate's row stays e_iᵀ and an
    excluded one's column stays zero, so the tie stays as good as the PCA map's, while the rest of T moves and
    the calibration KL falls."""
    model, loader = _tied_model(char_data_dir)
    with torch.no_grad():
        gain = model.transformer.ln_f.weight
        gain.copy_(1.5 + 0.05 * torch.randn(24, generator=torch.Generator().manual_seed(2)))
        gain[7], gain[19] = -2.0, -1.0
    options = dict(kind="pca", calib_batches=2, tie_head=True, tie_keep=2, pca_exclude=(3,))
    start = transform_model(model, spec(16, **options), loader)[1]
    learned = transform_model(model, spec(16, learn_steps=8, learn_lr=3e-3, **options), loader)[1]
    T = learned["T"].double()
    torch.testing.assert_close(T @ T.T, torch.eye(16, dtype=torch.float64), atol=1e-6, rtol=0)
    for i in (7, 19):  # one unit entry in the column, and its row zero elsewhere
        row = int(T[:, i].abs().argmax())
        assert T[row, i].abs().item() == pytest.approx(1.0, abs=1e-7)
        assert T[:, i].abs().sum().item() == pytest.approx(1.0, abs=1e-7)
        assert T[row].abs().sum().item() == pytest.approx(1.0, abs=1e-7)
    assert T[:, 3].abs().max().item() < 1e-7
    assert (learned["T"] - start["T"]).abs().max().item() > 1e-3  # the free block moved
    kl = learned["corrections"]["learned_map"]
    assert kl["kept"] == "learned" and kl["learned"] < kl["initial"]
    residual = learned["corrections"]["tied_head"]["relative_logit_residual"]
    assert residual < 2 * start["corrections"]["tied_head"]["relative_logit_residual"] + 1e-3


def test_free_block_refuses_a_map_that_mixes_a_held_coordinate():
    T = refit.orthonormal_rows(torch.randn(4, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    rows, columns = refit.free_block(T, ())
    assert rows.tolist() == [0, 1, 2, 3] and columns.tolist() == list(range(6))
    with pytest.raises(ValueError, match="coordinate 2 cannot be held"):
        refit.free_block(T, (2,))
    block = torch.zeros(4, 6, dtype=torch.float64)
    block[0, 2], block[1:, [0, 1, 3, 4, 5]] = 1.0, T[1:, :5]
    assert [r.tolist() for r in refit.free_block(block, (2,))] == [[1, 2, 3], [0, 1, 3, 4, 5]]
    block[0, 4] = 0.5
    with pytest.raises(ValueError, match="coordinate 2 cannot be held"):
        refit.free_block(block, (2,))


def test_tie_head_refuses_what_it_cannot_do(char_data_dir):
    from test_transform import random_model
    model, loader = _tied_model(char_data_dir)
    with pytest.raises(TransformError, match="this model's head is 'linear'"):
        transform_model(random_model(5, vocab_size=65), spec(12, kind="pca", tie_head=True), loader)
    with pytest.raises(TransformError, match="tie_head needs porting='residual'"):
        transform_model(model, spec(16, kind="gaussian", porting="sandwich", tie_head=True), loader)
    with pytest.raises(TransformError, match="tie_head needs calibration data"):
        transform_model(model, spec(16, kind="orthogonal", tie_head=True))
    with pytest.raises(TransformError, match="tie_keep=2 chooses coordinates for a head kept tied: add --tie_head"):
        transform_model(model, spec(16, kind="pca", tie_keep=2), loader)
    from transform import TransformConfig
    for options, message in ((dict(tie_keep=2), "add --tie_head=True|with --tie_head=True"),
                             (dict(tie_keep=-1, tie_head=True), "give a count >= 0"),
                             (dict(tie_keep=2, tie_head=True, kind="orthogonal"), "tie_keep keeps the final gain's"),
                             (dict(learn_hold=False), "learn_hold=False chooses what a learned map may change: add "
                                                      "--learn_steps=N")):
        with pytest.raises(ConfigError, match=message):
            TransformConfig(in_dir="x", out_dir="y", width=8, **dict(dict(kind="pca"), **options)).validate()


def test_decay_factor_is_a_half_cosine_from_one():
    """½(1 + cos(π·t/steps)) against its values: 1 first, ½ halfway, near 0 last; 'none' stays 1."""
    assert [refit.decay_factor("cosine", t, 4) for t in range(4)] == pytest.approx(
        [1.0, (1 + math.sqrt(0.5)) / 2, 0.5, (1 - math.sqrt(0.5)) / 2])
    assert refit.decay_factor("cosine", 15, 16) < 0.01
    assert all(refit.decay_factor("none", t, 16) == 1.0 for t in range(16))
    with pytest.raises(ValueError, match="linear"):
        refit.decay_factor("linear", 0, 4)


def test_learn_decay_scales_both_rates_at_every_step(setup, monkeypatch):
    """--learn_decay=cosine: each Adam step runs at the set rates (T's and the gains') times decay_factor, and the
    map it learns still lowers the calibration KL and is recorded; 'none' leaves every step at the set rates."""
    model, loader = setup
    seen = []
    step = torch.optim.Adam.step

    def spy(self, *args, **kwargs):
        seen.append([group["lr"] for group in self.param_groups])
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", spy)
    options = dict(kind="pca", calib_batches=4, learn_steps=6, learn_lr=3e-3,
                   learn_gain_lr=3e-2)
    _, record = transform_model(model, spec(16, learn_decay="cosine", **options), loader)
    factors = [refit.decay_factor("cosine", t, 6) for t in range(6)]
    assert seen == [pytest.approx([3e-3 * f, 3e-2 * f]) for f in factors]
    learned = record["corrections"]["learned_map"]
    assert learned["kept"] == "learned" and learned["learned"] < learned["initial"]
    assert record["learn_decay"] == "cosine"
    seen.clear()
    _, constant = transform_model(model, spec(16, **options), loader)
    assert seen == [[3e-3, 3e-2]] * 6 and constant["learn_decay"] == "none"
    assert constant["corrections"]["learned_map"]["learned"] != learned["learned"]


def test_learn_decay_needs_a_learned_map_and_a_known_schedule(setup):
    model, loader = setup
    with pytest.raises(TransformError, match="learn_decay='cosine'.*--learn_steps"):
        transform_model(model, spec(16, kind="pca", learn_decay="cosine"), loader)
    with pytest.raises(ConfigError, match="learn_decay='step'.*one of"):
        TransformConfig(out_dir="x", width=16, learn_steps=4, learn_decay="step").validate()


@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0])
def test_label_weight_mixes_the_texts_next_tokens_into_the_objective(setup, alpha):
    """--learn_label_weight=α: the objective per calibration token is (1 − α)·KL(original ‖ new) + α·CE of the
    text's next token (none at a row's last position), against a naive sum over the same batches at the start T."""
    import torch.nn.functional as F
    model, loader = setup
    options = dict(kind="pca", calib_batches=2)
    start, _ = transform_model(model, spec(16, **options), loader)
    _, record = transform_model(model, spec(16, learn_steps=1, learn_lr=1e-9, learn_label_weight=alpha,
                                            **options), loader)
    total = 0.0
    for batch in refit.calibration_batches(loader, 2, 0):
        p = F.log_softmax(logits(model, batch).double(), dim=-1)
        q = F.log_softmax(logits(start, batch).double(), dim=-1)
        kl = (p.exp() * (p - q)).sum(-1).sum()
        ce = -q[:, :-1].gather(-1, batch[:, 1:, None]).sum()
        total += ((1 - alpha) * kl + alpha * ce).item() / batch.numel()
    learned = record["corrections"]["learned_map"]
    assert learned["initial"] == pytest.approx(total / 2, rel=1e-4)
    assert record["learn_label_weight"] == alpha and ("objective" in learned) == (alpha > 0)


def test_label_weight_needs_a_learned_map_and_lies_in_0_1(setup):
    model, loader = setup
    with pytest.raises(TransformError, match="learn_label_weight=0.5 .*--learn_steps=N"):
        transform_model(model, spec(16, kind="pca", learn_label_weight=0.5), loader)
    with pytest.raises(ConfigError, match=r"learn_label_weight=1.5 .*\[0, 1\]"):
        TransformConfig(out_dir="x", width=16, learn_steps=4, learn_label_weight=1.5).validate()


def test_a_map_learns_at_the_same_width_only_with_the_texts_labels(setup):
    """At m = d the KL alone is 0 at an exact port (nothing to learn: refused), but the text's labels move an
    orthogonal T and the gains: --learn_label_weight > 0 learns there (a shrink's same-width control) and lowers its
    objective; m > d is refused either way."""
    model, loader = setup
    d = model.config.n_embd
    options = dict(kind="pca", calib_batches=2, learn_steps=3, learn_gain_lr=1e-2)
    with pytest.raises(TransformError, match=rf"m < d, or m = d with --learn_label_weight > 0\), got width={d}"):
        transform_model(model, spec(d, **options), loader)
    with pytest.raises(TransformError, match=rf"got width={d + 8}"):
        transform_model(model, spec(d + 8, learn_label_weight=0.5, **options), loader)
    new, record = transform_model(model, spec(d, learn_label_weight=0.5, **options), loader)
    learned = record["corrections"]["learned_map"]
    assert learned["kept"] == "learned" and learned["learned"] < learned["initial"]
    T = record["T"].double()
    torch.testing.assert_close(T @ T.T, torch.eye(d, dtype=T.dtype), atol=1e-6, rtol=0)  # still orthogonal
    assert new.config.n_embd == d


def test_the_corrections_read_their_own_batches_of_each_draw(char_data_dir):
    """refit's batches of draw s are calibration_seed(s, 10,000 + k): apart from the map's (k < 10,000) and from
    every other draw's; draw 0 reads seeds 10,000 + k, as before the scheme changed."""
    from lgpt.plumbing.dataset import BatchLoader, calibration_seed
    loader = BatchLoader(char_data_dir, 16, 2, "cpu")
    for seed in (0, 3):
        expected = [loader.get_batch("train", calibration_seed(seed, 10_000 + k))[0] for k in range(2)]
        for got, want in zip(refit.calibration_batches(loader, 2, seed), expected):
            assert torch.equal(got, want)
    assert calibration_seed(0, 10_000) == 10_000
    assert calibration_seed(1, 10_000) not in {calibration_seed(s, k) for s in (0, 2) for k in range(20_000)}
