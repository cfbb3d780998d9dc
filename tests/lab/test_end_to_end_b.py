"""Every experiment runs end to end at a tiny size (second half; the other: test_end_to_end_a.py)."""
import pytest
from end_to_end import run_end_to_end_at_a_tiny_size


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["shrink_quality", "grow_recipes", "arch_ablation", "geometry_vs_width",
                                        "shrink_vs_scratch", "sandwich_ablation", "quantization"])
def test_every_experiment_runs_end_to_end_at_a_tiny_size(experiment, char_data_dir, tmp_path, monkeypatch):
    run_end_to_end_at_a_tiny_size(experiment, char_data_dir, tmp_path, monkeypatch)
