import glob
import json
import os

import pytest

from conftest import ROOT
from lgpt.plumbing.configurator import load_config
from lgpt.plumbing.errors import ConfigError
from train import TrainConfig


def test_file_then_overrides(tmp_path):
    path = tmp_path / "c.py"
    path.write_text("import math\nn_layer = 3\nlearning_rate = 2e-3\n_private = 1\n")
    cfg = load_config(TrainConfig, [str(path), "--n_layer=5", "--dropout=0", "--bias=false"])
    assert cfg.n_layer == 5 and cfg.learning_rate == 2e-3
    assert cfg.dropout == 0.0 and isinstance(cfg.dropout, float)  # an int is accepted for a float
    assert cfg.bias is False


def test_unknown_key_suggests_the_close_one():
    with pytest.raises(ConfigError, match=r"unknown config key 'lerning_rate'.*Did you mean 'learning_rate'"):
        load_config(TrainConfig, ["--lerning_rate=1e-3"])


def test_unknown_key_in_file_names_the_file(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("n_layers = 4\n")
    with pytest.raises(ConfigError, match=r"bad.py'.*unknown config key 'n_layers'.*'n_layer'"):
        load_config(TrainConfig, [str(path)])


@pytest.mark.parametrize("arg,needle", [
    ("--n_layer=2.5", "n_layer=2.5 has the wrong type; n_layer accepts int"),
    ("--learning_rate=fast", "learning_rate='fast' has the wrong type; learning_rate accepts float"),
    ("--bias=3", "bias accepts bool"),
    ("--norm_type=batchnorm", "norm_type='batchnorm' is not one of"),
    ("--batch_size=0", "batch_size must be a positive integer"),
    ("--dtype=fp8", "dtype='fp8' is not one of"),
    ("n_layer=3", "config file 'n_layer=3' does not exist"),
    ("--n_layer", "must have the form --key=value"),
])
def test_bad_values_get_one_clear_error(arg, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        load_config(TrainConfig, [arg])


def test_optional_fields_accept_none():
    cfg = load_config(TrainConfig, ["--head_dim=None", "--vocab_size=65"])
    assert cfg.head_dim is None and cfg.vocab_size == 65


@pytest.mark.parametrize("arg, expected", [("--pca_exclude=507", (507,)), ("--pca_exclude=507,199", (507, 199)),
                                           ("--pca_exclude=(3, 3)", (3, 3)), ("--pca_exclude=[4]", (4,))])
def test_a_tuple_of_ints_takes_one_int_or_several(arg, expected):
    """tuple[int, ...] settings (transform.py --pca_exclude) take one int as a one-element tuple, several as they
    are (the transform sorts and de-duplicates coordinates: test_transform)."""
    from transform import TransformConfig
    cfg = load_config(TransformConfig, ["--out_dir=x", "--width=4", "--kind=pca", arg])
    assert cfg.pca_exclude == expected


@pytest.mark.parametrize("arg", ["--pca_exclude=a,b", "--pca_exclude=1.5", "--pca_exclude=True", "--pca_exclude=x"])
def test_a_tuple_of_ints_refuses_anything_else_by_name(arg):
    from transform import TransformConfig
    with pytest.raises(ConfigError, match="pca_exclude=.* has the wrong type; pca_exclude accepts tuple"):
        load_config(TransformConfig, ["--out_dir=x", "--width=4", "--kind=pca", arg])


RECIPES = {"smollm2_shrink_25.py": ("--learn_steps=16", "--learn_gain_lr=1e-2"),
           "smollm2_shrink_50.py": ("--learn_steps=32", "--learn_gain_lr=1e-2"),
           "smollm2_shrink_25_training_free.py": ()}


def test_every_config_file_loads_into_its_command():
    """configs/*.py: a transform recipe (it sets `width`) loads into TransformConfig, a distillation recipe (it sets
    `distill`) into FinetuneConfig, every other file into TrainConfig — each key known, each value of its type."""
    from finetune import FinetuneConfig
    from transform import TransformConfig
    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "**", "*.py"), recursive=True)):
        text = open(path).read()
        command = TransformConfig if "width =" in text else FinetuneConfig if "distill =" in text else TrainConfig
        cfg = load_config(command, [path, "--out_dir=x", *(["--in_dir=y"] if command is FinetuneConfig else [])])
        assert cfg is not None, path


def test_the_distillation_recipe_is_the_protocols():
    """configs/smollm2_distill_25.py holds every setting scripts/protocol.py passes for distill25 (a recipe edited
    away from what was measured fails)."""
    import sys
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from protocol import DISTILL_BATCH, DISTILL_LR
    from real_distill import DISTILL, recipe

    from finetune import FinetuneConfig
    cfg = load_config(FinetuneConfig, [os.path.join(ROOT, "configs", "smollm2_distill_25.py"), "--out_dir=x",
                                       "--in_dir=y"])
    args = [a for a in recipe(DISTILL_LR, 0, DISTILL_BATCH) if not a.startswith("--threads=")]  # the CLI's, not a key
    measured = load_config(FinetuneConfig, ["--out_dir=x", "--in_dir=y", *args, *DISTILL, f"--data_dir={cfg.data_dir}"])
    import dataclasses
    assert cfg == dataclasses.replace(measured, progress_bar=cfg.progress_bar)  # display, not the recipe


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_the_real_model_recipes_are_the_rows_the_results_report(name):
    """Each shrink recipe in configs/ is the options of a row of results/real_model_tied: the same width, kind,
    tie and learning settings, calibrated on Shakespeare (a recipe edited away from what was measured fails)."""
    from transform import TransformConfig
    cfg = load_config(TransformConfig, [os.path.join(ROOT, "configs", name), "--out_dir=x"])
    rows = json.load(open(os.path.join(ROOT, "results", "real_model_tied", "results.json")))["rows"]
    wanted = ["--tie_head=True", "--tie_keep=32", *RECIPES[name]]
    (row,) = [r for r in rows if r["m"] == cfg.width and r["options"] == wanted and r["calibration"] == "shakespeare"
              and r.get("seed", 0) == 0]
    assert (cfg.kind, cfg.tie_head, cfg.tie_keep) == (row["kind"], True, 32)
    assert cfg.learn_steps == int(dict(o[2:].split("=") for o in wanted).get("learn_steps", 0))
    assert cfg.learn_gain_lr == float(dict(o[2:].split("=") for o in wanted).get("learn_gain_lr", 0))
    assert (cfg.block_size, cfg.calib_batches, cfg.calib_batch_size) == (256, 8, 16)
