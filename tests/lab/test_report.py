"""report.py keeps results/*/table.md, bench/results/table.md and results/README.md equal to the JSON, the numbers
quoted in the docs equal to results/, and draws every verdict from one rule."""
import json
import math
import os
import shutil
import statistics
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import report_stats  # noqa: E402

import report  # noqa: E402


def committed(path: str) -> str:
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


@pytest.fixture(scope="module")
def generated():
    return report.generated()


def test_every_generated_table_and_the_index_equal_what_results_give(generated):
    files, problems = generated
    assert not problems, problems
    for name in report.experiments():  # a table for every results dir, the same numbers regenerated
        assert f"results/{name}/table.md" in files, name
    assert {"results/README.md", "bench/results/table.md"} <= set(files)
    for path, text in files.items():
        assert committed(path) == text, f"{path} differs: run python scripts/report.py"


def test_a_table_holds_the_numbers_of_its_results(generated):
    files, _ = generated
    r = report.load("heatmaps")
    for label, run in r["runs"].items():
        assert f"| {label} | {run['zero_shot']:.4f} | {run['ae_model']:.4f} | {run['hc_model']:.4f} |" in \
            files["results/heatmaps/table.md"]
    tied = report.load("real_model_tied")
    vals = [x["val"] for x in tied["gains_draws"]["learned"]]
    assert f"{statistics.fmean(vals):.4f} ± {statistics.stdev(vals):.4f}" in files["results/real_model_tied/table.md"]


def test_the_index_lists_every_experiment_and_embeds_the_headline_render_gives(generated):
    files, _ = generated
    index = files["results/README.md"]
    for name in report.experiments():
        assert f"[table.md]({name}/table.md)" in index
    headline = report.render("headline")
    assert f"<!-- BEGIN headline -->\n{headline}\n<!-- END headline -->" in index
    assert "SliceGPT's own code at same width (m = 432)" in report.render("dev_headline") and "Holm" in headline
    with pytest.raises(KeyError):
        report.render("no_such_block")


