"""scripts/protocol.py: the per-window test losses, the count of configurations tried on dev, the results' shape."""
import json
import os
import shutil
import sys

import numpy as np
import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import protocol  # noqa: E402


def test_window_losses_average_to_the_whole_split_loss_and_a_test_read_is_recorded(trained_dir, char_data_dir,
                                                                                   tmp_path):
    from lgpt.plumbing.checkpoint import load_model
    from lgpt.plumbing.dataset import BatchLoader, evaluate_loss, reads_of_test
    data = str(tmp_path / "data")
    shutil.copytree(char_data_dir, data)
    model = load_model(trained_dir)[0]
    monkey_block = protocol.BLOCK
    try:
        protocol.BLOCK = 16
        dev = protocol.split_window_losses(model, data, "val", "unused")
        test = protocol.split_window_losses(model, data, "test", "recipe-a")
    finally:
        protocol.BLOCK = monkey_block
    whole = evaluate_loss(model, BatchLoader(data, 16, 8), "val", None)
    assert dev.mean() == pytest.approx(whole, rel=1e-5)  # every window holds 16 tokens: the mean over tokens
    assert len(test) == len(BatchLoader(data, 16, 8, test_for="counted").full_split_starts("test"))
    assert [r["recipe"] for r in reads_of_test(data)] == ["recipe-a", "counted"]  # val reads are not recorded
    s = protocol.summary(test, 1.0)
    assert s["loss"] == pytest.approx(float(np.mean(test))) and s["windows"] == len(test)
    assert s["se"] == pytest.approx(float(np.std(test, ddof=1) / np.sqrt(len(test))))


def test_configurations_tried_counts_distinct_runs_not_draws_orders_or_controls(tmp_path, monkeypatch):
    monkeypatch.setattr(protocol, "RESULTS", str(tmp_path))
    runs = {"real_model": {"rows": [{"out_dir": "runs/transform-smollm2-pca-m432-0123456789"},
                                    {"out_dir": "runs/transform-smollm2-pca-m432-seed1-abcdefabcd"},
                                    {"out_dir": "runs/transform-smollm2-pca-m288-0123456789"}]},
            "real_model_distill": {"arms": [{"out_dir": "runs/finetune-smollm2-pca-m432-kd-lr0.0001-b1-0123456789"},
                                            {"out_dir": "runs/finetune-smollm2-pca-m432-kd-lr0.0001-s2-b1-aaaaaaaaaa"},
                                            {"out_dir": "runs/finetune-smollm2-original-kd-self-lr0.0001-bbbbbbbbbb"},
                                            {"out_dir": "runs/finetune-smollm2-pca-m432-lm-cccccccccc"}]}}
    for name, payload in runs.items():
        os.makedirs(tmp_path / name)
        (tmp_path / name / "results.json").write_text(json.dumps(payload))
    counted = protocol.configurations_tried()
    assert (counted["transform"], counted["distillation"]) == (2, 1)


def test_losses_nest_by_text_and_split_once():
    flat = {"shakespeare/dev": 1.0, "shakespeare/test": 2.0, "wiki/test": 3.0}
    nested = protocol.nested(flat)
    assert nested == {"shakespeare": {"dev": 1.0, "test": 2.0}, "wiki": {"test": 3.0}}
    assert protocol.nested(nested) == nested


def test_a_steps_cost_is_its_cpu_time_where_measured_and_its_wall_time_named_otherwise(monkeypatch):
    assert protocol.core_seconds({"seconds": 900.0, "cpu_seconds": 300.0}) == (300.0, "cpu")
    monkeypatch.setattr(protocol, "CPU_POLLED", {"protocol-x-0123456789": 310.0})
    assert protocol.core_seconds({"seconds": 900.0, "out_dir": "protocol-x-0123456789"}) == (310.0, "cpu, polled")
    assert protocol.core_seconds({"seconds": 900.0, "out_dir": "other"}) == (900.0, "wall")


def test_a_ledger_made_again_carries_the_reads_the_results_recorded_and_counts_new_ones(tmp_path):
    """runs/ rebuilt from scratch prepares the texts again, with an empty test ledger: the results keep counting
    the reads the old ledger held, add the new ledger's, and never count a ledger twice."""
    import shutil as sh

    from lgpt.plumbing.dataset import TEST_READS, record_test_read
    old, new = str(tmp_path / "old"), str(tmp_path / "new")
    os.makedirs(old), os.makedirs(new)
    for recipe in ("a", "b", "c"):
        record_test_read(old, recipe)
    first = protocol.test_reads(old, {})
    assert first["reads"] == 3 and first["recipes"] == ["a", "b", "c"]
    for recipe in ("d", "e", "f"):  # the new ledger catches up with the old count before the next save
        record_test_read(new, recipe)
    after = protocol.test_reads(new, first)
    assert after["reads"] == 6 and after["recipes"] == ["a", "b", "c", "d", "e", "f"]
    assert protocol.test_reads(new, after)["reads"] == 6  # saved again: carried once, never twice
    sh.copy(os.path.join(old, TEST_READS), os.path.join(new, TEST_READS))  # the old ledger put back
    assert protocol.test_reads(new, after)["reads"] == 3 + 3  # itself, and the one it replaced, once each
    legacy = {"reads": 31, "recipes": ["x"]}  # results saved before ledgers had a name
    assert protocol.test_reads(str(tmp_path / "empty"), legacy)["reads"] == 31
    first_format = {"reads": 33, "recipes": ["x", "a"], "carried": 31, "carried_recipes": ["x"]}
    assert protocol.test_reads(old, first_format)["reads"] == 31 + 3


