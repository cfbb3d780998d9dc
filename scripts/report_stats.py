"""
The cells and the one significance rule every table of report.py uses: numbers as text, and the verdicts (a t-test
at ALPHA, Holm's correction across a table's tests, n = 1 "not tested"). Pure functions of their arguments.
"""
from __future__ import annotations

import math
import statistics
from contextlib import contextmanager

# ----------------------------------------------------------------------------------------------
# Cells

def ms(x: dict, digits: int = 3) -> str:
    """A mean_spread measurement: 'mean ± std' (n > 1) or 'mean'."""
    if x["n"] > 1:
        return f"{x['mean']:.{digits}f} ± {x['std']:.{digits}f}"
    return f"{x['mean']:.{digits}f}"


def mean_spread_of(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "n": len(values)}


def msl(values: list[float], digits: int = 4) -> str:
    return ms(mean_spread_of(values), digits)


def steps(per_seed: list) -> str:
    return "/".join("—" if x is None else str(x) for x in per_seed)


def pct(x: dict, digits: int = 2) -> str:
    """'+m% ± s' over draws (n > 1), else '+m%'; a spread that is not zero gets the digits it needs not to print
    as 0 (up to three more)."""
    if x["n"] > 1:
        spread, more = 100 * x["std"], digits
        while spread > 0 and round(spread, more) == 0 and more < digits + 3:
            more += 1
        return f"{100 * x['mean']:+.{digits}f}% ± {spread:.{more}f}"
    return f"{100 * x['mean']:+.{digits}f}%"


def gap_words(loss: float, reference: float) -> str:
    return f"{100 * (loss / reference - 1):+.1f}%"


def loss_cells(losses: dict, control: dict) -> str:
    """Four cells: val, its gap to the control, general, its gap."""
    return (f"{losses['val']:.4f} | {gap_words(losses['val'], control['val'])} | {losses['general']:.4f} | "
            f"{gap_words(losses['general'], control['general'])}")


def mb(x: dict) -> str:
    return f"{x['parameters'] / 1e6:.1f} M"


def eval_setting(args: list[str], key: str) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith(f"--{key}="))


def provenance(r: dict) -> str:
    meta = r["meta"]
    minutes = meta.get("build_minutes", r.get("build_minutes", meta.get("seconds", 0) / 60))
    return (f"*Made by `{meta['command']}` on {meta['hardware']}{' (QUICK)' if meta.get('quick') else ''}; "
            f"{minutes:.1f} min.*")


def table(header: list[str], rows: list[list]) -> list[str]:
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


# ----------------------------------------------------------------------------------------------
# The one significance rule

ALPHA = 0.05
RULE = (f"two-sided t-test at α = {ALPHA}: paired over the seeds two arms share, Welch's otherwise, one-sample "
        "against a control that is exact (not a sample) — on test, its error also holds the test windows' (batch "
        "means, Welch–Satterthwaite's degrees of freedom); n = 1 on a sampled side is not tested")


def verdict(a: list[float], b: list[float], paired: bool = False) -> dict:
    """Mean(a) against mean(b): {'delta', 'sd' (of the paired differences; of a − b for Welch), 'n' (na, nb), 'p',
    'test', 'word'}; word is 'lower', 'higher', 'no difference' or 'not tested' (n = 1 on a side)."""
    a, b = [float(x) for x in a], [float(x) for x in b]
    delta = statistics.fmean(a) - statistics.fmean(b)
    out = {"delta": delta, "sd": None, "n": (len(a), len(b)), "p": None, "test": "not tested", "word": "not tested"}
    if len(a) < 2 or len(b) < 2 or paired and len(a) != len(b):
        return out
    from scipy import stats
    if paired:
        diffs = [x - y for x, y in zip(a, b)]
        out["sd"], out["test"] = statistics.stdev(diffs), "paired t"
        biggest = max(abs(d) for d in diffs)
        if max(diffs) - min(diffs) <= 1e-12 * biggest or biggest == 0:  # a constant shift: nothing to test against
            p = 1.0 if biggest == 0 else 0.0
        else:
            p = float(stats.ttest_rel(a, b).pvalue)
    else:
        out["sd"], out["test"] = math.sqrt(statistics.variance(a) + statistics.variance(b)), "Welch t"
        p = float(stats.ttest_ind(a, b, equal_var=False).pvalue)
    out["p"] = 1.0 if p != p else p  # identical samples: NaN
    out["word"] = decide(out["p"], delta)
    return out