def test_the_dev_headline_gives_n_and_the_spread_where_n_is_two_or_more():
    rows, tests = report.headline_rows()
    learned = next(x for x in rows if x["name"].startswith("learned map") and x["m"] == 432)
    assert len(learned["val"]) == 3
    line = next(line for line in report.dev_headline().splitlines() if line.startswith(f"| {learned['name']} |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3] == f"{statistics.fmean(learned['val']):.4f} ± {statistics.stdev(learned['val']):.4f}"
    assert cells[7] == "3"
    original = next(line for line in report.dev_headline().splitlines() if line.startswith("| original"))
    assert "±" not in original  # n = 1: no spread
    slicegpt = [v for name, v in tests if "SliceGPT" in name]
    assert slicegpt and all(v["word"] == "not tested" and v["p"] is None for v in slicegpt)


# ----------------------------------------------------------------------------------------------
# The one rule

def test_verdict_agrees_with_scipy_welch_and_paired():
    from scipy import stats
    a, b = [2.03, 2.05, 2.02, 2.06], [2.00, 2.04, 1.99, 2.01]
    v = report.verdict(a, b, paired=True)
    assert v["test"] == "paired t" and math.isclose(v["p"], stats.ttest_rel(a, b).pvalue, rel_tol=1e-12)
    assert math.isclose(v["sd"], statistics.stdev(x - y for x, y in zip(a, b)))
    assert math.isclose(v["delta"], statistics.fmean(a) - statistics.fmean(b)) and v["n"] == (4, 4)
    w = report.verdict(a, b + [2.02])
    assert w["test"] == "Welch t"
    assert math.isclose(w["p"], stats.ttest_ind(a, b + [2.02], equal_var=False).pvalue, rel_tol=1e-12)
    assert w["word"] == ("higher" if w["p"] < 0.05 else "no difference")


def test_a_control_that_is_exact_is_tested_one_sample_not_as_borrowed_pairs():
    """Distillation's control stays the original bit for bit: one value, not a sample. The arms are tested against
    it by a one-sample t (scipy's), not by pairing copies of it; one arm alone is not tested."""
    from scipy import stats
    a = [3.9275, 3.9180, 3.9366]
    v = report.verdict_against_exact(a, 3.7584)
    assert v["test"].startswith("one-sample t") and v["n"] == (3, 1) and v["word"] == "higher"
    assert math.isclose(v["p"], stats.ttest_1samp(a, 3.7584).pvalue, rel_tol=1e-12)
    assert report.verdict_against_exact([3.9], 3.7584)["word"] == "not tested"


@pytest.mark.parametrize("a, b, paired, word", [
    ([1.0, 1.1, 1.2], [2.0, 2.1, 2.2], True, "lower"),  # a constant paired shift
    ([2.0, 2.1, 2.3], [1.0, 1.1, 1.2], False, "higher"),
    ([1.0, 1.5, 0.5], [1.1, 0.6, 1.4], True, "no difference"),
    ([1.0, 1.0, 1.0], [1.0, 1.0, 1.0], True, "no difference"),
    ([1.0], [2.0], False, "not tested"),  # n = 1 on either side: no borrowed spread
    ([1.0, 1.2, 1.1], [2.0], False, "not tested"),
])
def test_the_rules_words(a, b, paired, word):
    v = report.verdict(a, b, paired)
    assert v["word"] == word
    assert (v["p"] is None) == (word == "not tested")


def naive_holm(ps: list[float], alpha: float = 0.05) -> list[bool]:
    """Holm's procedure as the textbook states it: reject in order of p while p_(k) ≤ α / (m − k + 1)."""
    order, rejected = sorted(range(len(ps)), key=lambda i: ps[i]), [False] * len(ps)
    for k, i in enumerate(order):
        if ps[i] > alpha / (len(ps) - k):
            break
        rejected[i] = True
    return rejected


@pytest.mark.parametrize("ps", [[0.01, 0.04, 0.03, 0.005], [0.2, 0.001, 0.0125, 0.013], [0.04], [0.5, 0.5, 0.01]])
def test_holm_agrees_with_the_naive_procedure(ps):
    adjusted = report.holm(ps)
    assert [p <= 0.05 for p in adjusted] == naive_holm(ps)
    assert all(a >= p for a, p in zip(adjusted, ps)) and max(adjusted) <= 1


def test_adjust_applies_holm_across_the_tested_verdicts_only():
    vs = [report.verdict([1.0, 1.1, 1.3], [2.0, 2.1, 2.2], True), report.verdict([1.0], [2.0]),
          report.verdict([1.0, 1.2, 1.1, 1.3], [1.05, 1.15, 1.1, 1.2], False)]
    report.adjust(vs)
    assert "p_holm" not in vs[1] and vs[1]["word"] == "not tested"
    assert [vs[0]["p_holm"], vs[2]["p_holm"]] == report.holm([vs[0]["p"], vs[2]["p"]])


# ----------------------------------------------------------------------------------------------
# Quoted numbers

@pytest.mark.parametrize("expression, expected", [
    ("=ppl_vs_width/reference_val_loss|.4f", "1.8813"),
    ("=ppl_vs_width/rows[kind=pca,porting=residual,ratio=0.75]/zero_shot/mean~reference_val_loss|+.1%", "+0.6%"),
    ("=ppl_vs_width/rows[kind=orthogonal,porting=residual,ratio=1.0+1.5+2.0]/zero_shot/mean|range.3f", "1.881"),
    ("=shrink_quality/rows[kind=pca,ratio=0.5,correction=learned_T_all]/zero_shot/mean|.3f", "1.892"),
    ("=heads/rows[head=linear,norm_reg=0.1]/hidden_norm_mean/1:5|range.2f", "0.58–0.66"),
    ("=quantization/rows/*/fp32/mean|range.4f", "1.8813"),
])
def test_path_quotes_read_results_as_a_naive_lookup_does(expression, expected):
    assert report.quote(expression) == expected


def test_named_quotes_give_numbers():
    for name in report.QUOTES:  # a number, or an aim's verdict word
        said = report.quote(name)
        assert any(ch.isdigit() for ch in said) or said in ("meets the aim", "misses the aim", "undecided",
                                                            "not tested", "not tested (no spread)"), name
    assert report.quote("recipe@0.5") == report.quote(
        "=shrink_quality/rows[kind=pca,ratio=0.5,correction=learned_T_all]/zero_shot/mean~reference_val_loss|+.2%")


DOC = ("# Title\n\n## What we found\n\nThe shrink costs <!-- q recipe@0.5 -->{}<!-- /q --> and the original scores "
       "<!-- q =ppl_vs_width/reference_val_loss|.4f -->1.8813<!-- /q -->.\n")


def test_a_drifted_quote_an_unknown_one_and_a_failing_path_are_named_with_doc_and_section():
    good = DOC.format(report.quote("recipe@0.5"))
    assert report.fill("README.md", good) == (good, [])
    text, problems = report.fill("docs/guide.md", DOC.format("+0.45%"))
    assert text == good
    assert problems == [f"docs/guide.md: What we found: quote 'recipe@0.5' says '+0.45%', results/ give "
                        f"{report.quote('recipe@0.5')!r}"]
    _, problems = report.fill("README.md", good + "<!-- q no_such -->1<!-- /q -->")
    assert len(problems) == 1 and "README.md: What we found: unknown quote 'no_such'" in problems[0]
    _, problems = report.fill("README.md", "<!-- q =heads/rows[kind=no such]/x|.3f -->1<!-- /q -->")
    assert len(problems) == 1 and problems[0].startswith("README.md: (top): quote '=heads/")


def test_a_generated_block_in_a_doc_is_refilled_and_checked():
    stale = "## Headline\n\n<!-- BEGIN headline -->\nold\n<!-- END headline -->\n"
    text, problems = report.fill("README.md", stale)
    block = report.rebase_links(report.render("headline"), "results")  # written for results/: links rebased
    assert text == f"## Headline\n\n<!-- BEGIN headline -->\n{block}\n<!-- END headline -->\n"
    assert problems == ["README.md: Headline: the headline block differs from results/"]
    assert report.fill("README.md", text) == (text, [])


# ----------------------------------------------------------------------------------------------
# The command, on a copy of the repository

@pytest.fixture
def repo(tmp_path):
    """A copy of what report.py reads: itself and its modules, results/ and bench/results/, a small README."""
    copy = tmp_path / "repo"
    (copy / "scripts").mkdir(parents=True)
    for name in ("report.py", "report_stats.py", "report_serving.py", "report_gemma3.py"):  # report.py and its rooms
        shutil.copy(os.path.join(ROOT, "scripts", name), copy / "scripts" / name)
    shutil.copytree(os.path.join(ROOT, "results"), copy / "results")
    shutil.copytree(os.path.join(ROOT, "bench", "results"), copy / "bench" / "results")
    (copy / "README.md").write_text(DOC.format(report.quote("recipe@0.5")))
    return copy


def check(copy) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(copy / "scripts" / "report.py"), "--check"], capture_output=True,
                          text=True, timeout=300, cwd=copy)


def test_check_passes_then_names_a_drifted_quote_and_an_edited_table(repo):
    done = check(repo)
    assert done.returncode == 0, done.stderr
    (repo / "README.md").write_text(DOC.format("+0.45%"))
    table = repo / "results" / "shrink_quality" / "table.md"
    table.write_text(table.read_text().replace("1.890", "1.891", 1))
    done = check(repo)
    assert done.returncode == 1
    assert "README.md: What we found: quote 'recipe@0.5' says '+0.45%'" in done.stderr
    assert "results/shrink_quality/table.md: differs from what the results give" in done.stderr


