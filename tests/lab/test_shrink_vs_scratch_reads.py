"""scripts/shrink_vs_scratch.py: the earlier test reads it records are this experiment's, on its dataset."""
import json
import os
import sys

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import shrink_vs_scratch  # noqa: E402


def test_earlier_reads_are_this_experiments_on_its_dataset(tmp_path, monkeypatch):
    monkeypatch.setattr(shrink_vs_scratch, "RUNS", str(tmp_path))
    data = str(tmp_path / "data-three")

    def memo(run: str, **kept) -> None:
        os.makedirs(tmp_path / run)
        (tmp_path / run / "test_loss.json").write_text(json.dumps(kept))

    memo("train-svs_base_lr2-s1-abc", loss=1.7, recipe="shrink_vs_scratch_rates-original",
         data_dir=shrink_vs_scratch.relative(data))
    memo("train-svs3_m48_lr4-s0-def", loss=1.6, recipe="shrink_vs_scratch_rates-scratch")  # before memos named data
    memo("transform-pca-0123", loss=1.8, recipe="shrink_vs_scratch_rates-shrink",
         data_dir=shrink_vs_scratch.relative(data))
    memo("train-svs_base_lr2-s2-ghi", loss=9.0, recipe="shrink_vs_scratch_rates-original", data_dir="runs/other")
    memo("train-other_lr2-s0-jkl", loss=9.0, recipe="protocol-free25")
    reads = shrink_vs_scratch.earlier_test_reads(data)
    assert sorted((x["side"], x.get("lr_factor"), x.get("seed"), x["test"]) for x in reads) == [
        ("original", 2.0, 1, 1.7), ("scratch", 4.0, 0, 1.6), ("shrink", None, None, 1.8)]