FIXED_BLOCK: int | None = None  # a block size for every ``block_se`` (the sensitivity table), else ⌊√n⌋
# the rule's variant (the sensitivity table): "satterthwaite" (the rule), "draws_df" (the same errors on the draws'
# degrees of freedom alone: more conservative), "old" (before 2026-11-29: a difference over the draws alone)
RULE_VARIANT = "satterthwaite"


def block_size(windows: int) -> int:
    """Consecutive windows per block of ``block_se``: ⌊√n⌋ (batch means' usual rule, which lets blocks grow with the
    text), or FIXED_BLOCK where set (at most n // 2, so that there are two blocks)."""
    if windows < 2:
        raise ValueError(f"{windows} window(s): a standard error needs at least 2")
    return max(1, min(FIXED_BLOCK or math.isqrt(windows), windows // 2))


def block_count(windows: int) -> int:
    """How many blocks ``block_se`` averages over ``windows`` windows (a last, partial block left out); its degrees
    of freedom are this − 1."""
    return windows // block_size(windows)


def block_se(values: list[float]) -> float:
    """The standard error of a mean over consecutive test windows by batch means: the spread of the means of
    block_count(n) blocks of block_size(n) consecutive windows, over √blocks. Neighbouring windows of one text are
    correlated (lag-1 autocorrelation 0.25–0.3 in our loss differences, still about 0.2 at lag 5), so the plain
    standard error over windows understates the text's sampling error."""
    size, k = block_size(len(values)), block_count(len(values))
    means = [statistics.fmean(values[i * size:(i + 1) * size]) for i in range(k)]
    return statistics.stdev(means) / math.sqrt(k)


@contextmanager
def rule_variant(name: str):
    """Every test inside under RULE_VARIANT ``name`` — for the verdicts' sensitivity to the rule."""
    global RULE_VARIANT
    if name not in ("satterthwaite", "draws_df", "old"):
        raise ValueError(f"rule variant {name!r} is not one of satterthwaite, draws_df, old")
    before, RULE_VARIANT = RULE_VARIANT, name
    try:
        yield
    finally:
        RULE_VARIANT = before


def degrees_of_freedom(parts: list[tuple[float, int]], draws: int) -> float:
    """The t-test's degrees of freedom over error ``parts`` under RULE_VARIANT: Welch–Satterthwaite's over all of
    them, or (``draws_df``, ``old``) ``draws``, the draws' own."""
    if RULE_VARIANT == "satterthwaite" or not any(v > 0 for v, _ in parts[:-1]):
        return satterthwaite(parts)  # the rule, or draws that do not vary: the windows' own degrees of freedom
    return draws


@contextmanager
def fixed_block(size: int | None):
    """Every ``block_se`` inside with blocks of ``size`` windows (None: ⌊√n⌋) — for the verdicts' sensitivity."""
    global FIXED_BLOCK
    before, FIXED_BLOCK = FIXED_BLOCK, size
    try:
        yield
    finally:
        FIXED_BLOCK = before


def satterthwaite(parts: list[tuple[float, int]]) -> float:
    """Welch–Satterthwaite's degrees of freedom of a sum of variance estimates, each (variance, its degrees of
    freedom): (Σ v)² / Σ v²/df; parts that are zero drop out."""
    parts = [(v, df) for v, df in parts if v > 0]
    if not parts:
        return 1.0
    return sum(v for v, _ in parts) ** 2 / sum(v ** 2 / df for v, df in parts)


def verdict_with_windows(a: list[float], b: list[float], paired: bool, window_se: float, windows: int = 0) -> dict:
    """``verdict`` over draws whose error also holds the test set's sampling error of the difference (``window_se``:
    the standard error of mean(a) − mean(b) over the same ``windows`` test windows, paired window by window, by
    ``block_se``): √(sd²/n + w²) paired, √(s_a²/n_a + s_b²/n_b + w²) otherwise, with Welch–Satterthwaite's degrees
    of freedom over those parts (the draws' n − 1 each, the windows' block_count − 1). The draws alone condition
    on one test text; this is the aims' rule (report.aim_verdict) for a difference."""
    if window_se > 0 and windows < 2:
        raise ValueError("a window error needs the number of windows it was measured on (windows ≥ 2)")
    out = verdict(a, b, paired)
    if out["p"] is None or window_se <= 0 or RULE_VARIANT == "old":
        return out
    from scipy import stats
    if paired:
        parts = [(out["sd"] ** 2 / len(a), len(a) - 1)]
        draws = len(a) - 1
    else:
        parts = [(statistics.variance(a) / len(a), len(a) - 1), (statistics.variance(b) / len(b), len(b) - 1)]
        draws = satterthwaite(parts)
    parts.append((window_se ** 2, block_count(windows) - 1))
    error = math.sqrt(sum(v for v, _ in parts))
    out["p"] = float(2 * stats.t.sf(abs(out["delta"]) / error, degrees_of_freedom(parts, draws)))
    out["test"] += " (draws and test windows)"
    out["window_se"] = window_se
    out["word"] = decide(out["p"], out["delta"])
    return out


def verdict_against_exact(a: list[float], value: float) -> dict:
    """Mean(a) against a value that is not a sample: a control that stays the original bit for bit (distilling a
    model from itself changes nothing), so it has no spread to borrow. One-sample t of a against it; n = 1 on a's
    side is not tested."""
    a = [float(x) for x in a]
    delta = statistics.fmean(a) - value
    out = {"delta": delta, "sd": None, "n": (len(a), 1), "p": None, "test": "not tested", "word": "not tested"}
    if len(a) < 2:
        return out
    if max(a) == min(a):  # identical draws (a deterministic recipe): no spread to test with, never "certain"
        out["test"] = out["word"] = "not tested (no spread)"
        return out
    from scipy import stats
    out["sd"], out["test"] = statistics.stdev(a), "one-sample t (control exact)"
    p = float(stats.ttest_1samp(a, value).pvalue)
    out["p"] = 1.0 if p != p else p
    out["word"] = decide(out["p"], delta)
    return out


def decide(p: float | None, delta: float) -> str:
    if p is None or p != p:  # NaN: a broken input, never a verdict
        return "not tested"
    return "no difference" if p >= ALPHA else "lower" if delta < 0 else "higher"


def paired_windows_t(x: list[float], y: list[float]) -> dict:
    """Mean(x − y) paired over the same evaluation windows: delta, its standard error by batch means
    (``block_se``), a two-sided t-test's p on block_count − 1 degrees of freedom (one model per side: the text's
    sampling error, not the recipe's)."""
    if len(x) != len(y):
        raise ValueError(f"{len(x)} and {len(y)} windows: not the same split")
    from scipy import stats
    diffs = [a - b for a, b in zip(x, y)]
    delta, se = statistics.fmean(diffs), block_se(diffs)
    p = float(2 * stats.t.sf(abs(delta) / se, block_count(len(diffs)) - 1)) if se > 0 else (
        1.0 if delta == 0 else 0.0)
    return {"delta": delta, "se": se, "p": p, "n": (len(x), len(y)), "test": "paired t over window blocks",
            "word": decide(p, delta)}


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        out[i] = running
    return out


def adjust(verdicts: list[dict]) -> list[dict]:
    """Holm across the tested verdicts: each gets 'p_holm' and its word by the adjusted p."""
    tested = [v for v in verdicts if v["p"] is not None]
    for v, p in zip(tested, holm([v["p"] for v in tested])):
        v["p_holm"], v["word"] = p, decide(p, v["delta"])
    return verdicts


def verdict_cell(v: dict) -> str:
    if v["p"] is None:
        return v["word"] if v["word"] != "not tested" else "not tested (n = 1)"
    return f"{v['word']} ({v['test']}, p = {v['p']:.2g}" + (f", Holm {v['p_holm']:.2g})" if "p_holm" in v else ")")
