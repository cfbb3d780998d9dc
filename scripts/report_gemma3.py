"""
results/real_gemma3 (scripts/real_gemma3.py) as a table: the real Gemma 3 270M grown and shrunk with its peri-LN
output gains carried through T or averaged, on Shakespeare's dev split.

Verdicts: a growth is "exact" when its log-probabilities differ from the original's by at most EXACT (relative,
‖Δ‖/‖log p‖, #73's goal); carried against averaged output gains at the same width and map, a t-test of the dev
loss difference paired over the same windows, its error by batch means over blocks of consecutive windows (one
model each: the text's error, not the recipe's), Holm across the table's tests (report_stats).
"""
from __future__ import annotations

import json
import os
import statistics

from report_stats import ALPHA, adjust, block_se, paired_windows_t, table

EXACT = 1e-4  # relative log-probability error of an exact growth (#73's goal)
GENERAL_TEXTS = ("novel", "news", "wiki")  # the general texts read on Gemma (real_gemma3.GENERAL_TEXTS)
GROW_NAMES = {"pad": "zero padding (coordinate map)", "split": "split (mixes coordinate pairs)",
              "orthogonal-carry": "Haar-random orthogonal", "orthogonal-average": "Haar-random orthogonal"}


DIAGNOSES = {"rotation-640": "the recipe at m = d (a PCA rotation; the carried lengths and the tied head's final "
                             "gain inexact)",
             "rotation-640-untied": "the same, the head untied (the final gain exact: only the lengths inexact)",
             "rotation-640-fit2": "the same, the lengths fitted on 2 calibration batches"}


def se(x: dict, reading: str = "") -> float:
    """A loss's standard error over its windows by batch means (``block_se``: consecutive windows correlate) where
    the windows are kept — ``reading`` 'plain' or 'bos' for a BOS control's two reads — else the one recorded."""
    values = x.get(f"{reading}_windows" if reading else "windows")
    if isinstance(values, list) and len(values) >= 2:
        return block_se(values)
    return x[f"{reading}_se" if reading else "se"]


def gap(loss: float, reference: float) -> str:
    return f"{100 * (loss / reference - 1):+.1f}%"


def fit_of(x: dict) -> str:
    """How an arm's carried lengths were fitted: the fit named in its record, or none needed (averaged gains)."""
    if x.get("output_gains") == "average":
        return "—"
    return x.get("length_fit", "absolute (superseded)")


def superseded_lines(r: dict) -> list[str]:
    """The arms the old length fit built beside the same arms rebuilt by the present one: the loss (dev, or test for
    the test reads) paired over the same windows (one model each), Holm across these tests."""
    old = r.get("superseded", {})
    pairs = [(section, name, x, r.get(section, {}).get(name)) for section in ("grow", "shrink", "diagnose", "test")
             for name, x in old.get(section, {}).items()]
    pairs = [(section, name, a, b) for section, name, a, b in pairs if b and b.get("windows") and a.get("windows")]
    if not pairs:
        return []
    verdicts = [paired_windows_t(b["windows"], a["windows"]) for _, _, a, b in pairs]
    for v, (_, _, a, b) in zip(verdicts, pairs):
        if min(a.get("dev", a.get("test")), b.get("dev", b.get("test"))) > r["log_vocabulary"]:
            v.update(p=None, p_holm=None, word="not tested (both above log V)")
    adjust(verdicts)
    tested = sum(v["p"] is not None for v in verdicts)
    rows = [[f"{section}: {name}", f"{a.get('dev', a.get('test')):.4f}", f"{b.get('dev', b.get('test')):.4f}",
             f"{v['delta']:+.4f} ± {v['se']:.4f}",
             "—" if v["p_holm"] is None else f"{v['p_holm']:.2g}", v["word"]]
            for (section, name, a, b), v in zip(pairs, verdicts)]
    return ["", f"The length fit repaired (2026-11-28): each arm the old fit built ({pairs[0][2]['length_fit']}) "
            f"beside the same arm rebuilt with the present one ({LENGTH_FIT}); loss (dev; on the test rows, test) "
            f"paired over the same windows (t-test on window blocks at α = {ALPHA}, Holm across the {tested} tested; "
            "one model each):", "",
            *table(["arm", "old fit", "present fit", "present − old", "p (Holm)", "verdict"], rows)]


LENGTH_FIT = "isotropic-relative"  # scripts/real_gemma3.py's name for porting.length_fit