@pytest.mark.parametrize("damage, field", [
    (lambda r: r["runs"][next(iter(r["runs"]))].update(zero_shot="oops"), "runs/{label}/zero_shot"),
    (lambda r: r["runs"][next(iter(r["runs"]))].pop("ae_model"), "runs/{label}/ae_model"),
    (lambda r: r["runs"][next(iter(r["runs"]))].update(hc_model=None), "runs/{label}/hc_model"),
])
def test_a_damaged_value_is_named_in_one_line_with_its_file_and_field(repo, damage, field):
    path = repo / "results" / "heatmaps" / "results.json"
    r = json.loads(path.read_text())
    damage(r)
    path.write_text(json.dumps(r))
    done = check(repo)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    label = next(iter(r["runs"]))
    lines = [line for line in done.stderr.splitlines() if line.startswith("results/heatmaps/results.json:")]
    assert len(lines) == 1 and f"field '{field.format(label=label)}'" in lines[0], done.stderr


@pytest.mark.parametrize("content", ["", "{\"rows\": [", "[1, 2]"])
def test_a_results_file_that_is_not_a_record_is_one_line(repo, content):
    (repo / "results" / "heads" / "results.json").write_text(content)
    done = check(repo)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert sum(line.startswith("results/heads/results.json:") for line in done.stderr.splitlines()) == 1


@pytest.mark.parametrize("where, damage", [
    ("bench/results/transform_speed.json", lambda p: p.write_text("[]")),  # once dropped its table with exit 0
    ("results/heads/results.json", lambda p: p.write_text("[" * 100_000 + "]" * 100_000)),  # once RecursionError
    ("results/heads/results.json", lambda p: (p.unlink(), p.mkdir())),  # once IsADirectoryError
])
def test_damaged_results_and_benchmarks_are_named_in_one_line(repo, where, damage):
    damage(repo / where)
    done = check(repo)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert any(line.startswith(f"{where}:") for line in done.stderr.splitlines()), done.stderr[-2000:]


def test_a_missing_results_file_is_named(repo):
    os.remove(repo / "results" / "quantization" / "results.json")
    done = check(repo)
    assert done.returncode == 1 and "results/quantization/results.json: missing" in done.stderr


def fake_protocol() -> dict:
    """A results/protocol payload with known numbers: original loss 4 on every text's test windows."""
    def losses(scale: float, windows=(3.9, 4.0, 4.1, 4.0)) -> dict:
        each = [w * scale for w in windows]
        split = {"loss": statistics.fmean(each), "se": statistics.stdev(each) / 2, "windows": 4, "each": each}
        return {t: {"test": split, **({"dev": split} if t == "shakespeare" else {})}
                for t in ("shakespeare", "novel", "news", "wiki")}

    def row(recipe, seed, scale):
        return {"recipe": recipe, "seed": seed, "parameters": 100e6, "trained": "training-free",
                "token_passes": "32,768", "core_seconds": 250.0 + seed, "cost_measured": "cpu" if seed else "wall",
                "losses": losses(scale), **({"calibration_seeds": "seed * 100000 + k"} if seed else {})}

    return {"splits": "train 80 / test 10 / dev 10", "block": 256, "original": {"parameters": 134e6,
                                                                               "losses": losses(1.0)},
            "configurations_tried": {"transform": 113, "distillation": 24},
            "test_reads": {t: {"reads": 5, "recipes": ["a", "b"]} for t in ("shakespeare", "novel", "news", "wiki")},
            "plan_changes": ["a draw dropped"],
            "rows": [row("free25", 0, 1.020), row("free25", 1, 1.021), row("free25", 2, 1.019),
                     row("free50", 0, 1.20), row("learned25", 0, 1.01), row("distill25", 0, 1.005)],
            "loto": [dict(row("free25-loto", 0, 1.05 + 0.01 * i), held_out=t)
                     for i, t in enumerate(("shakespeare", "novel", "news", "wiki"))]}


def test_the_protocol_table_tests_aims_by_the_one_rule_and_never_an_n_of_one():
    r = fake_protocol()
    tests = dict(report.protocol_tests(r))
    free25 = tests["free25: Shakespeare test gap ≤ +3%"]
    assert free25["n"] == (3, 1) and free25["delta"] == pytest.approx(2.0 - 3.0)  # mean gap +2.0% against +3%
    assert free25["p"] is not None and report.aim_word(free25) == "meets the aim"
    from scipy import stats  # the error holds the draws' spread and the test windows' sampling error
    window = report.window_gap_se(r, r["rows"][0], "shakespeare")
    # 4 windows: ⌊√4⌋ = 2 blocks of 2 (batch means), window means 3.95 and 4.05 of the original's 4.0
    assert window == pytest.approx(100 * 0.02 * statistics.stdev([3.95, 4.05]) / math.sqrt(2) / 4)
    draws = statistics.stdev([2.0, 2.1, 1.9]) ** 2 / 3
    error = math.sqrt(draws + window ** 2)  # Welch–Satterthwaite's df over the draws' 2 and the blocks' 1
    df = (draws + window ** 2) ** 2 / (draws ** 2 / 2 + window ** 4 / 1)
    assert free25["p"] == pytest.approx(2 * stats.t.sf(1.0 / error, df), rel=1e-6)
    wide = report.aim_verdict([2.0, 2.1, 1.9], 3.0, window_se=5.0, windows=4)  # a noisy test set: undecided
    assert report.aim_word(wide) == "undecided"
    assert tests["free50: Shakespeare test gap ≤ +12%"]["word"] == "not tested"  # n = 1
    assert tests["learned25 vs distill25, Shakespeare test loss"]["word"] == "not tested"
    loto = tests["free25, leave one text out: mean test gap over 4 held-out texts ≤ +10%"]
    assert loto["delta"] == pytest.approx(6.5 - 10) and report.aim_word(loto) == "meets the aim"
    tested = [v for v in tests.values() if v["p"] is not None]
    assert all(v["p_holm"] >= v["p"] for v in tested) and len(tested) == 2
    text = report.protocol(r)
    assert "| tied PCA, training-free | −25% | 100.0 M |" in text
    assert "| +2.0% ± 0.1 |" in text and "| +20.0% |" in text  # gaps to one decimal, sd over draws (n > 1)
    d, se = report.paired_windows(r, r["rows"][4], r["rows"][5], "shakespeare")
    assert d == pytest.approx(0.005 * 4.0)
    assert se == pytest.approx(0.005 * statistics.stdev([3.95, 4.05]) / math.sqrt(2))  # 2 blocks of 2 windows
    assert "113 transform configurations" in text and "shakespeare 5 reads by 2 recipes" in text
    r["rows"][1]["core_seconds"] = r["rows"][2]["core_seconds"] = 1801.0  # the median draw over 30 core-minutes
    slow = dict(report.protocol_tests(r))["free25: Shakespeare test gap ≤ +3%"]
    assert slow["within_time"] is False and report.aim_word(slow) == \
        "misses the aim (gap meets the aim; cost: over 30 core-min)"
    assert "Changed after a test read: a draw dropped." in text


