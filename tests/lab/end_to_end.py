"""Each experiment run end to end at a tiny size (tests/lab/test_end_to_end_*.py): the helper both halves call. The
experiments are split over two files so that pytest-xdist (--dist loadfile) runs the halves on two workers."""
import json
import os
import sys

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import harness  # noqa: E402

EXPERIMENT_FILES = ("base_models", "growth", "ppl_vs_width", "sandwich_ablation", "shrink_quality", "recovery",
                    "arch_ablation", "geometry_vs_width", "heatmaps", "heads", "grow_staging", "grow_depth",
                    "grow_recipes", "quantization", "scale", "shrink_vs_scratch")


def run_end_to_end_at_a_tiny_size(experiment, char_data_dir, tmp_path, monkeypatch):
    """Each experiment unit on a 1-layer model, 2 seeds and 4-step finetunes: the whole path (train, transform,
    controls, finetune, geometry, results.json, figure, README table) runs and is reported."""
    import experiments
    import figures
    import report

    def everywhere(name: str, value) -> None:  # each experiment's file imports its settings by name
        for module in [harness, experiments, report, figures, *(sys.modules[n] for n in EXPERIMENT_FILES)]:
            if hasattr(module, name):
                monkeypatch.setattr(module, name, value)

    everywhere("RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(harness, "RUNS", str(tmp_path / "runs"))
    everywhere("RATIOS", (0.5, 2.0))  # square random 16×16 maps can be singular
    corrections = sys.modules["shrink_quality"].CORRECTIONS
    monkeypatch.setitem(corrections, "learned T + all", {"refit": "all", "learn_steps": 2})
    everywhere("LONGER", {"longer": {"refit": "all", "learn_steps": 3, "calib_batches": 2}})
    s = harness.Setting(quick=True)
    s.base += ["--n_layer=1", "--n_embd=16", "--n_head=2", "--max_iters=4", "--eval_iters=2", "--eval_interval=2",
               "--batch_size=4", "--block_size=16", f"--data_dir={char_data_dir}"]
    s.seeds, s.finetune_iters, s.finetune_eval_interval, s.finetune_eval_iters = (0, 1), 4, 2, 2
    s.grow_iters, s.curve_eval = 4, ["--eval_interval=2", "--eval_iters=2", "--eval_seed=0"]
    everywhere("GROW_ARMS", sys.modules["growth"].GROW_ARMS[-3:])  # clone: fresh/carried, re-warm
    everywhere("scale_widths", lambda s: {"char": (16, 32, 64)})  # d = 16 is the base model
    everywhere("SCALE_HEAD_SIZE", {"char": 8})
    everywhere("GEOMETRY_PROBES", 256)  # the metrics' path, not their precision
    if experiment in ("grow_depth", "grow_recipes"):
        s.base += ["--n_layer=2"]  # stage 1 has half the blocks
    experiments.EXPERIMENTS[experiment](s)
    result = json.load(open(tmp_path / "results" / experiment / "results.json"))
    table = getattr(report, experiment)(result)
    assert table.count("\n") > 4 and "Not run yet" not in table
    if experiment in ("ppl_vs_width", "arch_ablation"):
        rows = result["recovery"] if experiment == "ppl_vs_width" else result["rows"]
        assert all(len(row["steps_to_recover_vs_control"]) == 2 for row in rows)
        assert all([s for s, _ in row["seeds"][0]["gap_to_control"]] == [0, 2, 4] for row in rows)
