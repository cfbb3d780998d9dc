"""report_serving.py: the quantization-only frontier, the point each width + quantization point must beat, its
paired test, Holm across the table, and the pick for a byte budget made on dev — on results built here."""
import math
import os
import sys

import numpy as np
import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import report_serving as rs  # noqa: E402


def point(recipe, kind, mb, test, dev=None, rotation="none", seed=0, noise=0.05):
    """A point whose 40 test windows have mean ``test`` (window noise drawn with ``seed``)."""
    each = test + np.random.default_rng(seed).normal(0, noise, 40)
    each = each - each.mean() + test
    return {"recipe": recipe, "rotation": rotation, "type": kind, "bytes": int(mb * 1e6), "width": 576,
            "parameters": 1, "bits_per_weight": 8.0, "types": {kind: 1.0},
            "losses": {"dev": {"loss": test if dev is None else dev, "windows": 8},
                       "test": {"loss": test, "se": 0.01, "windows": 40, "each": list(each)}}}


@pytest.fixture
def results():
    original = [point("original", t, mb, loss, seed=i) for i, (t, mb, loss) in enumerate(
                (("F16", 270, 3.80), ("Q8_0", 145, 3.81), ("Q4_K_M", 105, 3.85), ("Q3_K_M", 90, 3.95),
                 ("Q2_K", 80, 4.30)))]
    ours = [point("distill25", "Q4_K_M", 85, 3.90, seed=5),   # ≤ Q3_K_M's 90 MB, lower loss: below
            point("free50", "Q4_K_M", 60, 5.00, seed=6),      # smaller than every original point's file
            point("free25", "Q8_0", 120, 4.50, seed=7)]       # ≤ Q8_0's 145 MB, higher loss: above
    return {"model": "m", "llama_cpp_python": "0", "text": "t", "block": 256, "points": original + ours}


def test_the_comparator_is_what_quantization_alone_gives_the_same_budget(results):
    """The best of the original's files no larger than the point (the frontier's envelope), or the smallest file
    where none fits."""
    by = {rs.label(p): p for p in results["points"]}
    assert rs.comparator(results, by["distill25 Q4_K_M"])["type"] == "Q2_K"  # 85 MB: only Q2_K (80 MB) fits
    assert rs.comparator(results, by["free25 Q8_0"])["type"] == "Q4_K_M"  # 120 MB: Q4_K_M is the best that fits
    assert rs.comparator(results, by["free50 Q4_K_M"])["type"] == "Q2_K"  # smaller than every file
    worse = point("original", "Q5_K_M", 112, 4.00, seed=9)  # a larger file that a smaller one beats
    results["points"].append(worse)
    assert rs.comparator(results, dict(by["free25 Q8_0"], bytes=int(113e6)))["type"] == "Q4_K_M"
    assert [q["type"] for q in rs.envelope(results)] == ["Q2_K", "Q3_K_M", "Q4_K_M", "Q8_0", "F16"]


def test_the_verdicts_follow_the_paired_test_after_holm(results):
    verdicts = {rs.label(p): v for p, _, v in rs.frontier_tests(results)}
    assert verdicts["distill25 Q4_K_M"]["word"] == "lower"
    assert verdicts["free25 Q8_0"]["word"] == "higher"  # 4.50 against Q4_K_M's 3.85
    assert verdicts["free50 Q4_K_M"]["word"] == "higher"  # 5.00 against Q2_K's 4.30
    assert all(v["p_holm"] >= v["p"] for v in verdicts.values())


def test_the_paired_test_is_the_naive_batch_means_computation():
    a, b = point("x", "Q4_K_M", 1, 3.9, seed=1), point("original", "Q3_K_M", 1, 3.95, seed=2)
    d = np.array(a["losses"]["test"]["each"]) - np.array(b["losses"]["test"]["each"])
    v = rs.paired_t(a, b)
    size = math.isqrt(len(d))  # ⌊√n⌋ consecutive windows per block, the last partial block left out
    blocks = np.array([d[i * size:(i + 1) * size].mean() for i in range(len(d) // size)])
    se = blocks.std(ddof=1) / math.sqrt(len(blocks))
    assert v["delta"] == pytest.approx(d.mean()) and v["se"] == pytest.approx(se)
    from scipy import stats
    assert v["p"] == pytest.approx(2 * stats.t.sf(abs(d.mean()) / se, len(blocks) - 1))


def test_unequal_windows_are_named():
    a, b = point("x", "Q4_K_M", 1, 3.9), point("original", "Q3_K_M", 1, 3.95)
    b["losses"]["test"]["each"] = b["losses"]["test"]["each"][:30]
    with pytest.raises(ValueError, match="40 and 30 test windows"):
        rs.paired_t(a, b)


def test_a_budgets_pick_is_made_on_dev_not_on_test(results):
    """At Q3_K_M's 90 MB budget two points fit beside the original's own; the one with the lower dev loss is picked
    even where its test loss is higher."""
    results["points"].append(point("free25", "Q2_K", 70, 3.80, dev=4.9))  # best on test, worst on dev
    rows = {row[0]: row for row in rs.recommendations(results)}
    assert rows["90.0 MB (original Q3_K_M)"][1] == "distill25 Q4_K_M"


def test_the_table_renders_every_point_and_the_figure_is_written(results, tmp_path):
    text = rs.quant_frontier(results)
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    for p in results["points"]:
        cells = f"| {rs.NAMES[p['recipe']]} | {p['rotation']} | {p['type']} | {p['width']} |"
        assert sum(row.startswith(cells) for row in rows) == 1, cells
    assert "below the frontier vs original Q2_K" in text and "above the frontier" in text
    os.makedirs(tmp_path / "quant_frontier")
    assert os.path.exists(rs.quant_frontier_figure(results, str(tmp_path)))


def test_generation_speed_is_read_against_the_original_at_the_same_type(results):
    by = {rs.label(p): p for p in results["points"]}
    by["original Q4_K_M"]["speed"] = {"generate_tokens_per_s": 40.0, "prompt_tokens_per_s": 400.0, "peak_rss_mb": 300}
    by["free50 Q4_K_M"]["speed"] = {"generate_tokens_per_s": 70.0, "prompt_tokens_per_s": 800.0, "peak_rss_mb": 200}
    assert rs.generation_ratio(results, by["free50 Q4_K_M"]) == "1.75×"
    assert rs.generation_ratio(results, by["distill25 Q4_K_M"]) == "—"  # not timed
