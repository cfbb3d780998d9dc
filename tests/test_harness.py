"""The experiment harness's cache: one entry per full run configuration, one completion marker."""
import json
import os
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import harness  # noqa: E402


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "RUNS", str(tmp_path))
    return tmp_path


def test_a_run_is_built_once_per_configuration(runs):
    calls = []

    def build(out):
        calls.append(out)
        os.makedirs(out, exist_ok=True)
        return {"loss": 1.5}

    out, result = harness.cached("train", "x", {"lr": 1e-3}, build)
    again, same = harness.cached("train", "x", {"lr": 1e-3}, build)
    assert (out, result) == (again, same) == (calls[0], {"loss": 1.5}) and len(calls) == 1
    other, _ = harness.cached("train", "x", {"lr": 2e-3}, build)  # any change of the configuration: a new entry
    assert other != out and len(calls) == 2
    marker = json.load(open(os.path.join(out, harness.MARKER)))
    assert marker["spec"] == {"lr": 1e-3} and marker["result"] == {"loss": 1.5}


def test_an_interrupted_build_leaves_no_marker_and_is_built_again(runs):
    def interrupted(out):
        os.makedirs(out, exist_ok=True)
        open(os.path.join(out, "ckpt.pt"), "w").close()  # partial work
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        harness.cached("finetune", "y", {"seed": 1}, interrupted)
    entry = next(p for p in os.listdir(runs) if not p.endswith(".lock"))
    assert not os.path.exists(os.path.join(runs, entry, harness.MARKER))
    out, result = harness.cached("finetune", "y", {"seed": 1}, lambda out: {"done": True})
    assert result == {"done": True} and os.path.basename(out) == entry


def test_keys_ignore_where_a_run_writes_and_use_repository_relative_paths():
    from finetune import FinetuneConfig
    a = harness.spec_of(FinetuneConfig(in_dir=os.path.join(ROOT, "runs", "m"), out_dir="/tmp/a", progress_bar=True))
    b = harness.spec_of(FinetuneConfig(in_dir=os.path.join(ROOT, "runs", "m"), out_dir="/tmp/b", progress_bar=False))
    assert a == b and a["in_dir"] == os.path.join("runs", "m")
    assert harness.key_of(a) != harness.key_of(dict(a, seed=0))


def test_widths_are_multiples_of_the_head_count():
    assert [harness.width(r, 128, 4) for r in (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)] == [32, 64, 96, 128, 192, 256]
    assert harness.width(0.3, 100, 6) % 6 == 0 and harness.width(0.01, 100, 6) == 6
