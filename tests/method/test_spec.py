"""The transform's one typed spec (lgpt/method/spec.py): each option written once, in one group; the command's
flat config built from those groups; every check in one place, with the messages the other tests rely on."""
from __future__ import annotations

import dataclasses
import inspect

import pytest

from conftest import spec
from lgpt.method.pipeline import transform_model
from lgpt.method.spec import (
    GROUPS,
    MapSpec,
    TransformSpec,
    check_settings,
    check_spec,
    spec_fields,
    spec_from_config,
)
from lgpt.plumbing.configurator import field_docs, help_text, load_config
from lgpt.plumbing.errors import ConfigError, TransformError
from model import GPTConfig
from transform import TransformConfig

COMMAND_OPTIONS = {"in_dir", "out_dir", "map_file", "carry_optimizer", "data_dir", "calib_batch_size", "calib_bos",
                   "block_size", "eval_iters", "eval_reference", "device", "overwrite", "allow_broken"}  # its own


def test_transform_model_takes_at_most_four_parameters():
    assert len(inspect.signature(transform_model).parameters) <= 4


def test_every_option_lives_in_exactly_one_group():
    names = [f.name for group in GROUPS.values() for f in dataclasses.fields(group)]
    assert len(names) == len(set(names)), "an option spelled in two groups"
    assert set(spec_fields()) == set(names)


def test_the_config_is_the_groups_plus_the_commands_own_options():
    config_fields = {f.name: f for f in dataclasses.fields(TransformConfig)}
    assert set(config_fields) - COMMAND_OPTIONS == set(spec_fields())
    for group in GROUPS.values():  # inherited, not spelled again: the same default, and the comment of the group
        assert issubclass(TransformConfig, group)
        for f in dataclasses.fields(group):
            assert config_fields[f.name].default == f.default
            assert f.name not in TransformConfig.__dict__.get("__annotations__", {})


def test_help_lists_every_field_with_its_comment():
    docs, text = field_docs(TransformConfig), help_text(TransformConfig, prog="transform.py")
    for f in dataclasses.fields(TransformConfig):
        assert docs[f.name].comment, f.name
        assert f"--{f.name}=" in text
    assert "or several" in text and "'gstack' (G_stack: the stack repeated" in text  # continuation lines kept
    assert "(refit.free_block); False learns all of T" in text  # a group's last field keeps its continuation


def test_spec_from_config_sends_each_key_to_its_group():
    cfg = load_config(TransformConfig, ["--out_dir=x", "--width=12", "--kind=pca", "--refit=readers", "--n_head=4",
                                        "--tie_head=True", "--calib_batches=3", "--norms=scalar"])
    s = spec_from_config(cfg)
    assert (s.map.width, s.map.kind, s.learn.refit, s.grow.n_head, s.tie.tie_head, s.calib.calib_batches,
            s.port.norms) == (12, "pca", "readers", 4, True, 3, "scalar")
    assert s.given_map is None and TransformSpec.from_flat(**s.flat()) == s
    assert spec(12, kind="pca").map == MapSpec(width=12, kind="pca")
    with pytest.raises(TypeError, match="unknown transform options \\['widht'\\]"):
        TransformSpec.from_flat(widht=12)


@pytest.mark.parametrize("options, message", [
    (dict(kind="pca", width=40), "m ≤ d"),
    (dict(porting="heads"), "porting='heads' is not one of"),
    (dict(refit="x"), "refit='x' is not one of"),
    (dict(porting="sandwich", refit="all"), "need porting='residual'"),
    (dict(restore_attn_scale=True), "restore_attn_scale applies to porting='sandwich' or 'paper_code'"),
    (dict(keep_layernorm=True, kind="pca", width=16), "keep_layernorm needs"),
    (dict(porting="paper_code", kind="pca"), "paper's code, whose maps are"),
    (dict(porting="per_block", n_head=4), "porting='per_block' .* takes no n_head"),
    (dict(width=40, grow_reader_std=0.02, porting="sandwich"), r"grow_reader_std need .*porting='residual'"),
    (dict(rescale_gains=False, porting="paper_code", kind="gaussian"), "rescale_gains=False applies to porting="),
    (dict(tie_keep=2), "tie_keep=2 chooses coordinates for a head kept tied: add --tie_head"),
    (dict(tie_head=True), "this model's head is 'linear'"),
    (dict(retie_target="original"), "retie_target='original' chooses what a head kept tied is fitted to"),
    (dict(learn_gain_lr=0.01), "learn_gain_lr=0.01 needs learn_steps > 0"),
    (dict(map_groups=2), "map_groups=2 shares per-block maps"),
    (dict(sequential_calibration=True), "sequential_calibration orders the per-site PCAs"),
    (dict(porting="per_block", given_map=object()), "a map file gives one: drop --map_file"),
    (dict(n_head=3), "n_head=3 keeps the model's 1 query heads|n_head=3 is below"),
])
def test_check_spec_rejects_bad_requests_against_the_model(options, message):
    """The checks need only the model's GPTConfig: they run before any weight is touched."""
    cfg = GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=65)
    with pytest.raises(TransformError, match=message):
        check_spec(spec(**dict(dict(width=16), **options)), cfg)


@pytest.mark.parametrize("options, message", [
    (dict(kind="pcaa"), "kind='pcaa' is not one of"),
    (dict(jl_eps=2.0), "jl_eps must lie in"),
    (dict(learn_hold=False), "learn_hold=False chooses what a learned map may change"),
    (dict(n_layer=-1), "n_layer must be >= 0"),
    (dict(calib_batches=0), "calib_batches must be a positive integer"),
    (dict(pca_keep=(1,)), "pca_keep keeps coordinates in a PCA map's range"),
    (dict(tie_keep=-1, tie_head=True, kind="pca"), "give a count >= 0"),
    (dict(learn_decay="cosine"), "learn_decay='cosine'.*--learn_steps"),
    (dict(pca_damping=-1e-3, kind="pca"), "pca_damping must be >= 0"),  # once inverted --pca_exclude silently
])
def test_check_settings_rejects_bad_options_alone(options, message):
    with pytest.raises(ConfigError, match=message):
        check_settings(spec(**dict(dict(width=16), **options)), ConfigError)
    flags = [f"--{k}={','.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in options.items()]
    with pytest.raises(ConfigError, match=message):  # the command runs the same check on its flat config
        load_config(TransformConfig, ["--out_dir=x", "--width=16", *flags])


def test_a_good_spec_passes_and_names_its_porting():
    cfg = GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=65)
    assert check_spec(spec(48, porting="head", n_head=8, mlp_hidden=256), cfg) == "residual"
    check_settings(spec(48), ConfigError)


def test_a_symmetry_breaking_sigma_beyond_float_exactness_is_refused():
    from transform import TransformConfig
    for name in ("grow_noise", "clone_noise"):
        with pytest.raises(ConfigError, match=f"{name}=100000.0 is beyond 100"):
            check_settings(spec_from_config(TransformConfig(width=64, **{name: 1e5})), ConfigError)
