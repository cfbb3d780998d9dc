import json
import os

from checkpoint import load_checkpoint
from configurator import load_config
from conftest import TINY_MODEL
from finetune import FinetuneConfig, RecoveryTracker, finetune
from transform import TransformConfig, run


def test_finetune_recovers_a_shrunk_model_and_records_it(trained_dir, char_data_dir, tmp_path):
    run(TransformConfig(in_dir=trained_dir, out_dir=str(tmp_path / "t"), width=24, kind="pca",
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


def test_finetune_reuses_the_training_loop():
    import inspect

    import finetune as ft
    source = inspect.getsource(ft)
    assert "train(" in source and "backward" not in source and "optimizer.step" not in source
