"""Every experiment runs end to end at a tiny size (first half; the other: test_end_to_end_b.py)."""
import pytest
from end_to_end import run_end_to_end_at_a_tiny_size


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["scale", "heatmaps", "heads", "ppl_vs_width", "recovery", "grow_depth",
                                        "grow_staging"])
def test_every_experiment_runs_end_to_end_at_a_tiny_size(experiment, char_data_dir, tmp_path, monkeypatch):
    run_end_to_end_at_a_tiny_size(experiment, char_data_dir, tmp_path, monkeypatch)
