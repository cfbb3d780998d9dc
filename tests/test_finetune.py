import json
import os

from checkpoint import load_checkpoint
from configurator import load_config
from conftest import TINY_MODEL
from finetune import FinetuneConfig, RecoveryTracker, finetune
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