def test_superseded_draws_are_shown_beside_their_replacement_and_kept_out_of_every_statistic():
    r = fake_protocol()
    before = dict(report.protocol_tests(r))
    r["rows"][1]["out_dir"] = "runs/new-s1"
    old = dict(r["rows"][1], out_dir="runs/old-s1", superseded_by="runs/new-s1")
    old["losses"] = fake_protocol()["rows"][3]["losses"]  # +20%: it would move the mean if it counted
    r["superseded_rows"] = [old]
    after = dict(report.protocol_tests(r))
    assert {k: v["delta"] for k, v in after.items()} == {k: v["delta"] for k, v in before.items()}
    text = report.protocol(r)
    assert "| free25 | 1 | 4.8000 | +20.00% | 4.0840 | +2.10% |" in text
    assert report.superseded_lines(fake_protocol()) == []


def test_a_gap_is_measured_against_the_original_on_the_same_test_split():
    r = fake_protocol()
    assert report.test_gap(r, r["rows"][3], "wiki") == pytest.approx(20.0)
    r["rows"][3]["losses"]["wiki"] = {"dev": r["rows"][3]["losses"]["wiki"]["test"]}  # no test read: named
    with pytest.raises(KeyError):
        report.test_gap(r, r["rows"][3], "wiki")


def test_identical_draws_are_not_tested_and_unequal_windows_are_named():
    v = report.aim_verdict([1.0, 1.0, 1.0], 3.0)
    assert v["p"] is None and v["word"] == "not tested (no spread)"
    r = fake_protocol()
    r["rows"][5]["losses"]["shakespeare"]["test"]["each"] = [4.0, 4.0, 4.0]
    with pytest.raises(report.ResultsError, match="hold 4 and 3 test windows of shakespeare"):
        report.paired_windows(r, r["rows"][4], r["rows"][5], "shakespeare")


def test_the_headline_is_the_protocols_test_table_and_the_dev_table_stays_beside_it(monkeypatch):
    r, load = fake_protocol(), report.load
    monkeypatch.setattr(report, "load", lambda name: r if name == "protocol" else load(name))
    headline = report.headline()
    # the median of 250 (wall), 251 and 252 (CPU time); the wall time named
    assert ("| tied PCA, training-free, −25% | training-free | 100.0 M | 251 (cpu, wall) | 32,768 | 3 | "
            "4.0800 ± 0.0040 |" in headline)
    assert "≤ +3%: meets the aim" in headline and "≤ +12%: not tested" in headline
    assert "mean test gap +6.5% ± 1.3 over 4 held-out texts" in headline
    index = report.index()
    assert "## Dev numbers: where the recipes were chosen" in index and "these are dev numbers" in index


def test_an_aims_gap_verdict_is_quoted_on_the_draws_df_and_across_block_sizes(monkeypatch):
    r, load = fake_protocol(), report.load
    monkeypatch.setattr(report, "load", lambda name: r if name == "protocol" else load(name))
    with report_stats.rule_variant("draws_df"):
        v = dict(report.protocol_tests(r))["free25: Shakespeare test gap ≤ +3%"]
    assert report.QUOTES["protocol.gapdf@free25"]() == f"meets the aim (p {v['p']:.2g}, Holm {v['p_holm']:.2g})"
    assert report.QUOTES["protocol.gapdf@free50"]() == "not tested"  # n = 1
    words = report.QUOTES["protocol.gaprobust@free25"]()
    assert words.startswith("meets the aim at every block size tried (⌊√n⌋ and 4,") or words.count(" at ") == len(
        report.SENSITIVITY_BLOCKS)  # one verdict per block size where they differ
    assert report.QUOTES["protocol.gaprobust@free50"]().startswith("not tested at every block size tried")


def test_a_gap_quote_gives_the_mean_and_spread_of_the_draws_gaps():
    tied = report.load("real_model_tied")
    gaps = [x["val"] / tied["base"]["losses"]["val"] - 1 for x in tied["gains_draws"]["learned"]]
    assert report.quote("=real_model_tied/gains_draws/learned/*/val~base/losses/val|gap1") == (
        f"{100 * statistics.fmean(gaps):+.1f}% ± {100 * statistics.stdev(gaps):.1f}")
    assert report.quote("=real_model_tied/rows/0/losses/val~base/losses/val|gap2") == (
        f"{100 * (tied['rows'][0]['losses']['val'] / tied['base']['losses']['val'] - 1):+.2f}%")


def test_a_quote_or_block_missing_its_close_is_named_and_no_text_is_lost():
    q = "<!-- q =real_model_tied/base/losses/val|.4f -->"
    text = f"# Doc\n\nFirst {q}3.7584 and prose that must stay, then {q}3.7584<!-- /q --> end.\n"
    filled, problems = report.fill("docs/x.md", text)
    assert filled == text and any("malformed quote" in p and "has no '<!-- /q -->'" in p for p in problems)
    _, problems = report.fill("docs/x.md", "<!-- BEGIN headline -->\nold\n")
    assert any("malformed block 'headline'" in p for p in problems)