def test_cut_shortens_a_recipe_to_its_tokens_and_ends_its_schedule_there():
    from real_distill import recipe
    full = recipe(protocol.DISTILL_LR, 0, protocol.DISTILL_BATCH)
    assert protocol.cut(full, protocol.DISTILL_TOKENS) == full  # the recipe's own tokens: unchanged
    short = dict(a.split("=", 1) for a in protocol.cut(full, protocol.EQUAL_TOKENS))
    assert int(short["--max_iters"]) * int(short["--batch_size"]) * int(short["--block_size"]) == protocol.LEARN_TOKENS
    assert short["--lr_decay_iters"] == short["--max_iters"]  # the shorter run decays fully
    unchanged = {k: v for k, v in dict(a.split("=", 1) for a in full).items() if k not in ("--max_iters",
                                                                                         "--lr_decay_iters")}
    assert {k: short[k] for k in unchanged} == unchanged
    with pytest.raises(ValueError, match="whole number of steps"):
        protocol.cut(full, protocol.EQUAL_TOKENS + 1)


def test_a_process_with_an_older_plan_never_erases_a_later_plan_change(monkeypatch):
    monkeypatch.setattr(protocol, "PLAN_CHANGES", ["a", "b"])
    assert protocol.merged_plan_changes(["a", "b", "c"]) == ["a", "b", "c"]  # c was written by a newer process
    assert protocol.merged_plan_changes(["a"]) == ["a", "b"]
    assert protocol.merged_plan_changes([]) == ["a", "b"]


def test_a_reworded_plan_change_replaces_its_old_wording_in_place(monkeypatch):
    old, new = "x" * protocol.REWORDED + " after every other row", "x" * protocol.REWORDED + " after seed 0's rows"
    monkeypatch.setattr(protocol, "PLAN_CHANGES", ["a", new])
    assert protocol.merged_plan_changes([old, "a", "c"]) == [new, "a", "c"]


def test_a_draw_rebuilt_supersedes_the_old_row_and_a_second_process_keeps_the_rebuilt_one():
    def row(recipe, seed, out, scheme=True):
        return {"recipe": recipe, "seed": seed, "out_dir": out,
                **({"calibration_seeds": "seed * 100000 + k"} if scheme else {})}
    rows = {("free25", 1): row("free25", 1, "runs/old", scheme=False)}
    superseded: dict = {}
    protocol.replace(rows, superseded, row("free25", 1, "runs/new"))
    assert rows[("free25", 1)]["out_dir"] == "runs/new"
    assert superseded == {"runs/old": dict(row("free25", 1, "runs/old", scheme=False), superseded_by="runs/new")}
    protocol.replace(rows, superseded, row("free25", 1, "runs/new"))  # the same model again: nothing superseded
    assert list(superseded) == ["runs/old"]
    # a second process that loaded the old row at its start: the saved file's rebuilt row wins over its stale copy,
    # its own rows win over the file's, and the superseded rows of both are kept
    other_rows = {("free25", 1): row("free25", 1, "runs/old", scheme=False),
                  ("learned25", 1): row("learned25", 1, "runs/mine")}
    other_superseded = {"runs/old-learned": {"out_dir": "runs/old-learned"}}
    now = {"rows": [rows[("free25", 1)], row("learned25", 1, "runs/stale")],
           "superseded_rows": list(superseded.values()), "loto": []}
    protocol.merge_saved(now, other_rows, {}, other_superseded, {("learned25", 1)})
    assert other_rows[("free25", 1)]["out_dir"] == "runs/new"
    assert other_rows[("learned25", 1)]["out_dir"] == "runs/mine"
    assert set(other_superseded) == {"runs/old", "runs/old-learned"}
    fresh = row("free25", 1, os.path.join(protocol.harness.ROOT, "runs", "new"))  # a fresh row's absolute path
    protocol.replace(rows, superseded, fresh)
    assert list(superseded) == ["runs/old"]
    stale = {"runs/new": dict(row("free25", 1, "runs/new"), superseded_by="runs/new")}  # once superseded by itself
    protocol.merge_saved({"rows": [], "superseded_rows": list(stale.values())}, {}, {}, stale, set())
    assert stale == {}


def test_a_calibration_draw_beside_seed_0_reads_test_under_its_own_name():
    assert protocol.draw_name("free25", 0) == "free25-s0"  # seed 0: the same batches in both schemes
    assert protocol.draw_name("free25", 1) == "free25-s1-disjoint"
    assert protocol.draw_name("distill25", 1) == "distill25-s1"  # a data order: nothing changed
