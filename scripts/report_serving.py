"""
results/quant_frontier (scripts/quant_frontier.py) as a table and a figure: width + quantization against
quantization alone in llama.cpp — loss against bytes, loss against generation speed, the quantization-only frontier.

The one verdict per point: against the quantization-only point it must beat, Q⁺ — of the original's quantizations
at least as large as the point (bytes ≥ its bytes), the smallest. "Below the frontier" when the point's test loss is
lower than Q⁺'s: a t-test of the difference paired over the same test windows, its error by batch means over
blocks of consecutive windows (report_stats.block_se), Holm's correction across every point's test (adjust).
"""
from __future__ import annotations

import os

from report_stats import ALPHA, adjust, block_se, paired_windows_t, table

NAMES = {"original": "original", "free25": "tied PCA −25%, training-free", "distill25": "tied PCA −25% + distillation",
         "free50": "tied PCA −50%, training-free"}
MB = 1e6


def label(p: dict) -> str:
    return f"{p['recipe']}{'+hadamard' if p['rotation'] == 'hadamard' else ''} {p['type']}"


def quantization_only(r: dict) -> list[dict]:
    """The original's unrotated points, smallest file first: the frontier to beat."""
    return sorted((p for p in r["points"] if p["recipe"] == "original" and p["rotation"] == "none"),
                  key=lambda p: p["bytes"])


def comparator(r: dict, p: dict) -> dict:
    """The quantization-only point ``p`` must beat: of the original's files no larger than ``p``'s, the one with the
    lowest test loss (the frontier's lower envelope at that size: what quantization alone gives the same budget);
    where every file is larger, the smallest — ``p`` then has to beat it while being smaller still."""
    fits = [q for q in quantization_only(r) if q["bytes"] <= p["bytes"]]
    return min(fits, key=lambda q: q["losses"]["test"]["loss"]) if fits else quantization_only(r)[0]


def envelope(r: dict) -> list[dict]:
    """The frontier drawn as a line: the quantization-only points no smaller file beats."""
    out = []
    for q in quantization_only(r):
        if not out or q["losses"]["test"]["loss"] < out[-1]["losses"]["test"]["loss"]:
            out.append(q)
    return out


def paired_t(a: dict, b: dict) -> dict:
    """Test loss of a − b paired over the same test windows: delta, its standard error (batch means), a t-test's p."""
    x, y = a["losses"]["test"]["each"], b["losses"]["test"]["each"]
    if len(x) != len(y):
        raise ValueError(f"{label(a)} and {label(b)} hold {len(x)} and {len(y)} test windows: not the same split")
    return dict(paired_windows_t(x, y), test="paired t over test-window blocks")


def frontier_tests(r: dict) -> list[tuple[dict, dict, dict]]:
    """(point, the quantization-only point it must beat, verdict) for every point off the quantization-only
    ladder; Holm across them."""
    pairs = [(p, comparator(r, p)) for p in r["points"] if not (p["recipe"] == "original" and p["rotation"] == "none")]
    out = [(p, q, paired_t(p, q)) for p, q in pairs]
    adjust([v for _, _, v in out])
    return out


def speed_of(r: dict, p: dict) -> dict | None:
    """The point's llama.cpp timing (None before the speed part ran)."""
    return p.get("speed")


def generation_ratio(r: dict, p: dict) -> str:
    """The point's llama.cpp generation tokens/s over the original's at the same type (same run)."""
    base = next((q for q in quantization_only(r) if q["type"] == p["type"]), None)
    mine, theirs = speed_of(r, p), base and speed_of(r, base)
    if not mine or not theirs:
        return "—"
    return f"{mine['generate_tokens_per_s'] / theirs['generate_tokens_per_s']:.2f}×"


def p_text(p: float) -> str:
    """A p-value as text; below 1e-6 only its bound (one text's windows: no more digits are earned)."""
    return f"{p:.2g}" if p >= 1e-6 else "< 1e-6"


