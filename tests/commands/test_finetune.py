import json
import os

from conftest import TINY_MODEL
from finetune import FinetuneConfig, RecoveryTracker, finetune
from lgpt.plumbing.checkpoint import load_checkpoint
from lgpt.plumbing.configurator import load_config
from transform import TransformConfig, transform_checkpoint


def test_finetune_recovers_a_shrunk_model_and_records_it(trained_dir, char_data_dir, tmp_path):
    transform_checkpoint(TransformConfig(in_dir=trained_dir, out_dir=str(tmp_path / "t"), width=24, kind="pca",
                        data_dir=char_data_dir, eval_iters=0))
    overrides = [a for a in TINY_MODEL if a.split("=")[0] in ("--batch_size", "--eval_iters", "--progress_bar")]
    cfg = load_config(FinetuneConfig, overrides + [f"--in_dir={tmp_path / 't'}", f"--out_dir={tmp_path / 'ft'}",
                                                   "--max_iters=30", "--eval_interval=10", "--learning_rate=1e-3",
                                                   "--recover_tol=0.05"])
    summary = finetune(cfg)
    assert summary["reference_val_loss"] is not None
    curve = summary["curve"]
    assert [it for it, _ in curve] == [0, 10, 20, 30]
    assert curve[-1][1] < curve[0][1]  # finetuning lowers the loss
    ckpt = load_checkpoint(str(tmp_path / "ft"))
    assert ckpt["transform"]["m"] == 24 and ckpt["model_args"]["n_embd"] == 24
    assert ckpt["finetune"]["curve"] == curve
    saved = json.load(open(tmp_path / "ft" / "finetune.json"))
    assert saved["steps_to_recover"] == summary["steps_to_recover"]
    lines = [json.loads(x) for x in open(os.path.join(tmp_path, "ft", "metrics.jsonl"))]
    assert any("recovery/val_over_reference" in r for r in lines)


def test_recovery_tracker_finds_the_first_step_within_tolerance():
    record = {"reference_val_loss": 2.0, "recover_tol": 0.01}
    track = RecoveryTracker(record)
    for it, val in [(0, 2.5), (10, 2.03), (20, 2.019), (30, 1.9), (40, 2.1)]:
        track(it, {"val": val})
    assert record["steps_to_recover"] == 20
    assert [v for _, v in record["curve"]] == [2.5, 2.03, 2.019, 1.9, 2.1]


def test_finetune_resumes_exactly_through_the_training_loop(trained_dir, char_data_dir, tmp_path):
    """finetune runs train.py's loop: stopping at iter 10 and resuming gives the uninterrupted run's losses
    and recovery curve, and a partial run's checkpoint is marked incomplete."""
    transform_checkpoint(TransformConfig(in_dir=trained_dir, out_dir=str(tmp_path / "t"), width=40,
                                         data_dir=char_data_dir, eval_iters=0))
    overrides = [a for a in TINY_MODEL if a.split("=")[0] in ("--batch_size", "--eval_iters", "--progress_bar")]
    common = overrides + [f"--in_dir={tmp_path / 't'}", "--eval_interval=5", "--lr_decay_iters=20", "--dropout=0.1",
                          "--log_interval=1",
                          "--reference_val_loss=2.0"]
    finetune(load_config(FinetuneConfig, common + [f"--out_dir={tmp_path / 'a'}", "--max_iters=20"]))
    finetune(load_config(FinetuneConfig, common + [f"--out_dir={tmp_path / 'b'}", "--max_iters=10"]))
    finetune(load_config(FinetuneConfig, common + [f"--out_dir={tmp_path / 'b'}", "--max_iters=20",
                                                   "--init_from=resume"]))

    def losses(d):
        return {r["iter"]: r["train/lm_loss"] for r in map(json.loads, open(tmp_path / d / "metrics.jsonl"))
                if "train/lm_loss" in r}

    assert losses("a") == losses("b") and sorted(losses("a")) == list(range(20))
    a, b = load_checkpoint(str(tmp_path / "a")), load_checkpoint(str(tmp_path / "b"))
    assert a["finetune"]["curve"] == b["finetune"]["curve"] and a["complete"] and b["complete"]