def test_the_gemma3_table_sets_each_rebuilt_arm_beside_its_superseded_fit_by_the_one_rule(tmp_path):
    """report_gemma3: an arm the old length fit built is shown beside the same arm rebuilt, the dev difference
    paired over the same windows with Holm's correction (a t-test on blocks of windows here), and the figure is
    drawn."""
    from report_gemma3 import gemma3_figure, real_gemma3
    windows_old, windows_new = [9.0, 9.5, 8.7, 9.9], [5.1, 5.3, 5.0, 5.6]
    arm = {"size": "-25%", "m": 480, "parameters": 201_000_000, "se": 0.1, "step": {"cpu_seconds": 200}}
    r = {"model": "g", "d": 640, "dev_windows": 4, "block": 256, "exact_windows": 2, "split": "dev",
         "log_vocabulary": 12.48,
         "original": {"parameters": 268_000_000, "dev": 5.0, "se": 0.1, "windows": [5.0, 5.1, 4.9, 5.0]},
         "shrink": {"free-25%-carry": dict(arm, output_gains="carry", length_fit="isotropic-relative",
                                           dev=statistics.fmean(windows_new), windows=windows_new)},
         "superseded": {"shrink": {"free-25%-carry": dict(arm, output_gains="carry", length_fit="absolute",
                                                          dev=statistics.fmean(windows_old), windows=windows_old)}}}
    text = real_gemma3(r)
    diffs = [a - b for a, b in zip(windows_new, windows_old)]
    from scipy import stats  # 4 windows: 2 blocks of 2 (batch means), a t-test on 1 degree of freedom
    blocks = [statistics.fmean(diffs[:2]), statistics.fmean(diffs[2:])]
    t = statistics.fmean(diffs) / (statistics.stdev(blocks) / math.sqrt(2))
    row = next(line for line in text.splitlines() if line.startswith("| shrink: free-25%-carry"))
    assert f"{statistics.fmean(diffs):+.4f}" in row and f"{2 * stats.t.sf(abs(t), 1):.2g}" in row
    assert "isotropic-relative" in text and "| old fit | present fit |" in text
    os.makedirs(tmp_path / "real_gemma3")
    assert os.path.exists(gemma3_figure(r, str(tmp_path)))


def test_the_equal_rates_table_tests_each_difference_by_the_one_rule_with_holm():
    """shrink_vs_scratch_rates: the shrink is paired with its original (same seed), scratch is not (Welch), Holm
    across the three, and a chosen rate at the sweep's end is named as such."""
    from scipy import stats
    sweep = [{"lr_factor": f, "dev": 1.9 - 0.01 * f} for f in (1.0, 2.0, 4.0)]

    def spread(values):
        return dict(report.mean_spread_of(values), values=values)

    def side(values, **more):
        return dict({"test": spread(values), "dev": spread(values)}, **more)

    original, shrink, scratch = [1.80, 1.82, 1.81], [1.86, 1.89, 1.87], [1.78, 1.79, 1.785]
    r = {"data": "char", "d": 128, "m": 96, "recipe": "learned T + all", "base_iters": 2000, "scratch_iters": 2667,
         "seeds": [0, 1, 2],
         "original": side(original, sweep=sweep, chosen_lr_factor=4.0, at_edge=True,
                          train_seconds=report.mean_spread_of([100, 110, 105])),
         "scratch": side(scratch, sweep=sweep, chosen_lr_factor=2.0, at_edge=False,
                         train_seconds=report.mean_spread_of([90, 95, 92])),
         "shrink": side(shrink, transform_seconds=report.mean_spread_of([30, 31, 32]))}
    text = report.shrink_vs_scratch_rates(r)
    ps = [stats.ttest_ind(shrink, scratch, equal_var=False).pvalue,
          stats.ttest_ind(scratch, original, equal_var=False).pvalue, stats.ttest_rel(shrink, original).pvalue]
    order = sorted(range(3), key=lambda i: ps[i])
    holm, running = [0.0] * 3, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (3 - rank) * ps[i]))
        holm[i] = running
    for name, p, h in zip(("shrink − scratch", "scratch − original", "shrink − original"), ps, holm):
        row = next(line for line in text.splitlines() if line.startswith(f"| {name}"))
        assert f"p = {p:.2g}" in row and f"Holm {h:.2g}" in row, row
    assert "paired t" in next(line for line in text.splitlines() if line.startswith("| shrink − original"))
    assert "4× (at the sweep's edge)" in text and "| 2× |" in text
    assert "earlier choice" not in text
    r["earlier_test_reads"] = [{"side": "scratch", "lr_factor": 1.0, "seed": k, "test": v}
                               for k, v in enumerate([1.9, 1.8, 1.85])]
    r["earlier_test_reads"] += [{"side": "scratch", "lr_factor": 2.0, "seed": 0, "test": 1.7}]  # the chosen rate
    r["plan_changes"] = ["8× added"]
    looks = report.shrink_vs_scratch_rates(r).split("earlier choice")[1]
    assert "8× added" in looks and "| scratch | 1× | 1.8500 ± 0.0500 (3) |" in looks and "| 2× |" not in looks