def frontier_word(p: dict, q: dict, v: dict) -> str:
    word = {"lower": "below the frontier", "higher": "above the frontier", "no difference": "on it (no difference)"}
    return f"{word[v['word']]} vs original {q['type']} ({q['bytes'] / MB:.1f} MB; test windows, n = 1)"


def recommendations(r: dict) -> list[list]:
    """For each quantization-only file size as a byte budget: the point with the lowest dev loss that fits (the
    choice made on dev), and its test loss beside what quantization alone gives that budget (the envelope)."""
    rows = []
    for q in quantization_only(r):
        fits = [p for p in r["points"] if p["bytes"] <= q["bytes"]]
        best = min(fits, key=lambda p: p["losses"]["dev"]["loss"])
        alone = comparator(r, q)
        rows.append([f"{q['bytes'] / MB:.1f} MB (original {q['type']})", label(best),
                     f"{best['bytes'] / MB:.1f}", f"{best['losses']['test']['loss']:.4f}",
                     f"{alone['losses']['test']['loss']:.4f} ({alone['type']})",
                     f"{best['losses']['test']['loss'] - alone['losses']['test']['loss']:+.4f}"])
    return rows


def quant_frontier(r: dict) -> str:
    full = next(p for p in quantization_only(r) if p["type"] == "F16")
    tests = {label(p): (q, v) for p, q, v in frontier_tests(r)}
    head = [f"{r['model']}, quantized by llama.cpp's own quantizer (llama-cpp-python {r['llama_cpp_python']}); "
            f"losses from llama.cpp's logits (F16 KV cache), {r['text']}: dev = its first "
            f"{full['losses']['dev']['windows']} dev windows (every choice), test = the whole test split in whole "
            f"windows ({full['losses']['test']['windows'] * r['block']:,} tokens), read once per point but one "
            "(below). The original is itself a dequantized Q4_1 file: every point re-quantizes that same base. "
            "MB: the GGUF file. Gap: to the original's F16 file on test. Verdict: each point against what "
            "quantization alone gives its size — the best of the original's files no larger (the smallest file "
            "where none fits) — 'below the frontier' where the point's test loss is lower, by a t-test of the "
            "difference paired over the test windows (its error by batch means over ⌊√n⌋ blocks of consecutive "
            f"windows; one model per point, so not a test over draws) at α = {ALPHA}, Holm across "
            f"{len(tests)} tests. Speed: llama.cpp on {(r.get('speed') or {}).get('threads', 2)} threads, tokens/s, "
            "the median of 3 timings after a warm-up, one run (ratios within it).", ""]
    header = ["model", "rotation", "type", "width", "parameters", "MB", "bits/weight", "held as", "dev loss",
              "test loss", "± SE", "gap", "verdict (Holm)", "generate tok/s", "vs original, same type",
              "prompt tok/s", "peak MB"]
    body = []
    for p in sorted(r["points"], key=lambda p: (list(NAMES).index(p["recipe"]), p["rotation"], -p["bytes"])):
        q, v = tests.get(label(p), (None, None))
        s = speed_of(r, p) or {}
        held = ", ".join(f"{k} {100 * x:.0f}%" for k, x in list(p["types"].items())[:3])
        file_width = -(-p["width"] // 32) * 32  # what --pad_width=32 made of it (report.py reads results alone)
        width = p["width"] if file_width == p["width"] else f"{p['width']} (file: {file_width})"
        body.append([NAMES[p["recipe"]], p["rotation"], p["type"], width, f"{p['parameters'] / 1e6:.1f} M",
                     f"{p['bytes'] / MB:.1f}", f"{p['bits_per_weight']:.2f}", held,
                     f"{p['losses']['dev']['loss']:.4f}", f"{p['losses']['test']['loss']:.4f}",
                     f"{block_se(p['losses']['test']['each']):.4f}",
                     f"{100 * (p['losses']['test']['loss'] / full['losses']['test']['loss'] - 1):+.1f}%",
                     "— (the frontier)" if p["recipe"] == "original" and p["rotation"] == "none" else
                     frontier_word(p, q, v) + ("" if v is None else f", Δ {v['delta']:+.4f} ± {v['se']:.4f}, "
                                               f"Holm p {p_text(v['p_holm'])}"),
                     s.get("generate_tokens_per_s", "—"), generation_ratio(r, p), s.get("prompt_tokens_per_s", "—"),
                     s.get("peak_rss_mb", "—")])
    out = head + table(header, body)
    out += ["", "A byte budget's pick, chosen on dev (the lowest dev loss among the points that fit), read on test "
            "beside the budget's own quantization-only point:", "",
            *table(["budget", "pick (on dev)", "MB", "test loss", "quantization alone at the budget", "pick − alone"],
                   recommendations(r))]
    if r.get("read_notes"):
        out += ["", f"Test reads: {r['test_reads']} recorded on this text in all; beside the plan: "
                + "; ".join(r["read_notes"]) + "."]
    check = r.get("check") or {}
    if check:
        out += ["", "llama.cpp against our import (F32 file, F32 KV cache, the first dev windows): " + "; ".join(
            f"{k}: max |Δ log p| {c['max_abs_dlogp']:.1e}, same argmax {100 * c['same_argmax']:.1f}% over "
            f"{c['windows']} windows" for k, c in check.items()) + "."]
    torch_speed = (r.get("speed") or {}).get("torch") or {}
    if torch_speed:
        out += ["", "Our own sample.py path (PyTorch float32, KV cache, same threads, same run): " + "; ".join(
            f"{k} {x['generate_tokens_per_s']} generate tok/s, {x['prompt_tokens_per_s']} prompt tok/s "
            f"({x.get('prompt_tokens', 256)}-token prompt), peak "
            f"{x['peak_rss_mb']:.0f} MB" for k, x in torch_speed.items()) + "."]
    return "\n".join(out)


def quant_frontier_figure(r: dict, results: str) -> str:
    """results/quant_frontier/quant_frontier.png: test loss against MB and against generation tokens/s."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = 2 if any(p.get("speed") for p in r["points"]) else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.5), squeeze=False)
    for col, (x_of, xlabel) in enumerate([(lambda p: p["bytes"] / MB, "GGUF file, MB"),
                                          (lambda p: (speed_of(r, p) or {}).get("generate_tokens_per_s"),
                                           "llama.cpp generation, tokens/s")][:panels]):
        ax = axes[0][col]
        line = quantization_only(r)
        edge = envelope(r)
        ax.plot([x_of(p) for p in edge], [p["losses"]["test"]["loss"] for p in edge], "k-", lw=1,
                label="quantization only (original): its frontier")
        ax.plot([x_of(p) for p in line], [p["losses"]["test"]["loss"] for p in line], "k.", ms=4)
        for recipe in NAMES:
            for rotation, marker in (("none", "o"), ("hadamard", "s")):
                pts = [p for p in r["points"] if p["recipe"] == recipe and p["rotation"] == rotation
                       and x_of(p) is not None and not (recipe == "original" and rotation == "none")]
                if pts:
                    ax.errorbar([x_of(p) for p in pts], [p["losses"]["test"]["loss"] for p in pts],
                                yerr=[block_se(p["losses"]["test"]["each"]) for p in pts], fmt=marker, ms=4, capsize=2,
                                label=NAMES[recipe] + (" + Hadamard" if rotation == "hadamard" else ""),
                                mfc="none" if rotation == "hadamard" else None)
        for p in line:
            ax.annotate(p["type"], (x_of(p), p["losses"]["test"]["loss"]), fontsize=6, xytext=(2, 2),
                        textcoords="offset points")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("tinyshakespeare test loss (llama.cpp logits, ± SE)")
        ax.legend(fontsize=6)
    fig.suptitle("SmolLM2-135M in llama.cpp: width + quantization against quantization alone", fontsize=9)
    fig.tight_layout()
    path = os.path.join(results, "quant_frontier", "quant_frontier.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
