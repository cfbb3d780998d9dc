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


def counting_build(calls: list):
    """A build that records each call and returns the same result."""
    def build(out):
        calls.append(out)
        os.makedirs(out, exist_ok=True)
        return {"loss": 1.5}
    return build


def test_a_run_is_built_once_per_configuration(runs):
    calls = []
    build = counting_build(calls)
    out, result = harness.cached("train", "x", {"lr": 1e-3}, build)
    again, same = harness.cached("train", "x", {"lr": 1e-3}, build)
    assert (out, result) == (again, same) == (calls[0], {"loss": 1.5}) and len(calls) == 1
    other, _ = harness.cached("train", "x", {"lr": 2e-3}, build)  # any change of the configuration: a new entry
    assert other != out and len(calls) == 2
    marker = json.load(open(os.path.join(out, harness.MARKER)))
    assert marker["spec"] == {"lr": 1e-3} and marker["result"] == {"loss": 1.5}


def test_a_cut_off_marker_is_built_again_with_a_note(runs, capsys):
    calls = []
    build = counting_build(calls)
    out, _ = harness.cached("train", "x", {"lr": 1e-3}, build)
    marker = os.path.join(out, harness.MARKER)
    text = open(marker).read()
    for damaged in (text[: len(text) // 2], "", "[1, 2]"):
        open(marker, "w").write(damaged)
        again, result = harness.cached("train", "x", {"lr": 1e-3}, build)
        assert (again, result) == (out, {"loss": 1.5}) and "cut off or unreadable" in capsys.readouterr().out
    assert len(calls) == 4


def test_wandb_that_cannot_start_is_one_config_error(tmp_path, monkeypatch):
    import wandb

    from lgpt.plumbing.errors import ConfigError
    from lgpt.plumbing.logger import MetricsLogger

    def refuse(**_):
        raise RuntimeError("api_key not configured (no-tty). call wandb.login(key=[your_api_key])")
    monkeypatch.setattr(wandb, "init", refuse)
    monkeypatch.setenv("WANDB_MODE", "online")
    with pytest.raises(ConfigError, match="wandb could not start .*WANDB_MODE=online.*api_key not configured"):
        MetricsLogger(str(tmp_path), wandb_log=True)


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


def test_a_new_option_that_defaults_to_off_keeps_existing_keys():
    import dataclasses

    @dataclasses.dataclass
    class Old:
        lr: float = 1e-3
        dropout: float = 0.0

    @dataclasses.dataclass
    class New(Old):
        refit: str = "none"  # a feature added later, off by default
        steps: int = 0

    assert harness.spec_of(Old()) == harness.spec_of(New()) == {"lr": 1e-3}
    assert harness.spec_of(New(refit="all")) == {"lr": 1e-3, "refit": "all"}
    assert harness.spec_of(Old(dropout=0.1)) == {"lr": 1e-3, "dropout": 0.1}
    from transform import TransformConfig  # options that only tune another one are out while it is off
    assert "refit_ridge" not in harness.spec_of(TransformConfig()) and "learn_lr" not in harness.spec_of(
        TransformConfig())
    assert harness.spec_of(TransformConfig(refit="all"))["refit_ridge"] == 1e-4
    from finetune import FinetuneConfig
    assert not {"distill_alpha", "distill_temperature", "distill_chunk"} & set(harness.spec_of(FinetuneConfig()))
    assert harness.spec_of(FinetuneConfig(distill=True))["distill_alpha"] == 1.0


def made(out: str, result: dict) -> dict:
    os.makedirs(out, exist_ok=True)
    return result


def test_a_run_keyed_before_an_option_joined_only_with_is_still_found(runs):
    """distill_* joined ONLY_WITH after runs had been cached with them in their key: spec_of's legacy key finds
    those runs instead of building them again."""
    from finetune import FinetuneConfig
    cfg = FinetuneConfig(in_dir="in", out_dir="o")
    spec = harness.spec_of(cfg)
    assert "distill_alpha" not in spec and spec.legacy["distill_alpha"] == 1.0
    old, _ = harness.cached("finetune", "f", dict(spec.legacy), lambda out: made(out, {"built": "then"}))
    out, result = harness.cached("finetune", "f", spec, lambda out: {"built": "now"})
    assert (out, result) == (old, {"built": "then"})


def test_cost_mode_reads_recorded_build_times_and_builds_nothing(runs, monkeypatch):
    built, _ = harness.cached("train", "t", {"a": 1}, lambda out: made(out, {"x": 1}))
    monkeypatch.setattr(harness, "TRACE", {})
    assert harness.cached("train", "t", {"a": 1}, lambda out: pytest.fail("built in cost mode"))[1] == {"x": 1}
    assert list(harness.TRACE) == [built] and harness.TRACE[built] >= 0
    with pytest.raises(harness.NotCached, match="is not built"):
        harness.cached("train", "t", {"a": 2}, lambda out: pytest.fail("built in cost mode"))
    monkeypatch.setattr(harness, "RESULTS", str(runs / "results"))
    harness.save("e", {"v": 1}, 0.0, harness.Setting(quick=True))
    assert not os.path.exists(runs / "results")


def test_each_walks_odd_lanes_from_the_back_and_comes_back_for_busy_cells(monkeypatch):
    seen = []

    def run(cell):
        seen.append(cell)
        if cell == "b":
            raise harness.Busy(os.path.join(ROOT, "runs", "x"))
        return cell.upper()

    monkeypatch.setattr(harness, "LANE", 1)
    with pytest.raises(harness.Busy):
        harness.each(["a", "b", "c"], run)
    assert seen == ["c", "b", "a"]  # the busy cell did not stop the others
    monkeypatch.setattr(harness, "LANE", 0)
    assert harness.each(["a", "c"], run) == ["A", "C"]


def test_a_run_locked_by_another_lane_is_busy_instead_of_waited_for(runs, monkeypatch):
    import fcntl
    out = os.path.join(runs, "train-x-" + harness.key_of({"a": 1, "stage": "train"}))
    with open(out + ".lock", "w") as other:  # another lane building it (a second open file holds its own lock)
        fcntl.flock(other, fcntl.LOCK_EX)
        assert harness.building_elsewhere(out)
        monkeypatch.setattr(harness, "SKIP_BUSY", True)
        with pytest.raises(harness.Busy) as busy:
            harness.cached("train", "x", {"a": 1}, lambda o: pytest.fail("built while another lane builds it"))
        assert busy.value.path == out
    assert not harness.building_elsewhere(out)  # that lane is gone: build it here
    assert harness.cached("train", "x", {"a": 1}, lambda o: made(o, {"v": 2}))[1] == {"v": 2}


def test_two_lanes_share_the_work_build_every_run_once_and_the_owner_writes(runs, monkeypatch):
    """Two processes run experiments.in_lanes over two experiments of slow runs: every run is built once, both
    lanes build, and each experiment's results are written by its owner alone."""
    import multiprocessing
    import time

    import experiments
    monkeypatch.setattr(harness, "RESULTS", str(runs / "results"))

    def experiment(name):
        def run(s):
            def build(out):
                os.makedirs(out, exist_ok=True)
                time.sleep(0.2)
                with open(runs / "built.txt", "a") as f:
                    f.write(f"{name} {os.getpid()}\n")
                return {"pid": os.getpid()}
            values = harness.each(range(6), lambda i: harness.cached("train", name, {"i": i}, build)[1]["pid"])
            harness.save(name, {"values": values, "writer": os.getpid()}, time.time(), s)
        return run

    monkeypatch.setattr(experiments, "EXPERIMENTS", {"e1": experiment("e1"), "e2": experiment("e2")})
    s = harness.Setting(quick=True)
    ctx = multiprocessing.get_context("fork")
    lanes = [ctx.Process(target=experiments.in_lanes, args=(s, ["e1", "e2"], lane, 2, 0.1)) for lane in (0, 1)]
    for p in lanes:
        p.start()
    for p in lanes:
        p.join(60)
    assert [p.exitcode for p in lanes] == [0, 0]
    built = open(runs / "built.txt").read().split("\n")[:-1]
    assert sorted(line.split()[0] for line in built) == ["e1"] * 6 + ["e2"] * 6  # each run once
    pids = {line.split()[1] for line in built}
    assert len(pids) == 2  # both lanes built runs
    writers = [json.load(open(runs / "results" / e / "results.json"))["writer"] for e in ("e1", "e2")]
    assert writers[0] != writers[1] and set(map(str, writers)) == pids  # e1: lane 0's, e2: lane 1's


def test_a_finished_runs_full_val_loss_is_kept_beside_its_checkpoint(runs, trained_dir, monkeypatch):
    import shutil
    run = runs / "train-x-s0-abc"
    shutil.copytree(trained_dir, run)
    evaluated = []
    real = harness.evaluate_loss
    monkeypatch.setattr(harness, "evaluate_loss", lambda *a, **k: evaluated.append(1) or real(*a, **k))
    first = harness.full_val_loss(str(run), "cpu")  # no marker yet: a partial run is never memoised
    assert not os.path.exists(run / harness.FULL_VAL)
    (run / harness.MARKER).write_text("{}")
    assert harness.full_val_loss(str(run), "cpu") == first == harness.full_val_loss(str(run), "cpu")
    assert len(evaluated) == 2 and json.load(open(run / harness.FULL_VAL))["loss"] == first
    os.utime(run / "ckpt.pt", ns=(1, 1))  # a rewritten checkpoint is evaluated again
    assert harness.full_val_loss(str(run), "cpu") == first and len(evaluated) == 3


def test_a_moved_cache_still_finds_a_finetune_and_says_where_it_is_now(trained_dir, monkeypatch, tmp_path):
    import shutil
    runs = tmp_path / "runs"
    monkeypatch.setattr(harness, "RUNS", str(runs))
    s = harness.Setting(quick=True)
    s.finetune_iters, s.finetune_eval_interval, s.finetune_eval_iters = 2, 1, 1
    src = str(tmp_path / "train-tiny-s0")  # cached runs are named stage-label-...
    shutil.copytree(trained_dir, src)
    built = []
    real = harness.finetune
    monkeypatch.setattr(harness, "finetune", lambda cfg: built.append(cfg.out_dir) or real(cfg))
    first = harness.finetuned(s, src)
    moved = tmp_path / "moved"
    shutil.move(str(runs), moved)
    monkeypatch.setattr(harness, "RUNS", str(moved))
    again = harness.finetuned(s, src)
    assert len(built) == 1 and again["val_loss"] == first["val_loss"]
    assert again["out_dir"].startswith(str(moved)) and os.path.exists(os.path.join(again["out_dir"], "ckpt.pt"))


def test_a_model_trained_without_its_curve_is_the_same_model(runs, char_data_dir):
    """curve=False evaluates at the start and the end only; the weights must not depend on the eval schedule."""
    import torch

    from conftest import TINY_MODEL
    s = harness.Setting(quick=True)
    s.base = TINY_MODEL + [f"--data_dir={char_data_dir}", "--max_iters=12", "--eval_interval=3", "--eval_iters=2",
                           "--dropout=0.1"]
    with_curve = harness.trained(s, "a", seed=0)
    without = harness.trained(s, "b", seed=0, curve=False)
    evals = [[r for r in map(json.loads, open(os.path.join(p, "metrics.jsonl"))) if "val/loss" in r]
             for p in (with_curve, without)]
    assert [r["iter"] for r in evals[0]] == [0, 3, 6, 9, 12] and [r["iter"] for r in evals[1]] == [0, 12]
    assert evals[0][-1]["val/loss"] == evals[1][-1]["val/loss"]
    a, b = (torch.load(os.path.join(p, "ckpt.pt"), weights_only=False)["model"] for p in (with_curve, without))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_scale_fit_recovers_a_power_law_and_its_interval_matches_linregress():
    import numpy as np
    from scipy import stats

    from scale import loglog_fit
    ds = [64, 128, 256, 512]
    exact = loglog_fit(ds, [0.3 * d ** -0.5 for d in ds], at=(1024,))
    assert abs(exact["slope"] + 0.5) < 1e-12 and abs(exact["per_doubling"] - 2 ** -0.5) < 1e-12
    assert abs(exact["predict"]["1024"][0] - 0.3 * 1024 ** -0.5) < 1e-12  # a line through the points extrapolates
    noisy = [0.3 * d ** -0.5 * f for d, f in zip(ds, (1.1, 0.9, 1.05, 0.97))]
    fit = loglog_fit(ds, noisy)
    ref = stats.linregress(np.log(ds), np.log(noisy))
    half = stats.t.ppf(0.975, len(ds) - 2) * ref.stderr
    assert np.allclose(fit["slope_ci"], [ref.slope - half, ref.slope + half])
    assert loglog_fit([128, 256], [0.02, 0.01])["slope_ci"] is None  # two widths: a slope, no interval


def test_the_quantization_summary_averages_seeds_and_subtracts_the_unrotated_model():
    import real_quantization
    rows = [{"rotation": "none", "losses": {"W4": {"val": 5.0, "general": 6.0}}},
            {"rotation": "hadamard", "losses": {"W4": {"val": 4.0, "general": 5.0}}},
            {"rotation": "hadamard", "losses": {"W4": {"val": 4.2, "general": 5.4}}}]
    summary = {s["rotation"]: s for s in real_quantization.summary(rows)}
    assert summary["hadamard"]["n"] == 2 and summary["none"]["n"] == 1
    cell = summary["hadamard"]["settings"]["W4"]
    assert cell["val"]["mean"] == pytest.approx(4.1) and cell["val"]["std"] == pytest.approx(0.1414, abs=1e-4)
    assert cell["val_vs_none"] == pytest.approx(-0.9) and cell["general_vs_none"] == pytest.approx(-0.8)


def test_the_distillation_recipe_in_smaller_batches_keeps_the_tokens_and_the_schedule_in_tokens():
    """real_distill.recipe(batch=b): every step count scales by 8 / b, so the tokens (steps × batch), the warmup's
    and the decay's share stay and only the optimizer steps change; the recipe's own batch is the recipe unchanged
    (its cached runs keep their keys); a batch that does not divide 8 is refused."""
    import real_distill

    def values(recipe: list[str]) -> dict[str, str]:
        return dict(a.split("=", 1) for a in recipe)

    base = values(real_distill.recipe(1e-4))
    assert real_distill.recipe(1e-4, batch=real_distill.BATCH) == real_distill.recipe(1e-4)
    for batch in real_distill.BATCHES:
        small = values(real_distill.recipe(1e-4, batch=batch))
        scale = int(base["--batch_size"]) // batch
        assert int(small["--batch_size"]) == batch
        assert int(small["--max_iters"]) * batch == int(base["--max_iters"]) * int(base["--batch_size"])
        for key in ("--lr_decay_iters", "--warmup_iters", "--eval_interval", "--log_interval"):
            assert int(small[key]) == int(base[key]) * scale
        unchanged = set(base) - {"--batch_size", "--max_iters", "--lr_decay_iters", "--warmup_iters",
                                 "--eval_interval", "--log_interval"}
        assert {k: small[k] for k in unchanged} == {k: base[k] for k in unchanged}
    with pytest.raises(ValueError, match="must divide"):
        real_distill.recipe(1e-4, batch=3)


def test_the_later_distillation_parts_need_the_chosen_rate_and_batch_already_in_results(tmp_path, monkeypatch):
    """real_distill --part=later adds to results/real_model_distill/results.json: without that file, or with one
    that has not chosen a batch yet, it stops with one line naming the fix; with one, it returns it unchanged."""
    import json

    import real_distill

    import real_quantization

    monkeypatch.setattr(real_quantization, "RESULTS", str(tmp_path))  # where the one results loader reads
    with pytest.raises(SystemExit, match="is missing: run scripts/real_distill.sh"):
        real_distill.saved_results()
    out = tmp_path / "real_model_distill"
    out.mkdir()
    (out / "results.json").write_text(json.dumps({"chosen_lr": 1e-4, "batches": {"rows": []}}))
    with pytest.raises(SystemExit, match="has no chosen batch"):
        real_distill.saved_results()
    saved = {"chosen_lr": 1e-4, "batches": {"rows": [], "chosen": 1}}
    (out / "results.json").write_text(json.dumps(saved))
    assert real_distill.saved_results() == saved


def test_the_distillation_recipe_with_a_floor_changes_only_the_rates_end():
    """real_distill.recipe(floor=f): --min_lr is f and nothing else moves; without one the end stays a tenth of the
    rate (the cached runs keep their keys)."""
    import real_distill

    def values(recipe: list[str]) -> dict[str, str]:
        return dict(a.split("=", 1) for a in recipe)

    tenth, zero = values(real_distill.recipe(1e-4, 1, 1)), values(real_distill.recipe(1e-4, 1, 1, floor=0.0))
    assert tenth["--min_lr"] == "1e-05" and zero["--min_lr"] == "0"
    assert {k: v for k, v in zero.items() if k != "--min_lr"} == {k: v for k, v in tenth.items() if k != "--min_lr"}


def test_the_to_zero_part_distils_the_best_learned_start_over_three_orders_against_its_own_control(monkeypatch):
    """real_distill --part=to_zero: the best learned −25% start at the chosen rate and batch with the rate decayed to
    FLOOR, data orders 0, 1, 2, gaps to its own control (with FLOOR too); --reverse builds the control and the last
    order and saves nothing."""
    import real_distill

    for reverse in (False, True):
        arms, controls, saves = [], [], []
        monkeypatch.setattr(real_distill, "build", lambda src, data, spec: {"out_dir": "start"})
        monkeypatch.setattr(real_distill, "arm", lambda data, start, lr, seed=0, name="", batch=8, m=432, floor=None,
                            arms=arms: arms.append((seed, lr, batch, floor)) or {
                                "losses": {"val": 3.85 + seed / 100, "general": 4.4}, "parameters": 1,
                                "step": {"seconds": 60.0}})
        monkeypatch.setattr(real_distill, "control", lambda src, data, lr, batch, floor=None, controls=controls: (
            controls.append((lr, batch, floor)) or {"losses": {"val": 3.7584, "general": 3.7886}, "out_dir": "c"}))
        monkeypatch.setattr(real_distill, "unchanged", lambda a, b: True)
        monkeypatch.setattr(real_distill, "save", lambda payload, *a, saves=saves: saves.append(sorted(payload)))
        payload = {"chosen_lr": 1e-4, "batches": {"chosen": 1}, "labels_learned": {"losses": {"val": 3.88}}}
        real_distill.to_zero("src", {}, payload, 0.0, reverse)
        floor = real_distill.FLOOR
        assert controls == [(1e-4, 1, floor)]
        if reverse:
            assert arms == [(2, 1e-4, 1, floor)] and saves == [] and "to_zero" not in payload
            continue
        assert arms == [(seed, 1e-4, 1, floor) for seed in (0, 1, 2)] and len(saves) == 1
        x = payload["to_zero"]
        assert x["start"] == "labels_learned" and x["min_lr"] == floor and x["control"]["unchanged"]
        assert x["gap"]["val"]["each"] == pytest.approx([v / 3.7584 - 1 for v in (3.85, 3.86, 3.87)])
        assert "--min_lr=0" in x["recipe"] and x["seconds"] == [60.0] * 3


def test_the_distillation_loss_changes_only_what_it_is_asked_to():
    """real_distill.loss_args: the recipe's KL alone (the cached runs keep their options), then one change at a
    time: τ, the hidden-state term, the KL's weight α against the text's labels."""
    import real_distill

    assert real_distill.loss_args(0.0) == real_distill.DISTILL
    assert real_distill.loss_args(0.0, 2.0) == ("--distill=True", "--distill_alpha=1.0", "--distill_temperature=2")
    assert real_distill.loss_args(0.1) == (*real_distill.DISTILL, "--distill_hidden=0.1")
    assert real_distill.loss_args(0.0, alpha=0.5) == ("--distill=True", "--distill_alpha=0.5",
                                                      "--distill_temperature=1.0")


@pytest.mark.parametrize("gap_below_the_kl", [True, False])
def test_the_labels_part_distils_the_best_learned_start_on_kl_and_labels_against_its_own_control(monkeypatch,
                                                                                                  gap_below_the_kl):
    """real_distill --part=labels: the best learned −25% start with ALPHA·KL + (1 − ALPHA)·CE, data order 0, against
    the original distilled from itself with that loss; two more orders only where its gap ends below the KL's order
    0; --reverse builds the control only and saves nothing."""
    import real_distill

    for reverse in (False, True):
        arms, controls, saves = [], [], []
        monkeypatch.setattr(real_distill, "build", lambda src, data, spec: {"out_dir": "start"})
        arm_val = 3.70 if gap_below_the_kl else 3.80  # against the control's 3.60: +2.8% or +5.6%, the KL's +3.2%
        monkeypatch.setattr(real_distill, "arm", lambda data, start, lr, seed=0, name="", batch=8, m=432, alpha=1.0,
                            arms=arms, arm_val=arm_val: arms.append((seed, lr, batch, alpha)) or {
                                "losses": {"val": arm_val + seed / 1000, "general": 4.4}, "parameters": 1,
                                "step": {"seconds": 60.0}})
        monkeypatch.setattr(real_distill, "control", lambda src, data, lr, batch, alpha=1.0, controls=controls: (
            controls.append((lr, batch, alpha)) or {"losses": {"val": 3.60, "general": 3.75}, "out_dir": "c"}))
        monkeypatch.setattr(real_distill, "unchanged", lambda a, b: False)
        monkeypatch.setattr(real_distill, "save", lambda payload, *a, saves=saves: saves.append(sorted(payload)))
        payload = {"chosen_lr": 1e-4, "batches": {"chosen": 1}, "labels_learned": {"losses": {"val": 3.88}},
                   "learned_draws": {"start": "labels_learned", "gap": {"val": {"each": [0.032, 0.037, 0.039]}}}}
        real_distill.with_labels("src", {}, payload, 0.0, reverse)
        alpha = real_distill.ALPHA
        assert controls == [(1e-4, 1, alpha)]
        if reverse:
            assert arms == [] and saves == [] and "labels" not in payload
            continue
        x = payload["labels"]
        assert x["start"] == "labels_learned" and x["alpha"] == alpha and not x["control"]["unchanged"]
        assert f"--distill_alpha={alpha:g}" in x["loss"] and x["recipe"] == real_distill.recipe(1e-4, batch=1)
        if gap_below_the_kl:
            assert arms == [(seed, 1e-4, 1, alpha) for seed in (0, 1, 2)] and len(saves) == 3
            assert x["draws"]["gap"]["val"]["each"] == pytest.approx([(3.70 + s / 1000) / 3.60 - 1 for s in (0, 1, 2)])
            assert x["draws"]["start"] == "labels_learned" and x["draws"]["alpha"] == alpha
        else:
            assert arms == [(0, 1e-4, 1, alpha)] and len(saves) == 2 and "draws" not in x


def test_the_learned_part_distils_every_learned_start_and_reverse_builds_only_the_last(monkeypatch):
    """real_distill --part=learned: the learned m = 432 and m = 288 starts, the m = 432 map learned with its norm
    gains and with the text's labels too, each distilled with the best recipe and saved under its own key with its
    zero-shot losses and options; a start already saved is kept; --reverse builds the last start's run and saves
    nothing."""
    import real_distill

    for reverse in (False, True):
        built, arms, saves = [], [], []
        monkeypatch.setattr(real_distill, "build", lambda src, data, spec, built=built: built.append(spec) or {
            "out_dir": f"m{spec[0]}{''.join(spec[2])}", "losses": {"val": spec[0] / 100}})
        monkeypatch.setattr(real_distill, "arm", lambda data, start, lr, name="", batch=8, m=432, arms=arms: (
            arms.append((start["out_dir"], lr, name, batch, m)) or {"losses": {"val": 3.9}}))
        monkeypatch.setattr(real_distill, "parameters", lambda out: 1)
        monkeypatch.setattr(real_distill, "save", lambda payload, *a, saves=saves: saves.append(sorted(payload)))
        payload = {"chosen_lr": 1e-4, "batches": {"chosen": 1}}
        real_distill.learned("src", {}, payload, 0.0, reverse)
        learn, gains = (real_distill.LEARN,), (real_distill.LEARN, real_distill.GAINS)
        starts = [(real_distill.RECOVER[0], learn, "-learned"), (real_distill.HALF[0], learn, "-learned"),
                  (real_distill.RECOVER[0], gains, "-learned-gains"),
                  (real_distill.RECOVER[0], (*gains, real_distill.LABELS), "-learned-gains-labels")]
        starts = starts[-1:] if reverse else starts
        assert [(spec[0], spec[2]) for spec in built] == [(m, more) for m, more, _ in starts]
        assert arms == [(f"m{m}{''.join(more)}", 1e-4, name, 1, m) for m, more, name in starts]
        if reverse:
            assert saves == [] and "labels_learned" not in payload
        else:
            assert len(saves) == 4 and payload["half_learned"]["m"] == real_distill.HALF[0]
            assert payload["labels_learned"]["option"].endswith("--learn_label_weight=0.5")
            built.clear()
            real_distill.learned("src", {}, payload, 0.0)  # every start saved: nothing built again
            assert built == [] and len(saves) == 4
            assert payload["learned"]["zero_shot"] == {"val": real_distill.RECOVER[0] / 100}
            assert payload["gains_learned"]["option"] == "--learn_steps=16 --learn_gain_lr=1e-2"
            assert payload["learned"]["option"] == "--learn_steps=16"


def test_the_learned_draws_part_adds_two_data_orders_to_the_lowest_learned_432_start(monkeypatch):
    """real_distill --part=learned_draws: the −25% learned start whose distilled model ends lowest (never the −50%
    one, however low) gets data orders 1 and 2 with the best recipe; the three gaps go to the best recipe's control;
    --reverse builds only the last order and saves nothing; without a learned start it stops with one line."""
    import real_distill

    def lowest_first(key):
        return {"losses": {"val": 3.0 if key == "half_learned" else 3.8 if key == "labels_learned" else 3.9,
                           "general": 4.4}}

    for reverse in (False, True):
        built, arms, saves = [], [], []
        monkeypatch.setattr(real_distill, "build", lambda src, data, spec, built=built: built.append(spec) or {
            "out_dir": "".join(spec[2])})
        monkeypatch.setattr(real_distill, "arm", lambda data, start, lr, seed=0, name="", batch=8, m=432, arms=arms: (
            arms.append((start["out_dir"], lr, seed, name, batch, m)) or {"losses": {"val": 3.8 + seed / 100,
                                                                                      "general": 4.4}}))
        monkeypatch.setattr(real_distill, "save", lambda payload, *a, saves=saves: saves.append(sorted(payload)))
        payload = {"chosen_lr": 1e-4, "batches": {"chosen": 1, "control": {"losses": {"val": 3.7, "general": 4.0}}}}
        payload |= {key: lowest_first(key) for key, *_ in real_distill.LEARNED_STARTS}
        real_distill.learned_draws("src", {}, payload, 0.0, reverse)
        labels = (real_distill.LEARN, real_distill.GAINS, real_distill.LABELS)
        assert [spec[2] for spec in built] == [labels]
        seeds = real_distill.DATA_SEEDS[-1:] if reverse else real_distill.DATA_SEEDS
        assert arms == [("".join(labels), 1e-4, s, "-learned-gains-labels", 1, 432) for s in seeds]
        if reverse:
            assert saves == [] and "learned_draws" not in payload
            continue
        draws = payload["learned_draws"]
        assert len(saves) == 1 and draws["start"] == "labels_learned" and draws["seeds"] == [0, 1, 2]
        assert draws["gap"]["val"]["each"] == pytest.approx([3.8 / 3.7 - 1, 3.81 / 3.7 - 1, 3.82 / 3.7 - 1])
        assert draws["option"].endswith("--learn_label_weight=0.5")
    with pytest.raises(SystemExit, match="no learned −25% start: run --part=learned first"):
        real_distill.learned_draws("src", {}, {"chosen_lr": 1e-4, "batches": {"chosen": 1}}, 0.0)


def test_the_mix_draws_part_adds_two_data_orders_to_the_general_case_from_the_mix(monkeypatch):
    """real_distill --part=mix_draws: the mix's start (MIX_RECIPE) distilled on the mix at data orders 1 and 2 with
    the mix case's own rate and batch; the three gaps go to the mix case's control; --reverse builds only the last
    order and saves nothing; without the mix case's control it stops with one line."""
    import real_distill

    for reverse in (False, True):
        built, arms, saves = [], [], []
        monkeypatch.setattr(real_distill, "build", lambda src, data, spec, built=built: built.append(spec) or {
            "out_dir": spec[3]})
        monkeypatch.setattr(real_distill, "arm", lambda data, start, lr, seed=0, name="", batch=8, text="", arms=arms: (
            arms.append((start["out_dir"], lr, seed, name, batch, text)) or {"losses": {"val": 4.0,
                                                                                         "general": 4.4 + seed / 100}}))
        monkeypatch.setattr(real_distill, "save", lambda payload, *a, saves=saves: saves.append(sorted(payload)))
        case = {"batch": 1, "arm": {"lr": 1e-4, "losses": {"val": 4.03, "general": 4.37}},
                "control": {"losses": {"val": 3.76, "general": 3.79}}}
        payload = {"chosen_lr": 3e-4, "mix_case": case}
        real_distill.mix_draws("src", {}, payload, 0.0, reverse)
        assert built == [real_distill.MIX_RECIPE] and real_distill.MIX_RECIPE[3] == "mix"
        seeds = real_distill.DATA_SEEDS[-1:] if reverse else real_distill.DATA_SEEDS
        assert arms == [("mix", 1e-4, s, real_distill.MIX_NAME, 1, "mix") for s in seeds]  # the case's rate, batch
        if reverse:
            assert saves == [] and "mix_draws" not in payload
            continue
        draws = payload["mix_draws"]
        assert len(saves) == 1 and draws["start"] == "mix_case" and draws["seeds"] == [0, 1, 2]
        assert draws["gap"]["general"]["each"] == pytest.approx([4.37 / 3.79 - 1, 4.41 / 3.79 - 1, 4.42 / 3.79 - 1])
    with pytest.raises(SystemExit, match="no general case from the mix with its control: run --part=mix first"):
        real_distill.mix_draws("src", {}, {"chosen_lr": 1e-4, "mix_case": {"arm": {}}}, 0.0)


def test_a_part_that_adds_to_saved_results_keeps_what_a_part_beside_it_saved_meanwhile(tmp_path, monkeypatch):
    """Two parts start from the same results.json; each saves its own key. With merge (real_distill.save_part) the
    second save keeps the first's key (without it, the key is lost: the race seen when --part=learned_rates and
    --part=learned_draws ran side by side); a key both hold takes the saving part's value."""
    import real_distill

    import real_quantization

    monkeypatch.setattr(real_quantization, "RESULTS", str(tmp_path))
    real_quantization.save({"rows": [1], "shared": 0}, 0.0, "real_model_distill", "c")
    first = real_quantization.saved("real_model_distill", "c")
    second = real_quantization.saved("real_model_distill", "c")
    real_distill.save_part(dict(first, learned_draws={"n": 3}), 0.0)
    real_distill.save_part(dict(second, learned_rates={"lr": 3e-5}, shared=1), 0.0)
    merged = real_quantization.saved("real_model_distill", "c")
    assert merged["learned_draws"] == {"n": 3} and merged["learned_rates"] == {"lr": 3e-5}
    assert merged["rows"] == [1] and merged["shared"] == 1 and merged["meta"]["command"] == "scripts/real_distill.sh"
    real_quantization.save(dict(second, learned_rates={"lr": 3e-5}), 0.0, "real_model_distill", "c")
    assert "learned_draws" not in real_quantization.saved("real_model_distill", "c")  # a plain save replaces


def test_the_distillation_script_runs_every_added_part():
    """scripts/real_distill.sh reproduces the whole experiment: its loop names every part of real_distill.ADDED."""
    import re

    import real_distill

    script = open(os.path.join(ROOT, "scripts", "real_distill.sh")).read()
    loop = re.search(r"for part in ([a-z_ ]+); do", script).group(1).split()
    assert sorted(loop) == sorted(real_distill.ADDED)


@pytest.mark.parametrize("wins", [True, False])
def test_the_learned_rates_part_tries_the_lower_rates_on_the_best_learned_start_then_orders_if_one_wins(
        monkeypatch, wins):
    """real_distill --part=learned_rates: the rates of LRS below the chosen one on the lowest −25% learned start,
    order 0, saved after each; two more data orders at the winner only where it ends below the chosen rate's run;
    --reverse builds the lowest rate's run only and saves nothing."""
    import real_distill

    for reverse in (False, True):
        arms, saves = [], []
        monkeypatch.setattr(real_distill, "build", lambda src, data, spec: {"out_dir": "".join(spec[2])})
        monkeypatch.setattr(real_distill, "arm", lambda data, start, lr, seed=0, name="", batch=8, m=432, arms=arms: (
            arms.append((lr, seed, name, batch, m)) or {"losses": {"val": (3.85 if wins else 3.95) + seed / 100,
                                                                   "general": 4.4}}))
        monkeypatch.setattr(real_distill, "save", lambda payload, *a, saves=saves: saves.append(sorted(payload)))
        payload = {"chosen_lr": 1e-4, "batches": {"chosen": 1, "control": {"losses": {"val": 3.7, "general": 4.0}}},
                   "labels_learned": {"losses": {"val": 3.88}}, "gains_learned": {"losses": {"val": 3.89}}}
        real_distill.learned_rates("src", {}, payload, 0.0, reverse)
        lower = [lr for lr in real_distill.LRS if lr < 1e-4]
        name = "-learned-gains-labels"
        if reverse:
            assert arms == [(lower[0], 0, name, 1, 432)] and saves == [] and "learned_rates" not in payload
            continue
        orders = [(lower[-1 if wins else 0], s, name, 1, 432) for s in real_distill.DATA_SEEDS] if wins else []
        assert arms == [(lr, 0, name, 1, 432) for lr in reversed(lower)] + orders
        rates = payload["learned_rates"]
        assert rates["start"] == "labels_learned" and [x["lr"] for x in rates["rows"]] == list(reversed(lower))
        assert ("draws" in rates) == wins and len(saves) == len(lower) + wins
        if wins:
            assert rates["draws"]["lr"] == lower[-1] and rates["draws"]["gap"]["val"]["each"][0] == pytest.approx(
                3.85 / 3.7 - 1)


@pytest.mark.parametrize("wins", [True, False])
@pytest.mark.parametrize("part", ["features", "temperature"])
def test_a_loss_part_tries_each_value_then_the_lowest_ones_control_and_orders_only_if_it_wins(monkeypatch, wins,
                                                                                               part):
    """real_distill --part=features (each β of HIDDEN) and --part=temperature (each τ of TEMPERATURES): every value
    in the best recipe (data order 0), the control distilled from itself with the lowest value's loss, and two more
    data orders only where that value ends below the KL alone; saved."""
    import real_distill

    option, values, run, listed = {"features": ("hidden", real_distill.HIDDEN, real_distill.features, "weights"),
                                   "temperature": ("temperature", real_distill.TEMPERATURES, real_distill.temperatures,
                                                   "temperatures")}[part]
    plain = 3.88
    val = {v: 3.95 - 0.01 * i for i, v in enumerate(values)}
    val[values[-1]] = 3.80 if wins else 3.90
    calls, saves = [], []

    def fake_arm(data, start, lr, data_seed=0, name="", batch=8, text="shakespeare", m=432, **loss):
        assert set(loss) == {option}
        calls.append(("arm", loss[option], data_seed, batch, lr))
        return {"losses": {"val": val[loss[option]] + data_seed / 100, "general": 4.4}}

    def fake_control(src, data, lr, batch=8, text="shakespeare", **loss):
        assert set(loss) == {option}
        calls.append(("control", loss[option], 0, batch, lr))
        return {"losses": {"val": 3.7584, "general": 3.7886}, "out_dir": "ctrl"}

    monkeypatch.setattr(real_distill, "build", lambda *a: {"out_dir": "start"})
    monkeypatch.setattr(real_distill, "arm", fake_arm)
    monkeypatch.setattr(real_distill, "control", fake_control)
    monkeypatch.setattr(real_distill, "unchanged", lambda a, b: True)
    monkeypatch.setattr(real_distill, "save", lambda payload, *a: saves.append(json_copy(payload)))
    payload = {"chosen_lr": 1e-4, "rows": [], "batches": {"chosen": 1, "rows": [{"batch": 1, "arm": {
        "losses": {"val": plain}}}]}}
    run("src", {}, payload, 0.0, reverse=False)
    best = min(val, key=val.get)  # the lowest value, whether or not it beats the KL alone
    arms = [("arm", v, 0, 1, 1e-4) for v in values]
    more = [("arm", best, s, 1, 1e-4) for s in real_distill.DATA_SEEDS] if wins else []
    assert calls == arms + [("control", best, 0, 1, 1e-4)] + more
    f = saves[-1][part]
    assert f["chosen"] == best and f["control"]["unchanged"] and [r[option] for r in f["rows"]] == list(values)
    assert f[listed] == list(values) and ("draws" in f) == wins
    if wins:
        assert f["draws"]["gap"]["val"]["each"] == pytest.approx([v / 3.7584 - 1 for v in (3.80, 3.81, 3.82)])
    calls.clear()
    saves.clear()
    run("src", {}, payload, 0.0, reverse=True)  # build only, from the end: saves nothing
    assert not saves and calls[0] == ("arm", values[-1], 0, 1, 1e-4)


def test_the_distillation_loss_options_name_a_temperature_only_where_it_is_not_one():
    """real_distill.loss_args: τ = 1 is DISTILL as it was (the cached runs' options); another τ replaces its
    --distill_temperature, and the hidden-state term is added after it."""
    import real_distill
    assert real_distill.loss_args(0.0) == real_distill.loss_args(0.0, 1.0) == real_distill.DISTILL
    assert real_distill.loss_args(0.1, 2.0) == ("--distill=True", "--distill_alpha=1.0", "--distill_temperature=2",
                                                "--distill_hidden=0.1")


def json_copy(payload: dict) -> dict:
    import json
    return json.loads(json.dumps(payload, default=str))


def test_the_best_rate_in_the_chosen_batch_counts_the_chosen_rates_own_run():
    """real_distill.best_rate: the lowest whole-split val among the other rates' runs in the chosen batch and the
    chosen rate's run there (read from the saved results), whichever it is."""
    import real_distill

    def run(val: float) -> dict:
        return {"losses": {"val": val}}

    payload = {"chosen_lr": 1e-4, "batches": {"chosen": 1, "rows": [{"batch": 4, "arm": run(3.70)},
                                                                      {"batch": 1, "arm": run(3.88)}]}}
    assert real_distill.best_rate(payload, {3e-5: run(3.95), 3e-4: run(3.90)}) == 1e-4
    assert real_distill.best_rate(payload, {3e-5: run(3.95), 3e-4: run(3.85)}) == 3e-4


def test_the_hybrids_weighting_part_builds_only_the_rows_its_results_lack(tmp_path, monkeypatch):
    """real_hybrid --part=weighting keeps every saved row and builds only the cells weighted by direction that are
    not among them (here the −25%-parameter ones), appending each as it is built."""
    import json

    import real_hybrid

    import real_quantization

    monkeypatch.setattr(real_quantization, "RESULTS", str(tmp_path))
    sites = 61
    monkeypatch.setattr(real_hybrid, "real_model_results", lambda: {"base": {"parameters": 134_515_008,
                                                                            "losses": {"val": 3.7, "general": 3.8}}})
    every = real_hybrid.cells(sites)
    assert (333, 61, "unit") in every and (350, 16, "unit") in every
    saved_rows = [{"m": m, "groups": g, **({"weighting": w} if w == "unit" else {}), "losses": {}}
                  for m, g, w in every if m == 432 or w == "raw"]
    out = tmp_path / "real_model_hybrid"
    out.mkdir()
    (out / "results.json").write_text(json.dumps({"rows": saved_rows}))
    built, saves = [], []
    monkeypatch.setattr(real_hybrid, "start", lambda *a: (type("A", (), {"part": "weighting", "reverse": False})(),
                                                          0.0, "src", {}))
    monkeypatch.setattr(real_hybrid, "load_model", lambda src: (type("M", (), {"config": type("C", (), {
        "n_layer": 30})()})(), None))
    monkeypatch.setattr(real_hybrid, "build", lambda src, data, m, g, w, s: built.append((m, g, w)) or {
        "losses": {"val": 4.0, "general": 5.0}, "parameters": 100.9e6, "m": m})
    monkeypatch.setattr(real_hybrid, "save", lambda payload, *a: saves.append(len(payload["rows"])))
    real_hybrid.main()
    assert built == [c for c in every if c[2] == "unit" and c[0] != 432]
    assert saves == [len(saved_rows) + k for k in range(1, len(built) + 1)]


def test_the_tied_heads_missing_part_builds_only_the_cells_its_results_lack(tmp_path, monkeypatch):
    """real_tied_head --part=missing keeps the saved rows and builds, appends and saves only the cells they lack;
    with --reverse it builds them from the end and saves nothing."""
    import json

    import real_tied_head

    import real_quantization

    monkeypatch.setattr(real_quantization, "RESULTS", str(tmp_path))
    cells = real_tied_head.CELLS
    saved_rows = [{"m": m, "options": list(real_tied_head.options(k, more)), "calibration": c,
                   "losses": {"val": 4.0, "general": 5.0}}
                  for m, k, more, c in cells[:-2]]
    assert all(real_tied_head.has_row(saved_rows, spec) for spec in cells[:-2])
    assert not real_tied_head.has_row(saved_rows, cells[-1])
    (tmp_path / "real_model_tied").mkdir()
    (tmp_path / "real_model_tied" / "results.json").write_text(json.dumps({"rows": saved_rows}))
    for reverse in (False, True):
        built, saves = [], []
        args = type("A", (), {"part": "missing", "reverse": reverse})()
        monkeypatch.setattr(real_tied_head, "start", lambda *a, args=args: (args, 0.0, "src", {}))
        monkeypatch.setattr(real_tied_head, "build", lambda src, data, spec, seed=0, built=built: built.append(
            spec if not seed else (spec, seed)) or {
            "losses": {"val": 4.0, "general": 5.0}, "m": spec[0], "options": list(real_tied_head.options(*spec[1:3])),
            "calibration": spec[3]})
        last: dict = {}
        monkeypatch.setattr(real_tied_head, "save", lambda payload, *a, saves=saves, last=last: saves.append(
            payload["rows"][-1].get("tie_keep")) or last.update(payload))
        ported = []
        monkeypatch.setattr(real_tied_head, "self_samples_record", lambda src: {"seconds": 514.0})
        monkeypatch.setattr(real_tied_head, "untied_port", lambda src, data, row, more=(), ported=ported: (
            ported.append((row["options"], more)) or {"of": row["options"], "options": ["--map_file=T.pt", *more]}))
        real_tied_head.main()
        # then the learned recipes' calibration draws (seeds 1, 2: the best −25% row's, the best −50% row's, then
        # the −25% row learned with its gains, the −50% one learned with them), which the results lack
        drawn = [real_tied_head.RECIPE, real_tied_head.HALF_RECIPE, real_tied_head.GAINS_RECIPE,
                 real_tied_head.HALF_GAINS_RECIPE, real_tied_head.WRITERS_RECIPE, real_tied_head.NOVEL_BOUND,
                 real_tied_head.COSINE_RECIPE, real_tied_head.MIX_RECIPE, real_tied_head.LABEL_RECIPE,
                 real_tied_head.LABEL_CONTROL, real_tied_head.HALF_MIX_RECIPE]
        assert real_tied_head.LEARN_LONGER in drawn[1][2] and drawn[1][0] == 288
        assert drawn[2] == cells[22] and real_tied_head.GAINS in drawn[2][2] and drawn[2][0] == real_tied_head.M
        assert drawn[3] == cells[25] and drawn[3][2] == (real_tied_head.LEARN_LONGER, real_tied_head.GAINS)
        assert drawn[3][0] == drawn[1][0]  # paired with the best −50% row's draws: one factor, the gains
        assert drawn[4] == cells[27] and drawn[4][2] == drawn[2][2] + (real_tied_head.WRITERS,)  # one factor more
        assert drawn[5][:3] == drawn[2][:3] and drawn[5][3] == "novel"  # the gains recipe on the novel: its bound
        assert drawn[6] == cells[35] and drawn[6][2] == drawn[2][2] + (real_tied_head.COSINE,)  # one factor more
        assert drawn[7] == (real_tied_head.M, 32, drawn[2][2], "mix")  # the gains recipe on the mix: its draws
        assert drawn[8] == cells[37] and drawn[8][2] == drawn[2][2] + (real_tied_head.LABELS,)  # one factor more
        assert drawn[9] == cells[41] == (576, *drawn[8][1:])  # the labels' same-width control: the width, its seeds
        assert drawn[10] == cells[40] == (*drawn[3][:3], "mix")  # the −50% gains recipe on the mix: its draws
        assert built == (cells[-2:][::-1] + [(spec, seed) for spec in drawn for seed in (2, 1)] if reverse
                         else cells[-2:] + [(spec, seed) for spec in drawn for seed in (1, 2)])
        # the forward run ports every saved learned m = M row with the head untied first, then saves each built row
        learned = [list(real_tied_head.options(k, more)) for m, k, more, c in cells
                   if real_tied_head.LEARN in more and m == real_tied_head.M]
        # not the news-calibrated one, nor one that changes only what follows the map (its T is its learned twin's),
        # nor one with learned gains (they are in its weights, not in T); the recipe's T also with the readers'
        # refit, once
        recipe = list(real_tied_head.options(*real_tied_head.RECIPE[1:3]))
        assert ported == ([] if reverse else [(recipe, (real_tied_head.READERS,))] + [(o, ()) for o in learned[:2]])
        assert len(learned) == 20 and learned[0] == recipe  # (the 32-step rows learn with LEARN_LONGER)
        # 3 ports, 2 cells, the own samples' cost (a row calibrated on them is saved), 11 draws
        assert saves == ([] if reverse else [None, None, None] + [cells[-1][1]] * 14)
        assert ("self_samples" in last) != reverse and last.get("self_samples", {}).get("seconds") in (None, 514.0)


def test_unigram_js_is_scipys_jensen_shannon_in_bits_and_reads_zero_and_one_at_its_ends():
    import numpy as np
    import real_tied_head
    import torch
    from scipy.spatial.distance import jensenshannon

    a = torch.tensor([0, 0, 1, 2, 2, 2, 7])
    b = torch.tensor([1, 1, 2, 3, 3, 9])
    p, q = (np.bincount(x.numpy(), minlength=10) / len(x) for x in (a, b))
    assert real_tied_head.unigram_js_bits(a, b) == pytest.approx(jensenshannon(p, q, base=2) ** 2, abs=1e-12)
    assert real_tied_head.unigram_js_bits(a, b) == pytest.approx(real_tied_head.unigram_js_bits(b, a), abs=1e-15)
    assert real_tied_head.unigram_js_bits(a, a[torch.randperm(len(a))]) == pytest.approx(0.0, abs=1e-15)
    assert real_tied_head.unigram_js_bits(torch.tensor([0, 1]), torch.tensor([2, 3, 3])) == pytest.approx(1.0)


def test_the_tied_heads_distance_part_reads_each_calibration_text_against_each_evaluated_one(tmp_path, monkeypatch):
    """--part=distance: every calibration text's seed-0 calibration tokens against the whole val split of each text
    a loss is measured on; a text read against itself is nearer than one with other tokens; the rows are kept."""
    import json

    import numpy as np
    import real_tied_head

    import real_quantization
    from lgpt.plumbing.dataset import write_split

    rng = np.random.default_rng(0)
    data = {}
    for name, low, high in (("novel", 0, 40), ("shakespeare", 30, 70), ("far", 60, 100)):
        data[name] = str(tmp_path / name)
        os.makedirs(data[name])
        for split in ("train", "val"):
            write_split(rng.integers(low, high, 4000).astype(np.uint16), os.path.join(data[name], f"{split}.bin"))
    monkeypatch.setattr(real_tied_head, "TEXTS", {k: "" for k in data})
    monkeypatch.setattr(real_quantization, "RESULTS", str(tmp_path))
    (tmp_path / "real_model_tied").mkdir()
    (tmp_path / "real_model_tied" / "results.json").write_text(json.dumps({"rows": [{"m": 1}]}))
    args = type("A", (), {"part": "distance", "reverse": False})()
    monkeypatch.setattr(real_tied_head, "start", lambda *a: (args, 0.0, "src", data))
    saved = []
    monkeypatch.setattr(real_tied_head, "save", lambda payload, *a: saved.append(payload))
    real_tied_head.main()
    payload, = saved
    assert payload["rows"] == [{"m": 1}]
    d = payload["text_distance"]
    assert d["calibration_tokens"] == 8 * 16 * real_tied_head.BLOCK and d["seed"] == 0
    general, val = d["losses"]["general"], d["losses"]["val"]
    assert general["text"] == "novel" and val["text"] == "shakespeare" and general["evaluated_tokens"] == 4000
    js = {loss: {t: x["js_bits"] for t, x in d["losses"][loss]["texts"].items()} for loss in ("general", "val")}
    assert js["general"]["novel"] < js["general"]["shakespeare"] < js["general"]["far"] == pytest.approx(1.0)
    assert js["val"]["shakespeare"] < min(js["val"]["novel"], js["val"]["far"])
    assert d["losses"]["general"]["texts"]["far"]["covered"] == 0.0
    assert d["losses"]["general"]["texts"]["novel"]["covered"] == 1.0


def test_the_tied_heads_whole_run_writes_every_part_the_report_reads(monkeypatch):
    """--part=all (scripts/real_tied_head.sh with no arguments) builds every cell and draw and ends with the held-out
    KL, the text distance and both timings, so that a clean reproduction holds every key the report quotes."""
    import real_tied_head

    args = type("A", (), {"part": "all", "reverse": False})()
    monkeypatch.setattr(real_tied_head, "start", lambda *a: (args, 0.0, "src", {"shakespeare": "dir"}))
    monkeypatch.setattr(real_tied_head, "real_model_results", lambda: {"base": {"losses": {}, "parameters": 1}})
    monkeypatch.setattr(real_tied_head, "final_gain", lambda src: {})
    monkeypatch.setattr(real_tied_head, "build", lambda src, data, spec, seed=0: {
        "losses": {"val": 4.0, "general": 5.0}, "m": spec[0], "options": list(real_tied_head.options(*spec[1:3])),
        "calibration": spec[3]})
    monkeypatch.setattr(real_tied_head, "self_samples_record", lambda src: {})
    monkeypatch.setattr(real_tied_head, "untied_ports", lambda *a: None)
    monkeypatch.setattr(real_tied_head, "draws", lambda *a: {})
    monkeypatch.setattr(real_tied_head, "recovered", lambda *a: {})
    monkeypatch.setattr(real_tied_head, "heldout_kl", lambda src, rows, text: {"rows": len(rows), "text": text})
    monkeypatch.setattr(real_tied_head, "text_distance", lambda data: {"losses": {}})
    monkeypatch.setattr(real_tied_head, "recipe_timing", lambda src, data, spec=None: {"spec": spec})
    saved = []
    monkeypatch.setattr(real_tied_head, "save", lambda payload, *a: saved.append(dict(payload)))
    real_tied_head.main()
    last = saved[-1]
    assert len(last["rows"]) == len(real_tied_head.CELLS)
    assert {key for key, _ in real_tied_head.DRAWN} <= set(last)
    assert last["heldout_kl"] == {"rows": len(real_tied_head.CELLS), "text": "dir"} and "text_distance" in last
    assert [last[key]["spec"] for key, _ in real_tied_head.TIMED] == [spec for _, spec in real_tied_head.TIMED]
    assert "gains_recipe_timing" not in saved[-2]  # the timings last, each saved as it ends


def test_the_tied_heads_timing_part_times_the_recipe_on_both_cores(tmp_path, monkeypatch):
    """--part=timing builds the best −25% row and configs/smollm2_shrink_25.py's recipe again with --threads=2 and
    saves each beside the rows, which it keeps; what is saved is not built again."""
    import json

    import real_tied_head

    import real_quantization

    monkeypatch.setattr(real_quantization, "RESULTS", str(tmp_path))
    (tmp_path / "real_model_tied").mkdir()
    (tmp_path / "real_model_tied" / "results.json").write_text(json.dumps({"rows": [{"m": 1}]}))
    args = type("A", (), {"part": "timing", "reverse": False})()
    monkeypatch.setattr(real_tied_head, "start", lambda *a: (args, 0.0, "src", {}))
    calls, saved = [], []
    monkeypatch.setattr(real_tied_head, "cell", lambda src, data, m, kind, **kw: calls.append((m, kw)) or {
        "step": {"seconds": 900.0}})
    results = tmp_path / "real_model_tied" / "results.json"
    monkeypatch.setattr(real_tied_head, "save", lambda payload, *a: saved.append(payload) or results.write_text(
        json.dumps(payload)))
    real_tied_head.main()
    (m, kw), (m2, kw2) = calls  # the best row, then the configs/ recipe (its norm gains learned too)
    assert m == m2 == real_tied_head.M and kw["threads"] == kw2["threads"] == 2 and real_tied_head.LEARN in kw["extra"]
    assert real_tied_head.GAINS not in kw["extra"] and real_tied_head.GAINS in kw2["extra"]
    assert saved[-1]["rows"] == [{"m": 1}] and saved[-1]["recipe_timing"]["threads"] == 2
    assert saved[-1]["gains_recipe_timing"]["of"] == list(real_tied_head.options(*real_tied_head.GAINS_RECIPE[1:3]))
    calls.clear()
    real_tied_head.main()  # both saved: nothing is built again
    assert calls == []


def test_the_tied_heads_heldout_part_measures_each_row_on_seen_and_unseen_text(tmp_path, monkeypatch):
    """--part=heldout loads each HELDOUT row's saved model and measures its KL to the original on calibration batches
    of seed 0 and on val windows with seeds no calibration uses, and saves them beside the rows, which it keeps."""
    import json

    import real_tied_head
    import torch

    import real_quantization

    monkeypatch.setattr(real_quantization, "RESULTS", str(tmp_path))
    rows = [{"m": m, "options": list(real_tied_head.options(k, more)), "calibration": c, "out_dir": f"run{i}",
             "losses": {"val": 4.0 + i / 100, "general": 5.0}}
            for i, (m, k, more, c) in enumerate(real_tied_head.CELLS)]
    (tmp_path / "real_model_tied").mkdir()
    (tmp_path / "real_model_tied" / "results.json").write_text(json.dumps({"rows": rows}))
    args = type("A", (), {"part": "heldout", "reverse": False})()
    monkeypatch.setattr(real_tied_head, "start", lambda *a: (args, 0.0, "src", {"shakespeare": "text"}))
    loader = type("L", (), {"get_batch": lambda self, split, seed: (torch.tensor([[seed, split == "val"]]), None)})()
    monkeypatch.setattr(real_tied_head, "BatchLoader", lambda text, block, batch, device: loader)
    monkeypatch.setattr(real_tied_head, "load_model", lambda path: (type("M", (), {"eval": lambda self: path})(), {}))
    calls = []  # (model, the batches' seeds and splits) per KL; the KL returned is the call's number
    monkeypatch.setattr(real_tied_head, "calibration_kl", lambda original, model, batches: calls.append(
        (model, [(int(b[0, 0]), "val" if b[0, 1] else "train") for b in batches])) or float(len(calls)))
    saved = []
    monkeypatch.setattr(real_tied_head, "save", lambda payload, *a: saved.append(payload))
    real_tied_head.main()
    result = saved[-1]["heldout_kl"]
    assert result["tokens"] == real_tied_head.HELDOUT_BATCHES * 16 * 256 and saved[-1]["rows"] == rows
    indices = [real_tied_head.CELLS.index(spec) for spec in real_tied_head.HELDOUT]
    assert indices == [0, 10, 13, 15, 22, 24]
    n = real_tied_head.HELDOUT_BATCHES
    for i, (index, row) in enumerate(zip(indices, result["rows"])):
        assert calls[2 * i] == (f"run{index}", [(10_000 + k, "train") for k in range(n)])  # seed 0's calibration
        assert calls[2 * i + 1] == (f"run{index}", [(real_tied_head.HELDOUT_SEED + k, "val") for k in range(n)])
        assert (row["calibration"], row["heldout"]) == (2 * i + 1, 2 * i + 2)
        assert row["val"] == rows[index]["losses"]["val"] and row["options"] == rows[index]["options"]


def test_data_free_calibration_text_is_the_models_own_samples_prepared(runs, trained_dir, monkeypatch):
    """real_model's 'samples' text: sample.py --save_to on the model itself, then prepared with its tokenizer like
    every other text (train 80%, test 10%, val 10%), built once."""
    import numpy as np

    import real_model
    from lgpt.plumbing.dataset import load_meta
    monkeypatch.setattr(real_model, "SELF_SAMPLES", ["--num_samples=12", "--batch_size=8", "--max_new_tokens=100",
                                                     "--temperature=1", "--top_k=None", "--device=cpu"])
    data = real_model.prepared(trained_dir, "samples")
    path, result = real_model.self_samples(trained_dir)  # the cached file: not sampled again
    text = open(path).read()
    assert text.count("\n\n") >= 12 and result["sample"]["seconds"] > 0
    ids = [np.fromfile(os.path.join(data, f"{split}.bin"), dtype=np.uint16) for split in ("train", "test", "val")]
    assert sum(len(x) for x in ids) == len(text)  # a char model: a token per character, in three splits
    assert load_meta(data)["vocab_size"] > 0
    assert len([d for d in os.listdir(runs) if d.startswith("samples-") and not d.endswith(".lock")]) == 1


def test_interleaved_gives_each_text_an_equal_share_in_line_pieces():
    """real_model.interleaved: each text's first ``chars`` characters, in order and whole; every prefix of the result
    holds as much of each text, to within a piece; pieces end at line breaks where they can (a text's last piece
    ends at ``chars``)."""
    import real_model
    texts = ["".join(f"{c * (3 + k % 5)}\n" for k in range(200)) for c in "abc"]  # lines of 4 to 8 characters
    out = real_model.interleaved(texts, 500, 60)
    assert len(out) == 1500
    for c, text in zip("abc", texts):
        assert out.count(c) == text[:500].count(c)
    for prefix in range(0, 1500, 97):
        shares = [out[:prefix].count(c) for c in "abc"]
        assert max(shares) - min(shares) <= 60
    lines = out.split("\n")  # no piece joins two texts inside a line, but where a text's last piece ends at chars
    assert sum(len(set(line)) > 1 for line in lines) <= len(texts) - 1
    with pytest.raises(ValueError, match="500"):
        real_model.interleaved(["short", *texts[1:]], 500, 60)


def test_the_calibration_mix_is_built_once_from_its_texts(runs, trained_dir, monkeypatch):
    """real_model's 'mix' text: the MIX texts interleaved (here tinyshakespeare and the model's own samples: a char
    model reads no news), cached, then prepared like every other text."""
    import numpy as np

    import real_model
    monkeypatch.setattr(real_model, "SELF_SAMPLES", ["--num_samples=12", "--batch_size=8", "--max_new_tokens=100",
                                                     "--temperature=1", "--top_k=None", "--device=cpu"])
    monkeypatch.setattr(real_model, "MIX", ("shakespeare", "samples"))
    monkeypatch.setattr(real_model, "MIX_CHARS", 1000)
    monkeypatch.setattr(real_model, "MIX_CHUNK", 200)
    samples = open(real_model.self_samples(trained_dir)[0]).read()
    corpus = "".join(reversed(samples))  # in the toy model's vocabulary (it saw a slice of tinyshakespeare)
    monkeypatch.setattr(real_model, "read_shakespeare", lambda: corpus)
    path = real_model.source_file(trained_dir, "mix")
    text = open(path).read()
    assert text == real_model.interleaved([corpus, samples], 1000, 200)
    assert real_model.source_file(trained_dir, "mix") == path  # cached: one mix directory
    assert len([d for d in os.listdir(runs) if d.startswith("mix-") and not d.endswith(".lock")]) == 1
    data = real_model.prepared(trained_dir, "mix")
    ids = [np.fromfile(os.path.join(data, f"{split}.bin"), dtype=np.uint16) for split in ("train", "test", "val")]
    assert sum(len(x) for x in ids) == len(text) == 2000


def test_js_rows_is_scipys_jensen_shannon_in_bits_per_row():
    import numpy as np
    from scipy.spatial.distance import jensenshannon

    import real_model
    rows = np.array([[3.0, 0.0, 1.0, 0.0], [0.0, 2.0, 2.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    target = np.array([1.0, 1.0, 0.0, 2.0])
    want = [jensenshannon(r / r.sum(), target / target.sum(), base=2) ** 2 for r in rows]
    assert real_model.js_rows(rows, target) == pytest.approx(want, abs=1e-12)
    assert real_model.js_rows(target[None], target) == pytest.approx([0.0], abs=1e-15)
    assert real_model.js_rows(np.array([[1.0, 0.0, 0.0, 0.0]]), np.array([0.0, 1.0, 0.0, 0.0])) == pytest.approx([1.0])


def test_line_pieces_cut_a_texts_start_at_line_breaks():
    import real_model
    text = "".join(f"{'x' * (3 + k % 7)}\n" for k in range(300))
    pieces = real_model.line_pieces(text, 1000, 60)
    assert "".join(pieces) == text[:1000] and all(p.endswith("\n") for p in pieces[:-1])
    assert max(map(len, pieces)) <= 60 and min(map(len, pieces[:-1])) >= 30
    assert "".join(real_model.line_pieces(text, 10 ** 6, 60)) == text  # a shorter text: all of it


def test_nearest_pieces_choose_the_pool_greedily_toward_the_targets_words():
    """real_model.nearest_pieces: each step adds the piece that brings the chosen words nearest the target's, so the
    pieces like the target come first, the unlike ones only when the like ones run out; the record says how much
    each source gave and the choice's word JS."""
    import real_model
    like = "".join(f"the cat sat on the mat {k}\n" for k in range(60))
    mixed = "".join(f"the dog ran {k}\nbonds yields markets rallied\n" for k in range(60))
    unlike = "".join(f"bonds yields markets rallied {k}\n" for k in range(60))
    target = "the cat sat on the mat\n" * 20 + "the dog ran\n" * 5
    text, record = real_model.nearest_pieces({"unlike": unlike, "like": like, "mixed": mixed}, target, 800, 100)
    assert len(text) >= 800 and record["shares"]["unlike"] == 0 and record["shares"]["like"] > 0
    first = real_model.line_pieces(like, len(like), 100)[0]
    assert text.startswith(first)  # the nearest piece alone comes first
    assert sum(record["shares"].values()) == len(text)
    whole, everything = real_model.nearest_pieces({"unlike": unlike, "like": like}, target, 10 ** 6, 100)
    assert everything["shares"] == {"unlike": len(unlike), "like": len(like)} and len(whole) == len(unlike + like)
    assert 0 < record["word_js"] < everything["word_js"]


def test_the_nearest_calibration_text_is_selected_once_from_its_pool(runs, trained_dir, monkeypatch):
    """real_model's 'nearest' text: the pool's first NEAREST_POOL_CHARS of each text chosen toward the target's
    first NEAREST_TARGET_CHARS (never past them), cached once."""
    import real_model
    sources = {"shakespeare": "".join(f"to be or not {k}\n" for k in range(400)),
               "news": "".join(f"markets rallied today {k}\n" for k in range(400)),
               "novel": "to be a cat\n" * 50 + "markets rallied\n" * 1000}
    monkeypatch.setattr(real_model, "NEAREST_POOL", ("shakespeare", "news"))
    monkeypatch.setattr(real_model, "NEAREST_POOL_CHARS", 3000)
    monkeypatch.setattr(real_model, "NEAREST_TARGET_CHARS", 600)  # the novel's start only: its markets never read
    monkeypatch.setattr(real_model, "NEAREST_CHARS", 1000)
    monkeypatch.setattr(real_model, "MIX_CHUNK", 200)
    monkeypatch.setattr(real_model, "read_text", lambda model_dir, name: sources[name])
    path = real_model.source_file(trained_dir, "nearest")
    pool = {k: sources[k][:3000] for k in ("shakespeare", "news")}
    assert open(path).read() == real_model.nearest_pieces(pool, sources["novel"][:600], 1000, 200)[0]
    assert open(path).read().startswith("to be or not 0\n")
    assert real_model.source_file(trained_dir, "nearest") == path  # cached: one directory
    assert len([d for d in os.listdir(runs) if d.startswith("nearest-") and not d.endswith(".lock")]) == 1


def test_the_mix_part_distils_the_mix_calibrated_map_on_the_mix_against_its_own_control(monkeypatch):
    """real_distill --part=mix: real_tied_head.MIX_RECIPE's model distilled on the mix with the best recipe, then the
    original distilled from itself on the mix; saved as "mix_case" with the start's losses and options; --reverse
    builds the control only and saves nothing."""
    import real_distill

    calls, saves = [], []
    monkeypatch.setattr(real_distill, "build", lambda src, data, spec: calls.append(("build", spec)) or {
        "out_dir": "start", "losses": {"val": 4.15, "general": 4.48}})
    monkeypatch.setattr(real_distill, "arm", lambda data, start, lr, name="", batch=8, text="shakespeare": calls.append(
        ("arm", start["out_dir"], lr, name, batch, text)) or {"losses": {"val": 4.0, "general": 4.2}})
    monkeypatch.setattr(real_distill, "control", lambda src, data, lr, batch=8, text="shakespeare": calls.append(
        ("control", lr, batch, text)) or {"losses": {"val": 3.7584, "general": 3.7886}, "out_dir": "ctrl"})
    monkeypatch.setattr(real_distill, "unchanged", lambda a, b: True)
    monkeypatch.setattr(real_distill, "parameters", lambda out: 100.9e6)
    monkeypatch.setattr(real_distill, "BatchLoader", lambda *a: type("L", (), {"tokens": lambda self, s: [0] * 900})())
    monkeypatch.setattr(real_distill, "save", lambda payload, *a: saves.append(json_copy(payload)))
    payload = {"chosen_lr": 1e-4, "batches": {"chosen": 1}}
    real_distill.mix_case("src", {"mix": "d"}, payload, 0.0, reverse=True)
    assert calls == [("control", 1e-4, 1, "mix")] and not saves
    calls.clear()
    real_distill.mix_case("src", {"mix": "d"}, payload, 0.0, reverse=False)
    assert calls == [("build", real_distill.MIX_RECIPE), ("arm", "start", 1e-4, "-learned-gains-mix", 1, "mix"),
                     ("control", 1e-4, 1, "mix")]
    case = saves[-1]["mix_case"]
    assert len(saves) == 2 and "control" not in saves[0]["mix_case"] and case["control"]["unchanged"]
    assert case["text"] == "mix" and case["train_tokens"] == 900 and case["batch"] == 1
    assert case["start"]["options"] == list(real_distill.MIX_RECIPE[2]) == ["--learn_steps=16", "--learn_gain_lr=1e-2"]
    assert case["recipe"] == real_distill.recipe(1e-4, batch=1)


def test_a_steps_extra_environment_is_its_own(tmp_path):
    """real_model.run_step(args, extra_env): the child sees the settings, this process does not keep them (the
    Gemma distillation's malloc settings once leaked into every later step of the same run)."""
    from real_model import run_step
    seen = tmp_path / "seen"
    run_step(["-c", "import os, sys; open(sys.argv[1], 'w').write(os.environ.get('NANOLGPT_TEST_SETTING', '-'))",
              str(seen)], {"NANOLGPT_TEST_SETTING": "child"})
    assert seen.read_text() == "child" and "NANOLGPT_TEST_SETTING" not in os.environ