def test_the_gemma3_table_sets_the_distilled_arm_beside_its_start_and_smollm2s_gap():
    from report_gemma3 import real_gemma3
    arm = {"size": "-25%", "m": 480, "parameters": 201_000_000, "se": 0.1, "step": {"cpu_seconds": 200},
           "output_gains": "carry-groups640-fit2", "dev": 6.5, "windows": [6.5] * 4}
    r = {"model": "g", "d": 640, "dev_windows": 4, "block": 256, "exact_windows": 2, "split": "dev",
         "log_vocabulary": 12.48, "original": {"parameters": 268_000_000, "dev": 5.0, "se": 0.1},
         "shrink": {"free-25%-carry-groups640-fit2": arm},
         "distill": {"free-25%-carry-groups640-fit2": {
             "recipe": "distill25", "parameters": 201_000_000, "tokens": 98_304, "step": {"cpu_seconds": 4000},
             "dev": 5.5, "se": 0.05, "test": {"test": 5.6, "se": 0.04}}}}
    assert "Distilled" not in real_gemma3(dict(r, distill={}))
    r["test"] = {"original": {"test": 5.2, "se": 0.03}}
    r["chosen"] = {"arm": "carry-groups640-fit2", "by": "dev", "tried": 1}
    row = next(line for line in real_gemma3(r, smollm2_distill_gap="+3.3% ± 0.0").splitlines()
               if "then distilled" in line)
    assert "6.5000 → 5.5000" in row and "+10.0%" in row and "+7.7%" in row and "+3.3% ± 0.0" in row
    assert "| 4000 |" in row and "98,304" in row and "| not read | — | — |" in row
    # read with BOS first: against the original read the same way, beside its start's BOS-first gap
    r["distill"]["free-25%-carry-groups640-fit2"]["bos_test"] = {"bos": 4.4, "bos_windows": [4.3, 4.5] * 8,
                                                                 "plain": 5.6, "plain_windows": [5.6] * 16}
    r["bos_recipe"] = {"test original": {"bos": 4.0, "plain": 5.2}, "test free-25%-carry-groups640-fit2": {
        "bos": 6.0, "plain": 6.5}}
    row = next(line for line in real_gemma3(r).splitlines() if "then distilled" in line)
    assert "| 4.4000 ± 0.0000 | +10.0% | +50.0% |" in row


def test_the_gemma3_bos_control_gives_each_gap_against_the_original_read_the_same_way():
    from report_gemma3 import bos_lines
    r = {"dev_windows": 16, "bos": {"original": {"plain": 5.0, "bos": 4.0},
                                    "arm": {"plain": 5.5, "bos": 5.0}}}
    row = next(line for line in bos_lines(r) if line.startswith("| arm"))
    assert row == "| arm | 5.5000 | 5.0000 | -0.5000 | +10.0% | +25.0% |"
    assert bos_lines({"bos": {}}) == []


def test_the_smollm2_bos_control_stands_beside_gemmas_with_each_gap_read_the_same_way():
    from report_gemma3 import smollm2_bos_lines
    r = {"dev_windows": 16, "chosen": {"arm": "a"},
         "bos": {"original": {"plain": 5.0, "bos": 4.0, "bos_token": 2},
                 "free-25%-0-not-chosen": {"plain": 9.0, "bos": 9.0, "bos_token": 2},
                 "free-25%-a": {"plain": 6.0, "bos": 6.0, "bos_token": 2},
                 "free-25%-a, distilled": {"plain": 5.5, "bos": 5.5, "bos_token": 2}},
         "smollm2_bos": {"original, BOS": {"plain": 4.0, "bos": 3.8, "first": "BOS", "bos_token": 1},
                         "free25, BOS": {"plain": 4.4, "bos": 4.37, "first": "BOS", "bos_token": 1,
                                         "token_text": "<|im_start|>"}}}
    text = "\n".join(smollm2_bos_lines(r))
    # SmolLM2: +10.0% mid-text, +15.0% with BOS, a change of 4.37/3.8 − 4.4/4.0 = +5.0 points
    assert "| SmolLM2: BOS (<\\|im_start\\|>) | 1 | 4.0000 | 3.8000 | 4.4000 | 4.3700 | +10.0% | +15.0% | +5.0 pts |" \
        in text
    # Gemma's row: the chosen shrink, not its distilled model: +20.0% and +50.0%, +30.0 points
    assert "| Gemma 3: BOS (free-25%-a) | 2 | 5.0000 | 4.0000 | 6.0000 | 6.0000 | +20.0% | +50.0% | +30.0 pts |" \
        in text
    assert smollm2_bos_lines({"bos": {}}) == []


def test_the_general_table_puts_each_texts_gap_both_ways_beside_smollm2s():
    from report_gemma3 import general_lines

    def read(text, model, plain, bos):
        return {"text": text, "model": model, "plain": plain, "bos": bos, "plain_se": 0.01, "bos_se": 0.02,
                "windows": 64, "split_windows": 200}

    r = {"general": {"wiki original": read("wiki", "original", 5.0, 4.0),
                     "wiki free-25%-a": read("wiki", "free-25%-a", 6.0, 6.0),
                     "novel free-25%-a": read("novel", "free-25%-a", 7.0, 7.0)}}  # no original read: no row
    text = "\n".join(general_lines(r, {"wiki": "+9.0% ± 0.1"}))
    assert ("| wiki | 64 of 200 | free-25%-a | 5.0000 ± 0.0100 | 6.0000 ± 0.0100 | +20.0% | 4.0000 ± 0.0200 | "
            "6.0000 ± 0.0200 | +50.0% | +9.0% ± 0.1 | +1.000 | +2.000 |") in text
    assert "| novel |" not in text and general_lines({}) == []
    r["general"]["novel original"] = read("novel", "original", 7.0, 3.5)  # +0% and +100%
    from report_gemma3 import general_mean_gaps
    assert general_mean_gaps(r) == {}  # a text missing: no mean over a different set of texts
    r["general"]["news original"] = read("news", "original", 5.0, 4.0)
    r["general"]["news free-25%-a"] = read("news", "free-25%-a", 5.5, 5.0)  # +10% and +25%
    assert general_mean_gaps(r) == pytest.approx({"plain": 10.0, "bos": 175 / 3})
    assert "| mean over texts | — | free-25%-a | — | — | +10.0% | — | — | +58.3% | +8.0% | — | — |" in "\n".join(
        general_lines(r, {"mean": "+8.0%"}))
    # the distilled model: its own rows and mean, beside SmolLM2's distilled recipe, never mixed into the free arm's
    for text, plain in (("wiki", 5.5), ("novel", 7.7), ("news", 5.0)):
        r["general"][f"{text} free-25%-a, distilled"] = read(text, "free-25%-a, distilled", plain, 4.0)
    assert general_mean_gaps(r) == pytest.approx({"plain": 10.0, "bos": 175 / 3})
    assert general_mean_gaps(r, "free-25%-a, distilled") == pytest.approx({"plain": 20 / 3, "bos": 100 / 21})
    text = "\n".join(general_lines(r, {"wiki": "+9.0% ± 0.1", "mean": "+8.0%"}, {"wiki": "+4.0%", "mean": "+3.0%"}))
    assert "| wiki | 64 of 200 | free-25%-a, distilled | 5.0000 ± 0.0100 | 5.5000 ± 0.0100 | +10.0% |" in text
    assert "| +0.0% | +4.0% | +0.500 | +0.000 |" in text
    assert "| mean over texts | — | free-25%-a, distilled | — | — | +6.7% | — | — | +4.8% | +3.0% | — | — |" in text
    del r["general"]["news free-25%-a, distilled"]  # a text the distilled model was not read on: no mean of its own
    assert general_mean_gaps(r, "free-25%-a, distilled") == {}
    assert "| mean over texts | — | free-25%-a, distilled |" not in "\n".join(general_lines(r))