def smollm2_eval_geometry(results_dir: str) -> dict | None:
    """results/real_model_geometry/eval_geometry.json's rows (SmolLM2's eval_geometry runs), or None."""
    path = os.path.join(results_dir, "real_model_geometry", "eval_geometry.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)["rows"]


def eval_geometry_lines(r: dict, smollm2: dict | None) -> list[str]:
    """Per-layer intrinsic dimension of each model alone, and what the same plain PCA map at m/d = 0.75 does to
    each (AE, concordance, kurtosis, KL): Gemma's eval_geometry runs beside SmolLM2's."""
    g = r.get("eval_geometry", {})
    if "alone" not in g:
        return []
    models = [("SmolLM2-135M (pre-LN)", smollm2 or {}, "pca_m432"), ("Gemma 3 270M (peri-LN)", g, "pca_m480")]
    rows = []
    for label, rows_of, pca in models:
        alone, mapped = rows_of.get("alone"), rows_of.get(pca)
        if not alone:
            continue
        dims = alone["ref_intrinsic_dimension"]
        width = 576 if "SmolLM2" in label else 640
        cells = [label, width, len(dims) - 1, f"{min(dims)}–{max(dims)}", sum(d <= 4 for d in dims),
                 f"{max(alone['ref_activation_kurtosis']):,.0f}"]
        if mapped:
            ae = mapped["angular_error"]
            cells += [f"{ae['model']:.4f}", f"{mapped['concordance'].get('model', float('nan')):.4f}",
                      f"{mapped['weight_kurtosis_mean']['ref']:.2f} → {mapped['weight_kurtosis_mean']['new']:.2f}",
                      f"{mapped['kl']:.3f}", f"{mapped['loss']['ref']:.3f} → {mapped['loss']['new']:.3f}"]
        else:
            cells += ["—"] * 5
        rows.append(cells)
    return ["", "eval_geometry.py on each model alone and against a plain PCA map at m/d = 0.75 (the same command; "
            "1,024 probes from 16 dev windows of 256 tokens; loss and KL on 32; Gemma's output gains carried with the "
            "present length fit). Intrinsic dimension: principal components for 95% of a layer's variance (one value "
            "per residual state: the embeddings and each block's output); '≤ 4' counts the states that one or a few "
            "massive coordinates dominate:", "",
            *table(["model", "d", "blocks", "intrinsic dimension (range)", "states ≤ 4", "largest activation "
                    "kurtosis", "AE (model)", "concordance (model)", "weight kurtosis", "KL", "loss (32 windows)"],
                   rows)]


def gemma3_figure(r: dict, results_dir: str) -> str | None:
    """results/real_gemma3/real_gemma3.png: per-layer intrinsic dimension over relative depth, both models (left);
    the shrink arms' dev loss with the old and the present length fit (right)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    smollm2 = smollm2_eval_geometry(results_dir) or {}
    for label, rows_of in (("SmolLM2-135M (pre-LN, d = 576)", smollm2), ("Gemma 3 270M (peri-LN, d = 640)",
                                                                         r.get("eval_geometry", {}))):
        if "alone" in rows_of:
            dims = rows_of["alone"]["ref_intrinsic_dimension"]
            left.plot([i / (len(dims) - 1) for i in range(len(dims))], dims, marker="o", ms=3, label=label)
    left.set_yscale("log")
    left.set_xlabel("residual state (0: embeddings, 1: last block's output)")
    left.set_ylabel("principal components for 95% of variance")
    left.set_title("per-layer intrinsic dimension")
    left.legend(fontsize=8)
    shrink = [x for x in r.get("shrink", {}).values() if x["size"] == "-25%"]
    old = r.get("superseded", {}).get("shrink", {})
    names = [x["output_gains"] for x in shrink]
    right.barh([i + 0.2 for i in range(len(names))], [x["dev"] for x in shrink], height=0.4,
               label="present length fit")
    right.barh([i - 0.2 for i in range(len(names))],
               [old.get(f"free-25%-{n}", {}).get("dev", float("nan")) for n in names], height=0.4,
               label="old (absolute) fit")
    right.axvline(r["original"]["dev"], color="k", lw=1, label="original")
    right.set_yticks(range(len(names)), names, fontsize=8)
    right.set_xscale("log")
    right.set_xlabel("dev loss (nats, log scale)")
    right.set_title("Gemma 3 at −25% parameters, training-free")
    right.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(results_dir, "real_gemma3", "real_gemma3.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def carry_tests(r: dict) -> list[tuple[str, dict]]:
    """(what, verdict) of carried − averaged output gains at each width: growth (orthogonal map) and each shrink."""
    pairs = [("grow 768, orthogonal", r.get("grow", {}).get("orthogonal-carry"),
              r.get("grow", {}).get("orthogonal-average"))]
    for size in dict.fromkeys(x["size"] for x in r.get("shrink", {}).values()):
        pairs.append((f"shrink {size}", r["shrink"].get(f"free{size}-carry"), r["shrink"].get(f"free{size}-average")))
    out = []
    for what, a, b in pairs:
        if not (a and b):
            continue
        v = paired_windows_t(a["windows"], b["windows"])
        if min(a["dev"], b["dev"]) > r["log_vocabulary"]:  # two arms worse than a uniform guess: no comparison
            v = dict(v, p=None, p_holm=None, word="not tested (both above log V)")
        if a.get("parameters") != b.get("parameters"):
            what += f" ({a.get('parameters', 0) / 1e6:.1f} M against {b.get('parameters', 0) / 1e6:.1f} M)"
        out.append((what, v))
    adjust([v for _, v in out])
    return out


def geometry_summary(x: dict) -> list:
    """One model's row: the largest state coordinate over the median state norm (its layer), the massive
    coordinates, the mean attention on position 0 (median over layers) and the heads that put over half there."""
    top = max(x["layers"], key=lambda e: e["max_over_median_norm"])
    sinks = x["sinks"]
    weights = [s["mean_weight_on_position_0"] for s in sinks]
    return [f"{top['max_over_median_norm']:.1f} (layer {top['layer']} of {len(x['layers']) - 1})",
            f"{top['max_abs']:,.0f}", len(x["massive"]), f"{statistics.median(weights):.2f}",
            f"{sum(s['heads_over_half'] for s in sinks)} of {sum(s['heads'] for s in sinks)}"]


def geometry_lines(r: dict, smollm2: dict | None) -> list[str]:
    g = r.get("geometry")
    if not g or "layers" not in g:
        return []
    rows = [["Gemma 3 270M (peri-LN)", *geometry_summary(g)]]
    if smollm2 and "layers" in smollm2:
        rows.insert(0, ["SmolLM2-135M (pre-LN)", *geometry_summary(smollm2)])
    massive = [[e["coordinate"], f"{e['max_abs']:,.0f}", len(e["layers"]), e["layers"][0],
                f"{e['max_output_gain']:,.1f}", f"{e['median_gain_rank']:.2f}"] for e in g["massive"][:6]]
    return ["", "Massive activations and attention sinks (scripts/massive_activations.py's measurement: the residual "
            "stream entering each block and the last one's output, the first 4 dev windows of 256 tokens; a coordinate "
            "is massive where it reaches 100 × the median |coordinate|; SmolLM2's from results/real_model_geometry):",
            "", *table(["model", "max \\|h_k\\| / median ‖h‖ (its layer)", "max \\|h_k\\| there", "massive coordinates",
                        "attention on position 0 (median layer)", "heads > ½ on position 0"], rows),
            "", "Gemma's massive coordinates and their output gains (the largest over its 36 output norms; rank: the "
            "median over norms of the coordinate's place among its norm's 640 gains, 1 = the largest):", "",
            *table(["coordinate", "max \\|h_k\\|", "layers", "first layer", "largest output gain", "gain rank"],
                   massive)]


def distill_lines(r: dict, smollm2_gap: str | None) -> list[str]:
    """#70's distilled recipe applied unchanged to the arm chosen on dev: its start, its dev and test losses, its
    cost, beside SmolLM2's distill25 gap (scripts/protocol.py). One data order: n = 1, not tested."""
    if not r.get("distill"):
        return []
    base_dev, base_test = r["original"]["dev"], r.get("test", {}).get("original", {}).get("test")
    base_bos = r.get("bos_recipe", {}).get("test original")  # the original read with BOS first, the same targets
    rows = []
    for name, x in r["distill"].items():
        start = r.get("shrink", {}).get(name, {})
        test, bos = x["test"], x.get("bos_test")
        start_bos = r.get("bos_recipe", {}).get(f"test {name}")  # read there only if the BOS-first choice is it
        rows.append([f"{name}, then distilled ({x['recipe']})", f"{x['parameters'] / 1e6:.1f} M",
                     f"{x['tokens']:,} forward+backward (and the teacher's forward)",
                     f"{x['step']['cpu_seconds']:.0f}",
                     f"{start['dev']:.4f} → {x['dev']:.4f} ± {se(x):.4f}" if start else f"{x['dev']:.4f}",
                     gap(x["dev"], base_dev), f"{test['test']:.4f} ± {se(test):.4f}",
                     gap(test["test"], base_test) if base_test else "—",
                     f"{bos['bos']:.4f} ± {se(bos, 'bos'):.4f}" if bos else "not read",
                     gap(bos["bos"], base_bos["bos"]) if bos and base_bos else "—",
                     gap(start_bos["bos"], base_bos["bos"]) if start_bos and base_bos else "—",
                     smollm2_gap or "—"])
    return ["", "Distilled (#70's recipe, unchanged: every weight trained, AdamW at 1e-4, batches of 1 × 256 train "
            "tokens read mid-text, KL to the original only; its control, the original distilled from itself, is the "
            "original bit for bit). One data order (n = 1): beside SmolLM2's gap it is not tested. CPU-s: the "
            "finetune process's, with glibc told to keep freed memory (the same arithmetic, about half the time). "
            "Test, BOS first: the whole split with Gemma's BOS in front, targets 1 … 254 of each window, against the "
            "original read the same way (the BOS-first test table below); ± the windows' standard error by batch "
            "means.", ""] + table(
        ["model", "parameters", "token passes", "CPU-s", "dev (start → distilled)", "dev gap", "test", "test gap",
         "test, BOS first", "gap, BOS first", "its start's gap, BOS first", "SmolLM2's distill25 test gap (n = 3)"],
        rows)


def bos_lines(r: dict) -> list[str]:
    """The BOS control: each model's dev loss on the same targets without and with Gemma's BOS in front, and its gap
    to the original read the same way (one model each, n = 1)."""
    if not r.get("bos"):
        return []
    base = r["bos"].get("original")
    rows = [[name, f"{x['plain']:.4f}", f"{x['bos']:.4f}", f"{x['bos'] - x['plain']:+.4f}",
             gap(x["plain"], base["plain"]) if base and name != "original" else "—",
             gap(x["bos"], base["bos"]) if base and name != "original" else "—"] for name, x in r["bos"].items()]
    old = r.get("superseded", {}).get("bos", {})
    superseded = [] if not old else ["", "Superseded: measured before 2026-11-29, when the BOS column read its "
                                     "windows' tokens 2 … 255 against 1 … 254 without BOS (one target on); the "
                                     "distilled model's run was not in the run cache to measure again:", ""] + table(
        ["model", "dev, no BOS", "dev, BOS first (targets one on)"],
        [[name, f"{x['plain']:.4f}", f"{x['bos']:.4f}"] for name, x in old.items()])
    return ["", f"The BOS control: the first {r['dev_windows']} dev windows scored on the same targets (each "
            "window's tokens 1 … 254) read as every loss above reads them, mid-text with no BOS, and with Gemma's "
            "BOS token in front (one model each, n = 1).", ""] + table(
        ["model", "dev, no BOS", "dev, BOS first", "BOS − no BOS", "gap, no BOS", "gap, BOS first"], rows) + superseded


def smollm2_bos_lines(r: dict) -> list[str]:
    """The BOS control on SmolLM2 (--part=smollm2_bos): its original and free25 read on SmolLM2's own dev windows
    with and without a first token (its checkpoint's BOS; the document separator), the same targets; the gaps beside
    Gemma's chosen −25% arm read the same ways (one model each, n = 1)."""
    x = r.get("smollm2_bos")
    if not x:
        return []

    def row(first: str, token, base: dict, shrunk: dict) -> list:
        change = 100 * (shrunk["bos"] / base["bos"] - shrunk["plain"] / base["plain"])
        return [first.replace("|", "\\|"), token, f"{base['plain']:.4f}", f"{base['bos']:.4f}",
                f"{shrunk['plain']:.4f}",
                f"{shrunk['bos']:.4f}", gap(shrunk["plain"], base["plain"]), gap(shrunk["bos"], base["bos"]),
                f"{change:+.1f} pts"]

    rows = [row(f"SmolLM2: {first}" + (f" ({shrunk['token_text']})" if "token_text" in shrunk else ""),
                shrunk["bos_token"], x[f"original, {first}"], shrunk)
            for first in dict.fromkeys(v["first"] for v in x.values())
            if f"original, {first}" in x and (shrunk := x.get(f"free25, {first}"))]
    gemma = r.get("bos", {})
    name = f"free-25%-{r['chosen']['arm']}" if "chosen" in r else None
    if name in gemma and "original" in gemma:
        rows.append(row(f"Gemma 3: BOS ({name})", gemma[name].get("bos_token", "—"), gemma["original"], gemma[name]))
    return ["", "The BOS control beside SmolLM2 (--part=smollm2_bos): SmolLM2's original and its training-free −25% "
            "recipe (the protocol's free25, seed 0) on SmolLM2's first "
            f"{r['dev_windows']} Shakespeare dev windows, the same targets read mid-text and with a first token in "
            "front — its checkpoint's BOS (which its tokenizer does not add) or the document separator its "
            "pretraining put between documents; Gemma's row from the table above. One model each (n = 1): the "
            "change in the gap is a dev measurement, not tested.", ""] + table(
        ["model: first token", "id", "original, no first token", "original, first token", "−25%, no first token",
         "−25%, first token", "gap, no first token", "gap, first token", "gap change"], rows)


def bos_sinks_lines(r: dict) -> list[str]:
    """Why the gap grows with BOS (--part=bos_sinks): each model's attention on position 0 — the median and mean over
    layers, the mean over the last third of them, the largest — and its heads over ½ there, read mid-text and with
    BOS in front (one model each, GEOMETRY_WINDOWS windows); the largest activation where the geometry table finds
    it (the layer of the largest max/median ratio)."""
    x = r.get("bos_sinks")
    if not x:
        return []
    rows = []
    for v in x.values():
        weights = [e["mean_weight_on_position_0"] for e in v["sinks"]]
        late = weights[-(len(weights) // 3):]
        heads = sum(e["heads_over_half"] for e in v["sinks"])
        rows.append([v["model"], v["reading"], f"{statistics.median(weights):.2f}", f"{statistics.fmean(weights):.2f}",
                     f"{statistics.fmean(late):.2f}", f"{max(weights):.2f}",
                     f"{heads} of {sum(e['heads'] for e in v['sinks'])}",
                     f"{v['max_over_median_norm']:.1f} (layer {v['max_layer']}, position {v['max_position']})",
                     f"{v['max_abs']:,.0f}"])
    some = next(iter(x.values()))
    late = len(some["sinks"]) // 3
    return ["", f"Why the gap grows with BOS (--part=bos_sinks): attention sinks and massive activations (the "
            f"geometry table's measurement) on the first {some['windows']} dev windows, read mid-text and with BOS "
            "in front. Attention on position 0: every later query's weight on it, averaged over heads, per layer; "
            "what the sink does with that weight (BOS's values, the attention output) is not measured. The largest "
            "activation is the one at the layer of the largest max/median ratio, which may be a different layer "
            "per model (compared layer by layer in the table after); the shrink's coordinates (a coordinate "
            "selection) are numbered in its own order, not the original's. One model each, no spread.", ""] + table(
        ["model", "reading", "attention on position 0: median layer", "mean over layers",
         f"mean over the last {late} layers", "largest layer", "heads > ½ on position 0",
         "max \\|h_k\\| / median ‖h‖", "max \\|h_k\\| there"], rows) + largest_by_layer_lines(x)


def largest_by_layer_lines(x: dict) -> list[str]:
    """The largest |coordinate| of the residual stream at every layer, the original beside the shrink read the same
    way: the table above takes each model's at its own layer of largest max/median ratio, so it may set two
    different layers side by side. Needs the readings' per-layer records (``by_layer``) of both models."""
    models = [m for m in dict.fromkeys(v["model"] for v in x.values()) if m != "original"]
    readings = list(dict.fromkeys(v["reading"] for v in x.values()))
    shrunk = next((m for m in models if not m.endswith(DISTILLED)), None)  # the training-free arm
    if shrunk is None:
        return []
    pairs = [(reading, x.get(f"original, {reading}"), x.get(f"{shrunk}, {reading}")) for reading in readings]
    pairs = [(reading, {e["layer"]: e for e in a["by_layer"]}, {e["layer"]: e for e in b["by_layer"]})
             for reading, a, b in pairs if a and b and "by_layer" in a and "by_layer" in b]
    layers = sorted(set.intersection(*(set(a) & set(b) for _, a, b in pairs))) if pairs else []
    if not layers:
        return []
    rows = []
    for layer in layers:
        row = [str(layer)]
        for _, a, b in pairs:
            ea, eb = a[layer], b[layer]
            row += [f"{ea['max_abs']:,.0f}", f"{eb['max_abs']:,.0f}", f"{eb['max_abs'] / ea['max_abs']:.2f}",
                    f"{ea['median_norm']:,.0f}", f"{eb['median_norm']:,.0f}"]
        rows.append(row)
    header = ["layer (stream entering it; the last: the final output)"]
    for reading, _, _ in pairs:
        header += [f"original max \\|h_k\\|, {reading}", f"−25% max \\|h_k\\|, {reading}", "ratio",
                   f"original median ‖h‖, {reading}", f"−25% median ‖h‖, {reading}"]
    return ["", f"The largest activation layer by layer ({shrunk} against the original, the same windows and "
            "readings as above; the shrink's coordinates are a selection of the original's, so a ratio compares the "
            "largest coordinate each keeps, not always the same one):", ""] + table(header, rows)


def bos_recipe_lines(r: dict) -> list[str]:
    """The −25% recipe chosen again with BOS first: the candidates on dev (BOS first and not), the choice, and the
    test split read once with and without BOS on the same targets (one model each; ± the windows' standard
    error)."""
    x = r.get("bos_recipe")
    if not x or "chosen_bos" not in r:
        return []
    dev = {k.removeprefix("dev "): v for k, v in x.items() if k.startswith("dev ")}
    test = {k.removeprefix("test "): v for k, v in x.items() if k.startswith("test ")}
    base = test.get("original")
    chosen = r["chosen_bos"]
    rows = [[name, "BOS-first windows (--calib_bos)" if name.endswith("-bos") else "mid-text windows",
             f"{v['bos']:.4f}", f"{v['plain']:.4f}",
             f"{v['step']['cpu_seconds']:.0f}" if "step" in v else "—",
             "chosen" if name.endswith(f"-{chosen['arm']}") else ""] for name, v in dev.items()]
    out = ["", f"The −25% recipe chosen again with BOS first (--part=bos_recipe): {chosen['tried']} candidates, the "
           f"first {r['dev_windows']} dev windows read with BOS in front (targets 1 … 254), chosen by {chosen['by']} "
           "before test was read; one model each.", ""] + table(
        ["candidate", "calibrated on", "dev, BOS first", "dev, no BOS", "CPU-s (transform)", ""], rows)
    if base:
        out += ["", "Test, the whole split read once per model, with and without BOS on the same targets "
                "(± the standard error by batch means over blocks of consecutive windows):", ""] + table(
            ["model", "windows", "test, BOS first", "gap, BOS first", "test, no BOS", "gap, no BOS"],
            [[name, v["windows"], f"{v['bos']:.4f} ± {se(v, 'bos'):.4f}",
              "—" if name == "original" else gap(v["bos"], base["bos"]),
              f"{v['plain']:.4f} ± {se(v, 'plain'):.4f}",
              "—" if name == "original" else gap(v["plain"], base["plain"])] for name, v in test.items()])
    return out


DISTILLED = ", distilled"  # how real_gemma3 names an arm's distilled model


def general_lines(r: dict, smollm2_general: dict[str, str] | None = None,
                  smollm2_distilled: dict[str, str] | None = None) -> list[str]:
    """The general case (--part=general): the original, the chosen −25% arm calibrated on Shakespeare and its
    distilled model where read, on each general text's test split with and without BOS (the same targets), beside
    SmolLM2's free25 (or, for the distilled model, distill25) gap on as many of the same text's first windows (its
    protocol: mid-text, ± sd over draws). One model each: ± the windows' standard error."""
    x = r.get("general")
    if not x:
        return []
    texts = list(dict.fromkeys(v["text"] for v in x.values()))
    models = [m for m in dict.fromkeys(v["model"] for v in x.values()) if m != "original"]
    rows = []
    for text in texts:
        base = x.get(f"{text} original")
        for v in x.values():
            if v["text"] != text or v["model"] == "original" or base is None:
                continue
            smollm2 = smollm2_distilled if v["model"].endswith(DISTILLED) else smollm2_general
            rows.append([text, f"{v['windows']} of {v['split_windows']}", v["model"],
                         f"{base['plain']:.4f} ± {se(base, 'plain'):.4f}", f"{v['plain']:.4f} ± {se(v, 'plain'):.4f}",
                         gap(v["plain"], base["plain"]), f"{base['bos']:.4f} ± {se(base, 'bos'):.4f}",
                         f"{v['bos']:.4f} ± {se(v, 'bos'):.4f}", gap(v["bos"], base["bos"]),
                         (smollm2 or {}).get(text, "—"), f"{v['plain'] - base['plain']:+.3f}",
                         f"{v['bos'] - base['bos']:+.3f}"])
    for model in models:
        means = general_mean_gaps(r, model)
        smollm2 = smollm2_distilled if model.endswith(DISTILLED) else smollm2_general
        if means:
            rows.append(["mean over texts", "—", model, "—", "—", f"{means['plain']:+.1f}%", "—", "—",
                         f"{means['bos']:+.1f}%", (smollm2 or {}).get("mean", "—"), "—", "—"])
    return ["", "The general case (--part=general): the chosen −25% arm, calibrated on Shakespeare as SmolLM2's "
            "free25 is, and its distilled model (trained on Shakespeare's train split as SmolLM2's distill25 is), "
            "read on the test split of each general text (the first windows of 256 tokens, for time; "
            "targets 1 … 254 of each, with and without BOS in front), one model each: ± the standard error by batch "
            "means over blocks of consecutive windows. SmolLM2's column: its free25 (distill25 beside the distilled "
            "model) on the same text's first windows, as many as Gemma's read (SmolLM2's own tokens, mid-text, mean "
            "± sd over draws; another vocabulary, so not strictly comparable). The gaps are relative: with BOS the "
            "original's loss falls, so a gap in nats grows less than its ratio (the Δ columns).", ""] + table(
        ["text", "test windows", "−25% model", "original, no BOS", "−25%, no BOS", "gap, no BOS",
         "original, BOS first", "−25%, BOS first", "gap, BOS first", "SmolLM2's gap (same recipe)",
         "Δ nats, no BOS", "Δ nats, BOS first"], rows)


def general_mean_gaps(r: dict, model: str | None = None) -> dict[str, float]:
    """``model``'s gap to the original, in percent, averaged over the general texts read both ways ({'plain',
    'bos'}; {} until every text has the original and that model). ``model`` None: the training-free arm (the model
    read that is neither the original nor a distilled one)."""
    x = r.get("general") or {}
    texts = list(dict.fromkeys(v["text"] for v in x.values()))
    if model is None:  # the arm chosen on dev, where the results name it; else the one training-free arm read
        chosen = (r.get("chosen") or {}).get("arm")
        model = f"free-25%-{chosen}" if chosen else next(
            (v["model"] for v in x.values() if v["model"] != "original" and not v["model"].endswith(DISTILLED)), None)
    if model is None or sorted(texts) != sorted(GENERAL_TEXTS):  # every text, or no mean over a different set
        return {}
    pairs = [(x.get(f"{t} original"), x.get(f"{t} {model}")) for t in texts]
    if any(a is None or b is None for a, b in pairs):
        return {}
    return {reading: statistics.fmean(100 * (b[reading] / a[reading] - 1) for a, b in pairs)
            for reading in ("plain", "bos")}


def export_lines(r: dict) -> list[str]:
    """The chosen −25% arm exported to Hugging Face and read back by transformers, against ours."""
    if not r.get("export"):
        return []
    return ["", "Export (--part=export): the chosen −25% arm through convert.py --to_hf, read back by transformers' "
            f"own class; log-probabilities at every position of the first {r['exact_windows']} dev windows against "
            "ours.", ""] + table(
        ["model", "class", "hidden size", "tied head", "parameters", "relative error", "max |Δ log p|",
         "transformers"],
        [[name, x["architecture"], x["hidden_size"], "yes" if x["tie_word_embeddings"] else "no",
          f"{x['parameters'] / 1e6:.1f} M", f"{x['relative_error']:.1e}", f"{x['max_error']:.1e}",
          x["transformers"]] for name, x in r["export"].items()])


def real_gemma3(r: dict, smollm2_geometry: dict | None = None, smollm2_eval: dict | None = None,
                smollm2_distill_gap: str | None = None, smollm2_general: dict[str, str] | None = None,
                smollm2_distilled_general: dict[str, str] | None = None) -> str:
    original = r["original"]
    head = [f"{r['model']}; d = {r['d']}, {original['parameters']:,} parameters (a tied embedding of 262,144 × "
            f"640 is 62% of them). Loss: {r['split']}, the first {r['dev_windows']} windows of {r['block']} tokens "
            "(± the standard error by batch means over blocks of consecutive windows); a uniform guess is "
            f"log V = {r['log_vocabulary']:.2f}. "
            f"Relative error: ‖Δ log p‖/‖log p‖ against the original on the first {r['exact_windows']} windows "
            f"(exact: ≤ {EXACT:g}). Output gains: 'carry' (porting.carry_output_norms: the direction each output "
            "norm writes is exact, its length fitted) or 'average' (each output norm's gains replaced by their "
            "mean, what every earlier version did). Cost: the transform's process CPU seconds, measured while "
            "other runs shared the 2 cores (a shrink also reads its recipe's calibration tokens forward). Nothing "
            "here is trained; the rows below are dev measurements (choices), n = 1 each; test is read below, after "
            "them.", ""]
    rows = [["original", "—", "—", "—", r["d"], f"{original['parameters'] / 1e6:.1f} M", "—", "—",
             f"{original['dev']:.4f} ± {se(original):.4f}", "—", "—", "—"]]
    for name, x in r.get("grow", {}).items():
        exact = "exact" if x["relative_error"] <= EXACT else "not exact"
        error = f"{x['relative_error']:.1e}" + ("" if x.get("positions") == "all" else " (last positions only)")
        rows.append([f"grow: {GROW_NAMES[name]}", x["kind"], x["output_gains"], fit_of(x), x["m"],
                     f"{x['parameters'] / 1e6:.1f} M", error, exact,
                     f"{x['dev']:.4f} ± {se(x):.4f}", gap(x["dev"], original["dev"]),
                     f"{x['step']['cpu_seconds']:.0f}", "record: exact" if x["exact"] else "record: approximate"])
    order = ("carry", "average", "carry-keep32", "carry-groups8", "carry-groups64", "carry-groups160",
             "carry-groups320", "carry-groups640", "carry-fit2", "carry-groups640-fit2")
    arms = sorted(r.get("shrink", {}).values(), key=lambda x: (x["size"] != "-25%", order.index(x["output_gains"])
                                                               if x["output_gains"] in order else len(order)))
    for x in arms:
        mode = x["output_gains"].replace("-", ", ")
        rows.append([f"shrink {x['size']}: tied PCA, training-free", "pca", mode, fit_of(x), x["m"],
                     f"{x['parameters'] / 1e6:.1f} M", "—", "—", f"{x['dev']:.4f} ± {se(x):.4f}",
                     gap(x["dev"], original["dev"]), f"{x['step']['cpu_seconds']:.0f}",
                     "above log V" if x["dev"] > r["log_vocabulary"] else ""])
    for name, x in r.get("diagnose", {}).items():
        rows.append([f"diagnosis: {DIAGNOSES.get(name, name)}", "pca", "carry", fit_of(x), 640,
                     f"{x['parameters'] / 1e6:.1f} M", "—", "—",
                     f"{x['dev']:.4f} ± {se(x):.4f}", gap(x["dev"], original["dev"]),
                     f"{x['step']['cpu_seconds']:.0f}", "above log V" if x["dev"] > r["log_vocabulary"] else ""])
    header = ["arm", "kind", "output gains", "length fit", "m", "parameters", "relative error", "exact (≤ 1e-4)",
              "dev loss", "gap", "CPU-s", "note"]
    tests = carry_tests(r)
    verdicts = [[what, f"{v['delta']:+.4f} ± {v['se']:.4f}",
                 "—" if v.get("p_holm") is None else f"{v['p_holm']:.2g}", v["word"]] for what, v in tests]
    test_lines = []
    if r.get("test"):
        base = r["test"]["original"]
        chosen = r["chosen"]
        present = {f"free{size}-{chosen['arm']}" for size in ("-25%", "-50%")}
        earlier = [name for name in r["test"] if name not in ("original", *present)]
        test_lines = ["", f"Test (the whole split, read once per model): the arm chosen on dev at −25% "
                      f"({chosen['arm']}: {chosen['by']}, of {chosen['tried']} tried), at both sizes, beside the "
                      "original." + (f" {len(earlier)} rows are an earlier choice, made and read on test before the "
                                     "length fit was repaired; the present choice was made on dev after the repair "
                                     "and after that read (the arms it rebuilt and the new ones counted in 'tried'), "
                                     "so its test numbers are a second, post-hoc look at test." if earlier else ""),
                      ""] + table(
            ["model", "test loss", "gap"],
            [["original", f"{base['test']:.4f} ± {se(base):.4f}", "—"]]
            + [[name if name in present else f"{name} (an earlier choice, built by the old length fit)",
                f"{x['test']:.4f} ± {se(x):.4f}", gap(x["test"], base["test"])]
               for name, x in r["test"].items() if name != "original"]
            + [[f"{name} (built by the old length fit; superseded)", f"{x['test']:.4f} ± {se(x):.4f}",
                gap(x["test"], base["test"])] for name, x in r.get("superseded", {}).get("test", {}).items()])
    return "\n".join(head + table(header, rows) + superseded_lines(r) + test_lines
                     + distill_lines(r, smollm2_distill_gap) + bos_lines(r) + smollm2_bos_lines(r)
                     + bos_sinks_lines(r) + bos_recipe_lines(r)
                     + general_lines(r, smollm2_general, smollm2_distilled_general)
                     + export_lines(r)
                     + geometry_lines(r, smollm2_geometry) + eval_geometry_lines(r, smollm2_eval) + [
        "", "Carried − averaged output gains, dev loss paired over the same windows (t-test on window blocks at "
        f"α = {ALPHA}, Holm across the {sum(v['p'] is not None for _, v in tests)} tested; one model each, so the "
        "text's sampling error only):", ""]
        + table(["at", "Δ dev loss", "p (Holm)", "verdict"], verdicts))