def test_recovery_is_measured_against_a_control_with_the_identical_recipe(trained_dir, char_data_dir, tmp_path):
    """The untransformed (canonical) model finetuned with the same recipe is the control: the transformed run's
    record holds val / control − 1 at every eval, and its steps to recover are counted against the control."""
    import pytest

    from finetune import against_control
    from lgpt.plumbing.errors import ConfigError
    d = load_checkpoint(trained_dir)["model_args"]["n_embd"]
    for name, width, kind in (("canonical", d, "truncate"), ("shrunk", 24, "pca")):
        transform_checkpoint(TransformConfig(in_dir=trained_dir, out_dir=str(tmp_path / name), width=width,
                                             kind=kind, data_dir=char_data_dir, eval_iters=0))
    overrides = [a for a in TINY_MODEL if a.split("=")[0] in ("--batch_size", "--eval_iters", "--progress_bar")]
    recipe = overrides + ["--max_iters=20", "--eval_interval=10", "--seed=7", "--eval_seed=3"]
    control = finetune(load_config(FinetuneConfig, recipe + [f"--in_dir={tmp_path / 'canonical'}",
                                                             f"--out_dir={tmp_path / 'control'}"]))
    run = finetune(load_config(FinetuneConfig, recipe + [f"--in_dir={tmp_path / 'shrunk'}",
                                                         f"--out_dir={tmp_path / 'ft'}",
                                                         f"--control_dir={tmp_path / 'control'}"]))
    control_val = dict(control["curve"])
    assert [s for s, _ in run["gap_to_control"]] == [0, 10, 20]
    for (step, val), (_, gap) in zip(run["curve"], run["gap_to_control"]):
        assert gap == pytest.approx(val / control_val[step] - 1)
    assert run["gap_to_control"][0][1] > 0  # the shrunk model starts worse than the control
    with pytest.raises(ConfigError, match="ran another recipe .*seed: 7 there vs 8 here"):
        finetune(load_config(FinetuneConfig, overrides + [
            "--max_iters=20", "--eval_interval=10", "--seed=8", "--eval_seed=3", f"--in_dir={tmp_path / 'shrunk'}",
            f"--out_dir={tmp_path / 'other'}", f"--control_dir={tmp_path / 'control'}"]))
    assert not os.path.exists(tmp_path / "other")  # checked before any work
    with pytest.raises(ConfigError, match="ran another recipe .*distill: False there vs True here"):
        finetune(load_config(FinetuneConfig, recipe + [  # distillation against a control finetuned on the LM loss
            "--distill=True", f"--in_dir={tmp_path / 'shrunk'}", f"--out_dir={tmp_path / 'kd'}",
            f"--control_dir={tmp_path / 'control'}"]))
    assert not os.path.exists(tmp_path / "kd")
    kd = finetune(load_config(FinetuneConfig, recipe + [  # read against the LM control on purpose: accepted
        "--distill=True", "--control_any_loss=True", f"--in_dir={tmp_path / 'shrunk'}",
        f"--out_dir={tmp_path / 'kd'}", f"--control_dir={tmp_path / 'control'}"]))
    assert [s for s, _ in kd["gap_to_control"]] == [0, 10, 20]
    with pytest.raises(ConfigError, match="holds no finetune.json"):
        finetune(load_config(FinetuneConfig, recipe + [f"--in_dir={tmp_path / 'shrunk'}",
                                                       f"--out_dir={tmp_path / 'x'}", f"--control_dir={tmp_path}"]))
    gaps = against_control([[0, 3.0], [10, 2.2], [20, 2.0]], [[0, 2.0], [10, 2.0], [20, 2.0]], 0.01)
    assert gaps["steps_to_recover_vs_control"] == 20 and gaps["gap_to_control"][0] == [0, 0.5]


def test_every_printed_loss_names_its_basis_and_the_reference_is_not_called_a_control(char_data_dir):
    from finetune import report_lines
    from lgpt.plumbing.dataset import BatchLoader, loss_basis
    loader = BatchLoader(char_data_dir, 16, 4)
    assert loss_basis(loader, None) == "full val split"
    assert loss_basis(loader, 20, 0) == "20 fixed val batches of 4 × 16 tokens, eval seed 0"
    assert loss_basis(loader, 1, 3) == "1 fixed val batch of 4 × 16 tokens, eval seed 3"
    summary = {"val_loss": 1.9, "reference_val_loss": 1.88, "recover_tol": 0.01, "steps_to_recover": 0,
               "eval_basis": "20 fixed batches of 4 × 16 tokens per split, eval seed 0"}
    lines = report_lines(summary)
    assert lines[0] == "val loss 1.9000, reference 1.8800 (20 fixed batches of 4 × 16 tokens per split, eval seed 0)"
    assert "not a control" in lines[1] and "--control_dir" in lines[1] and len(lines) == 2
    lines = report_lines(dict(summary, gap_to_control=[[0, 0.2], [10, 0.005]], steps_to_recover_vs_control=10))
    assert lines[2] == "gap to the control at the end: +0.50%; steps to come within 1% of the control: 10"


def test_finetune_records_hold_the_architecture_that_ran(trained_dir, tmp_path):
    """finetune.json's config and the checkpoint's config hold the model's n_layer, n_embd and block_size, not
    TrainConfig's unused defaults (12, 768, 1024)."""
    import json

    from finetune import FinetuneConfig, finetune
    from lgpt.plumbing.checkpoint import load_checkpoint
    from lgpt.plumbing.configurator import load_config
    out = tmp_path / "ft"
    finetune(load_config(FinetuneConfig, [f"--in_dir={trained_dir}", f"--out_dir={out}", "--max_iters=2",
                                          "--eval_interval=1", "--eval_iters=1", "--progress_bar=False",
                                          "--compile=False", "--reference_val_loss=2.0", "--batch_size=2"]))
    model_args = load_checkpoint(str(out))["model_args"]
    for config in (json.load(open(out / "finetune.json"))["config"], load_checkpoint(str(out))["config"]):
        assert {k: config[k] for k in ("n_layer", "n_embd", "block_size", "bias")} == \
            {k: model_args[k] for k in ("n_layer", "n_embd", "block_size", "bias")}


def test_finetune_never_writes_over_a_model_it_reads_whatever_the_flags(trained_dir, char_data_dir, tmp_path):
    import shutil

    import pytest

    from lgpt.plumbing.checkpoint import CheckpointError
    teacher = tmp_path / "teacher"
    shutil.copytree(trained_dir, teacher)
    transform_checkpoint(TransformConfig(in_dir=str(teacher), out_dir=str(tmp_path / "t"), width=24, kind="pca",
                                         data_dir=char_data_dir, eval_iters=0))
    before = (teacher / "ckpt.pt").read_bytes()
    base = [f"--in_dir={tmp_path / 't'}", f"--out_dir={teacher}", "--overwrite=True", "--max_iters=2"]
    for extra, named in ((["--distill=True", f"--teacher_dir={teacher}"], "--teacher_dir"),
                         ([], "the transform's source")):  # the source: the reference and the default teacher
        with pytest.raises(CheckpointError, match=f"is where {named}='{teacher}' lives"):
            finetune(load_config(FinetuneConfig, base + extra))
    assert (teacher / "ckpt.pt").read_bytes() == before