def test_the_bos_sinks_table_gives_each_models_attention_on_position_0_by_reading():
    from report_gemma3 import bos_sinks_lines
    sinks = [{"mean_weight_on_position_0": w, "heads_over_half": h, "heads": 4} for w, h in ((0.1, 0), (0.9, 3),
                                                                                            (0.5, 1), (0.3, 0))]
    r = {"bos_sinks": {"original, BOS first": {"model": "original", "reading": "BOS first", "windows": 4,
                                               "sinks": sinks, "max_over_median_norm": 12.34, "max_layer": 1,
                                               "max_position": 0, "max_abs": 1234.5, "massive_coordinates": 7}}}
    text = "\n".join(bos_sinks_lines(r))
    # layers in order 0.1, 0.9, 0.5, 0.3: the median 0.4 (not the upper one, 0.5), the mean 0.45, the last third
    # (the last layer) 0.3, the largest 0.9
    assert "| original | BOS first | 0.40 | 0.45 | 0.30 | 0.90 | 4 of 16 | 12.3 (layer 1, position 0) | 1,234 |" in text
    assert bos_sinks_lines({}) == []


def test_the_largest_activations_compare_layer_by_layer_not_at_each_models_own_top_layer():
    from report_gemma3 import largest_by_layer_lines

    def reading(model, maxima, norms):
        return {"model": model, "reading": "mid-text", "by_layer": [
            {"layer": l, "max_abs": m, "median_norm": n, "coordinate": 0, "position": 0}
            for l, (m, n) in enumerate(zip(maxima, norms))]}

    x = {"original, mid-text": reading("original", [100.0, 2000.0, 60000.0], [10.0, 50.0, 4000.0]),
         "free-25%-a, mid-text": reading("free-25%-a", [120.0, 1000.0, 58865.0], [10.0, 40.0, 3757.0])}
    text = "\n".join(largest_by_layer_lines(x))
    assert "| 2 | 60,000 | 58,865 | 0.98 | 4,000 | 3,757 |" in text and "| 1 | 2,000 | 1,000 | 0.50 |" in text
    del x["free-25%-a, mid-text"]["by_layer"]  # measured before the per-layer record: no table, not a wrong one
    assert largest_by_layer_lines(x) == []


def test_the_gemma3_bos_recipe_table_gives_the_choice_and_both_test_reads():
    from report_gemma3 import bos_recipe_lines, export_lines
    w = {"windows": 40, "bos_se": 0.05, "plain_se": 0.06}
    r = {"dev_windows": 16, "exact_windows": 2, "chosen_bos": {"arm": "a-bos", "tried": 2, "by": "dev loss with BOS"},
         "bos_recipe": {"dev free-25%-a": {"plain": 6.5, "bos": 6.2}, "dev free-25%-a-bos": {"plain": 6.9, "bos": 5.0},
                        "test original": dict(w, plain=5.0, bos=4.0),
                        "test free-25%-a-bos": dict(w, plain=6.0, bos=5.0)}}
    text = "\n".join(bos_recipe_lines(r))
    assert "| free-25%-a-bos | BOS-first windows (--calib_bos) | 5.0000 | 6.9000 | — | chosen |" in text
    assert "| free-25%-a-bos | 40 | 5.0000 ± 0.0500 | +25.0% | 6.0000 ± 0.0600 | +20.0% |" in text
    assert bos_recipe_lines({"bos_recipe": {}}) == [] and export_lines({}) == []
    e = export_lines({"exact_windows": 2, "export": {"m": {"architecture": "Gemma3ForCausalLM", "hidden_size": 480,
                                                           "tie_word_embeddings": True, "parameters": 2e8,
                                                           "relative_error": 1e-6, "max_error": 2e-5,
                                                           "transformers": "5"}}})
    assert "| m | Gemma3ForCausalLM | 480 | yes | 200.0 M | 1.0e-06 | 2.0e-05 | 5 |" in "\n".join(e)


def test_a_spread_that_is_not_zero_never_prints_as_zero():
    from report_stats import pct
    assert pct({"n": 3, "mean": 0.0331, "std": 0.0004}, 1) == "+3.3% ± 0.04"
    assert pct({"n": 3, "mean": 0.0331, "std": 0.012}, 1) == "+3.3% ± 1.2"
    assert pct({"n": 3, "mean": 0.0331, "std": 0.0}, 1) == "+3.3% ± 0.0"  # a true zero stays one
    assert pct({"n": 1, "mean": 0.0331, "std": 0.0}, 1) == "+3.3%"


def test_a_block_written_for_results_keeps_its_links_in_another_doc():
    links = "[t](protocol/table.md), [b](../bench/x.md), [w](https://a/b), [s](#here)"
    assert report.rebase_links(links, "results") == \
        "[t](results/protocol/table.md), [b](bench/x.md), [w](https://a/b), [s](#here)"
    assert report.rebase_links("[t](protocol/table.md)", "../results") == "[t](../results/protocol/table.md)"
    assert report.rebase_links("[t](protocol/table.md)", ".") == "[t](protocol/table.md)"


def test_the_test_windows_error_is_batch_means_over_blocks_of_consecutive_windows():
    values = [float(i % 5) + 0.1 * i for i in range(35)]  # 35 windows: ⌊√35⌋ = 5 blocks of 5 … 7 of them
    means = [statistics.fmean(values[5 * k:5 * k + 5]) for k in range(7)]
    assert report.block_count(35) == 7 and report.block_se(values) == pytest.approx(statistics.stdev(means) / 7 ** .5)
    few = [1.0, 2.0, 4.0]  # ⌊√3⌋ = 1: each window its own block, the plain standard error
    assert report.block_count(3) == 3 and report.block_se(few) == pytest.approx(statistics.stdev(few) / math.sqrt(3))
    trend = [0.01 * i for i in range(64)]  # correlated neighbours: batch means see more error than windows do
    assert report.block_se(trend) > statistics.stdev(trend) / 8
    with report_stats.fixed_block(16):  # the sensitivity table's override: 4 blocks of 16
        assert report.block_count(64) == 4
        assert report.block_count(20) == 2  # never under two blocks: at most n // 2 per block
    assert report.block_count(64) == 8
    with pytest.raises(ValueError, match="at least 2"):
        report.block_se([1.0])


def test_an_old_scheme_calibration_draw_is_refused_and_the_aims_use_the_draws_mean_by_blocks():
    r = fake_protocol()
    del r["rows"][2]["calibration_seeds"]
    with pytest.raises(report.ResultsError, match="free25 seed 2 was calibrated on the old overlapping batches"):
        report.protocol_tests(r)
    r = fake_protocol()
    base = [4.0 + 0.1 * ((7 * i) % 11) for i in range(40)]  # 40 windows: 6 blocks of 6, the batch-means path
    for x, scale in zip([r["original"], *r["rows"]], (1.0, 1.020, 1.021, 1.019, 1.2, 1.01, 1.005)):
        each = [w * scale + (0.0 if x is r["original"] else 0.003 * ((5 * i) % 9)) for i, w in enumerate(base)]
        x["losses"]["shakespeare"] = {"test": {"loss": statistics.fmean(each), "each": each}}
    free25 = dict(report.protocol_tests(r))["free25: Shakespeare test gap ≤ +3%"]
    mean = report.mean_windows(r["rows"][:3], "shakespeare")
    diffs = [a - b for a, b in zip(mean, r["original"]["losses"]["shakespeare"]["test"]["each"])]
    blocks = [statistics.fmean(diffs[6 * k:6 * k + 6]) for k in range(6)]
    window = 100 * statistics.stdev(blocks) / math.sqrt(6) / r["original"]["losses"]["shakespeare"]["test"]["loss"]
    assert report.window_gap_se(r, r["rows"][:3], "shakespeare") == pytest.approx(window)
    from scipy import stats
    gaps = [report.test_gap(r, x, "shakespeare") for x in r["rows"][:3]]
    draws = statistics.variance(gaps) / 3
    df = (draws + window ** 2) ** 2 / (draws ** 2 / 2 + window ** 4 / 5)
    t = abs(statistics.fmean(gaps) - 3.0) / math.sqrt(draws + window ** 2)
    assert free25["p"] == pytest.approx(2 * stats.t.sf(t, df), rel=1e-6)
    with pytest.raises(ValueError, match="number of windows"):
        report.aim_verdict(gaps, 3.0, window_se=0.1)  # a window error without its count: refused, not dropped


def test_a_difference_over_draws_holds_the_test_windows_error_too():
    from scipy import stats
    a, b = [4.0, 4.5, 5.0], [4.11, 4.59, 5.1]
    plain = report.verdict(a, b, paired=True)
    wide = report.verdict_with_windows(a, b, True, window_se=0.2, windows=100)  # a noisy test set: undecided
    d = [x - y for x, y in zip(a, b)]
    draws = statistics.stdev(d) ** 2 / 3
    df = (draws + 0.04) ** 2 / (draws ** 2 / 2 + 0.04 ** 2 / 9)  # Welch–Satterthwaite: 100 windows, 10 blocks
    assert wide["p"] == pytest.approx(2 * stats.t.sf(abs(statistics.fmean(d)) / math.sqrt(draws + 0.04), df),
                                      rel=1e-9)
    assert plain["word"] == "lower" and wide["word"] == "no difference" and "test windows" in wide["test"]
    assert report.verdict_with_windows(a, b, True, 0.0, 100) == plain  # no window error: the draws' test unchanged
    x, y = [4.0, 4.2, 4.1], [4.5, 4.9, 4.6, 4.7]  # Welch: three parts, each with its degrees of freedom
    va, vb, vw = statistics.variance(x) / 3, statistics.variance(y) / 4, 0.05 ** 2
    df = (va + vb + vw) ** 2 / (va ** 2 / 2 + vb ** 2 / 3 + vw ** 2 / 6)  # 50 windows: 7 blocks of 7
    w = report.verdict_with_windows(x, y, False, 0.05, windows=50)
    delta = statistics.fmean(x) - statistics.fmean(y)
    assert w["p"] == pytest.approx(2 * stats.t.sf(abs(delta) / math.sqrt(va + vb + vw), df), rel=1e-9)
    assert report.verdict_with_windows([4.0], y, False, 0.05, 50)["word"] == "not tested"  # n = 1: not tested


def test_recipes_drawn_on_the_same_seeds_are_paired_over_the_seeds_both_have():
    def rows(losses: dict) -> list[dict]:
        return [{"seed": k, "losses": {"shakespeare": {"test": {"loss": v}}}} for k, v in losses.items()]
    # b = a + 0.1 + small noise per seed: paired, a clear difference; Welch's t on the same numbers sees the spread
    a, b = rows({0: 4.0, 1: 4.5, 2: 5.0}), rows({0: 4.11, 1: 4.59, 2: 5.1, 3: 9.0})
    paired = report.draws_verdict(a, b, shared=True)
    assert paired["test"] == "paired t" and paired["n"] == (3, 3) and paired["word"] == "lower"  # seed 3: not shared
    welch = report.draws_verdict(a, b, shared=False)
    assert welch["test"] == "Welch t" and welch["n"] == (3, 4) and welch["word"] == "no difference"
