"""
Keeping a tied head tied through a shrink (issue #40): a PCA map that keeps the final norm's outlying-gain
coordinates as rows of their own (``transform.py --tie_head=True --tie_keep=K``), on SmolLM2-135M.

    python scripts/real_tied_head.py [--part=missing|timing|heldout|distance|all] [--reverse]
    (scripts/real_tied_head.sh; reuses real_model.sh's cache; --part=all, the default, builds everything below)

A tied model of width m has 233,472·m parameters (the embedding once, 30 blocks, no shortcut matrix): m = 432 is
the original's −25% (100.9 M) and m = 288 its −50% (67.2 M), in the form every exporter knows (Hugging Face,
GGUF). Folding the final norm's per-dimension gain γ into the head unties it; keeping it tied needs
diag(γ)·Tᵀ ≈ Tᵀ·diag(γ′), which fails for a PCA map that mixes SmolLM2's two negative gains (γ_247 = −2.1,
γ_17 = −1.3) with the rest (median +1.8): results/real_model's tied row, val 10.45. One factor at a time, every
map the same PCA calibration as results/real_model (32,768 tinyshakespeare train tokens, unit weighting):
- m = 432, ``--tie_keep`` K = 2, 8, 32, 64 (the K coordinates whose gain lies farthest from the median kept as rows
  of T; K = 0 is results/real_model's tied row, quoted);
- m = 432, K = 32 with ``--refit=readers`` (the least-squares readers refit, then the tie);
- m = 288, K = 32, with and without ``--refit=readers``;
- m = 432, K = 32 with the first moment of the calibration text's embeddings only (``--calib_vocabulary=False``,
  SliceGPT's), without and with ``--refit=readers``, and the general case: calibrated on English news
  (evaluated on Botchan, which neither reads);
- m = 432 and m = 288, K = 32 with the map learned (``--learn_steps=16``: T optimised on the calibration KL over
  matrices with orthonormal rows, from the PCA map, before the tie; the K kept rows held as they are), and at
  m = 432 learning all of T (``--learn_hold=False``, one factor: the kept rows move) and learning twice as long
  (``--learn_steps=32``), also on twice the calibration tokens (``--calib_batches=16``); the general case learned
  too (calibrated on English news); at m = 432 and m = 288 the learned map followed by ``--refit=readers`` (the two
  corrections together: does the refit still pay on a learned map?), and with the tie fitted to the original's
  logits (``--retie_target=original``: the refit then leaves the head) at m = 432, with and without the refit;
  at m = 288, whose calibration KL after 16 steps is far above m = 432's, learned twice as long
  (``--learn_steps=32``) and at three times the rate (``--learn_lr=3e-3``), one factor each; the longer one (the
  best −50% row) with calibration seeds 1 and 2 too (``half_learned_draws``, n = 3, as for the best −25% row);
  at m = 432 every norm's per-coordinate gain learned with the map (``--learn_gain_lr``, Adam at 1e-2 and 3e-2,
  one factor against the map alone: the canonical form leaves the m-space norms a scalar gain), the 1e-2 row with
  calibration seeds 1 and 2 too (``gains_draws``, paired by seed with the map alone's draws); the map and its
  gains learned 32 steps, at m = 432 (one factor against 16) and at m = 288 (one factor against the best −50% row);
  and the general case learned with its gains (calibrated on English news, one factor against the map alone);
  the −50% row learned with its gains with calibration seeds 1 and 2 too (``half_gains_draws``, paired by seed with
  ``half_learned_draws``); at m = 432 every residual writer's output gain learned too (``--learn_writer_gains``, at
  the norms' rate: one factor against the norms' gains alone), with calibration seeds 1 and 2 too
  (``writer_gains_draws``, paired by seed with ``gains_draws``); and the map and its gains learned 12 steps (one factor
  against 16: does val, which rises from 16 steps to 32, fall from 16 to 12?). The general case's in-domain bound:
  the PCA map and the map learned with its gains calibrated on the novel's own train split (evaluated on its val
  split, so not the general case: what calibrating on the very text evaluated reaches); and data-free calibration,
  the same two calibrated on the model's own samples (sample.py at temperature 1: real_model.SELF_SAMPLES); the
  learned bound with calibration seeds 1 and 2 too (``novel_bound_draws``); at m = 288 the bound and the own samples,
  each learned 32 steps with the gains (the best −50% recipe). At m = 432 the map and its gains learned with their
  rates decayed along a half cosine to 0 (``--learn_decay=cosine``, one factor against constant rates: do the last
  batches, which pull a constant-rate map toward themselves, decide the draw-to-draw spread?), with calibration
  seeds 1 and 2 too (``cosine_draws``, paired by seed with ``gains_draws``); and the general case calibrated on a
  mix (real_model.MIX: Shakespeare, the news and the own samples in equal shares, never the novel): does a broad
  text read the novel better than any one of its parts? At m = 432 the map and its gains learned on the calibration
  text's own next tokens too (``--learn_label_weight``: (1 − α)·KL + α·cross-entropy per token, α = ½ and 0.2, one
  factor against the KL alone), α = ½ with calibration seeds 1 and 2 too (``label_draws``, paired by seed with
  ``gains_draws``), and α = ½ on the mix (do a broad text's labels help the novel?); the mix at m = 288 too (the
  general case's best calibration text at −50%); and LABEL_RECIPE at m = 576, nothing shrunk (``--learn_steps`` at
  m = d takes labels only: the KL alone is 0 there), with calibration seeds 1 and 2 too (``label_control_draws``,
  paired by seed with ``label_draws``): the labels' same-width control, beside the PCA rotation at m = 576 tied
  (what the tie costs with nothing shrunk). Each learned m = 432 map is also ported with the head untied
  (``--map_file``: the same T, 122.1 M parameters), so that what the tie costs each learned map is measured beside
  it, and the best one's T untied with the readers' refit too.
Calibration draws: the tied m = 432, K = 32 map and the per-block maps at the same parameters (m = 333, SliceGPT's
choices: results/real_model's best −25% row, its seed 0 quoted) with calibration seeds 1 and 2 too, so that the
two are compared with n = 3 draws, paired by seed; and the best −25% row (the learned map) with seeds 1 and 2 too
(n = 3: how far its zero-shot loss moves with the calibration text; built by ``--part=missing`` where absent).
Recovery: the tied m = 432, K = 32 model finetuned with results/real_model_recovery's recipe and LM loss (98,304
tinyshakespeare train tokens, the same data order; its control is quoted from there).
Held-out KL (``--part=heldout``, from the saved models): the PCA map and the maps learned 16 and 32 steps, alone and
with their norm gains (and 32 steps on twice the calibration tokens), measured by KL(original ‖ shrunk) on 16,384
of the calibration tokens and on as many val tokens, beside their val losses.
Text distance (``--part=distance``, token counts only, seconds): each calibration text's unigram Jensen–Shannon
divergence to each evaluated text (its whole val split), from the 32,768 tokens a map calibrates on (seed 0): does
the distance order the zero-shot losses?
Timing (``--part=timing``, alone on the machine): the best −25% row (the learned map) built again on both cores
(``--threads=2``), the whole CLI run timed, with the seconds per phase its record gives; then the recipe
configs/smollm2_shrink_25.py gives (the map learned with its norm gains) the same way
(``gains_recipe_timing``); each only where the results lack it.
Losses: the whole val splits of tinyshakespeare and Botchan, 256-token windows, one thread per process; n = 1
(the maps are deterministic). Writes results/real_model_tied/results.json after every model; ``--part=missing``
builds only the rows that results/real_model_tied/results.json lacks and adds them to it (the rest kept as is).
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from harness import RESULTS  # noqa: E402
from lgpt.method.refit import (  # noqa: E402
    calibration_batches,
    calibration_kl,  # noqa: E402
    gain_outliers,
)
from lgpt.plumbing.checkpoint import load_model  # noqa: E402
from lgpt.plumbing.dataset import BatchLoader  # noqa: E402
from lgpt.plumbing.logger import progress  # noqa: E402
from real_model import (  # noqa: E402
    BLOCK,
    FINETUNE,
    PER_BLOCK_EQUAL_PARAMETERS_M,
    RATIOS,
    SELF_SAMPLES,
    SLICEGPT_CHOICES,
    TEXTS,
    THREADS,
    cell,
    finetuned,
    js_rows,
    self_samples,
)
from real_quantization import save, saved, start  # noqa: E402

TIE = "--tie_head=True"
READERS = "--refit=readers"
LEARN = "--learn_steps=16"  # T learned on the calibration KL (refit.learn_map): two passes over the 8 batches
LEARN_LONGER = "--learn_steps=32"  # four passes: does the held-out loss keep falling with the calibration KL?
# (and with twice the calibration tokens, --calib_batches=16: two passes again, over 65,536 tokens)
LEARN_SHORTER = "--learn_steps=12"  # fewer steps: past 16 the val loss rises while the held-out KL still falls
LEARN_FASTER = "--learn_lr=3e-3"  # three times the default rate: at m = 288 the 16 steps end far from the m = 432 KL
GAINS = "--learn_gain_lr=1e-2"  # every norm's per-coordinate gain learned with T (refit.gain_readers), Adam at 1e-2
GAINS_FASTER = "--learn_gain_lr=3e-2"  # the gains at three times that rate (one factor)
COSINE = "--learn_decay=cosine"  # the rates fall along a half cosine to 0 over the steps (refit.decay_factor)
LABELS = "--learn_label_weight=0.5"  # the learned map's objective (1 − α)·KL + α·CE of the text's next token, α = ½
LABELS_LIGHT = "--learn_label_weight=0.2"  # α = 0.2 (one factor against ½: how much of the text's labels pays)
WRITERS = "--learn_writer_gains=True"  # each attention/MLP output's per-coordinate gain too (refit.gain_writers)
TO_ORIGINAL = "--retie_target=original"  # the tied head's gain fitted to the original's logits (the refit leaves
# the head, which the tie replaces), not to the untied head's
M = RATIOS[0.75]
D = 576  # SmolLM2-135M's own width: a cell at m = D shrinks nothing (a same-width control)
# (m, tie_keep, more options, calibration text), the most telling first: a cut-short run still answers the question
CELLS = [(M, 32, (), "shakespeare"), (M, 2, (), "shakespeare"), (M, 8, (), "shakespeare"),
         (M, 32, (READERS,), "shakespeare"), (RATIOS[0.5], 32, (), "shakespeare"),
         (RATIOS[0.5], 32, (READERS,), "shakespeare"), (M, 32, ("--calib_vocabulary=False",), "shakespeare"),
         (M, 32, (), "news"), (M, 64, (), "shakespeare"),
         (M, 32, (READERS, "--calib_vocabulary=False"), "shakespeare"), (M, 32, (LEARN,), "shakespeare"),
         (RATIOS[0.5], 32, (LEARN,), "shakespeare"), (M, 32, (LEARN, "--learn_hold=False"), "shakespeare"),
         (M, 32, (LEARN_LONGER,), "shakespeare"), (M, 32, (LEARN,), "news"),
         (M, 32, (LEARN_LONGER, "--calib_batches=16"), "shakespeare"), (M, 32, (LEARN, READERS), "shakespeare"),
         (RATIOS[0.5], 32, (LEARN, READERS), "shakespeare"), (M, 32, (LEARN, READERS, TO_ORIGINAL), "shakespeare"),
         (M, 32, (LEARN, TO_ORIGINAL), "shakespeare"), (RATIOS[0.5], 32, (LEARN_LONGER,), "shakespeare"),
         (RATIOS[0.5], 32, (LEARN, LEARN_FASTER), "shakespeare"), (M, 32, (LEARN, GAINS), "shakespeare"),
         (M, 32, (LEARN, GAINS_FASTER), "shakespeare"), (M, 32, (LEARN_LONGER, GAINS), "shakespeare"),
         (RATIOS[0.5], 32, (LEARN_LONGER, GAINS), "shakespeare"), (M, 32, (LEARN, GAINS), "news"),
         (M, 32, (LEARN, GAINS, WRITERS), "shakespeare"), (M, 32, (LEARN_SHORTER, GAINS), "shakespeare"),
         (M, 32, (), "novel"), (M, 32, (LEARN, GAINS), "novel"), (M, 32, (), "samples"),
         (M, 32, (LEARN, GAINS), "samples"), (RATIOS[0.5], 32, (LEARN_LONGER, GAINS), "novel"),
         (RATIOS[0.5], 32, (LEARN_LONGER, GAINS), "samples"), (M, 32, (LEARN, GAINS, COSINE), "shakespeare"),
         (M, 32, (LEARN, GAINS), "mix"), (M, 32, (LEARN, GAINS, LABELS), "shakespeare"),
         (M, 32, (LEARN, GAINS, LABELS_LIGHT), "shakespeare"), (M, 32, (LEARN, GAINS, LABELS), "mix"),
         (RATIOS[0.5], 32, (LEARN_LONGER, GAINS), "mix"), (D, 32, (LEARN, GAINS, LABELS), "shakespeare"),
         (D, 32, (), "shakespeare"), (M, 32, (LEARN, GAINS, WRITERS, LEARN_FASTER), "shakespeare"),
         (M, 32, (LEARN, GAINS), "wiki"), (RATIOS[0.5], 32, (LEARN_LONGER, GAINS), "wiki"),
         (M, 32, (LEARN, GAINS), "nearest")]
# CELLS[29:35]: the general case's in-domain bound (calibrated on the novel's own train split, evaluated on its val
# split: what calibration on the very text evaluated reaches; at m = 288 too) and data-free calibration (the model's
# own samples; at m = 288 too). CELLS[39]: the mix's own labels (does a broad text's next token help the novel?);
# CELLS[40]: the general case's best calibration text at −50%. CELLS[41]: LABEL_RECIPE at m = D, its same-width
# control (the same learning on the text's labels, nothing shrunk: how much of the labels' gain is the text learned,
# not width recovered); CELLS[42]: the PCA rotation at m = D with the tie (what the tie costs with nothing shrunk).
# CELLS[43]: WRITERS_RECIPE with T at three times the rate (one factor: is the −25% map short of steps?).
# CELLS[44:46]: the gains recipes calibrated on Wikipedia (SliceGPT's default calibration domain) instead of the mix
# CELLS[46]: the −25% gains recipe calibrated on the pool's pieces chosen nearest a few pages of the novel
# (real_model.NEAREST_SELECTION): does a text moved toward the novel, without it, read it as its distance predicts?
SEEDS = (1, 2)  # calibration draws beside seed 0 (the table's rows; per-block's is results/real_model's)
RECOVER = CELLS[0]  # the tied −25% model without a refit: the recipe's zero-shot start, then the control's recipe
RECIPE = CELLS[10]  # the best −25% shrink (the map learned, the kept rows held): timed on both cores too
HALF_RECIPE = CELLS[20]  # the best −50% shrink (the map learned 32 steps): its calibration draws too
GAINS_RECIPE = CELLS[22]  # the −25% map learned with its norm gains: its calibration draws too, paired with RECIPE's
HALF_GAINS_RECIPE = CELLS[25]  # the −50% map learned with its norm gains: its draws, paired with HALF_RECIPE's
WRITERS_RECIPE = CELLS[27]  # the −25% map learned with its norm and writer gains: its draws, paired with GAINS_RECIPE's
NOVEL_BOUND = CELLS[30]  # GAINS_RECIPE calibrated on the novel's train split: the general case's in-domain bound
COSINE_RECIPE = CELLS[35]  # GAINS_RECIPE with its rates decayed: its draws, paired with GAINS_RECIPE's
MIX_RECIPE = CELLS[36]  # GAINS_RECIPE calibrated on the mix: the general case's best start (real_distill --part=mix)
HALF_MIX_RECIPE = CELLS[40]  # HALF_GAINS_RECIPE calibrated on the mix: the general case's best −50% row, its draws too
LABEL_RECIPE = CELLS[37]  # GAINS_RECIPE on ½·KL + ½·the text's labels: its draws, paired with GAINS_RECIPE's
LABEL_CONTROL = CELLS[41]  # LABEL_RECIPE at m = D: its same-width control; its draws, paired with LABEL_RECIPE's


DRAWN = (("learned_draws", RECIPE), ("half_learned_draws", HALF_RECIPE), ("gains_draws", GAINS_RECIPE),
         ("half_gains_draws", HALF_GAINS_RECIPE), ("writer_gains_draws", WRITERS_RECIPE),
         ("novel_bound_draws", NOVEL_BOUND), ("cosine_draws", COSINE_RECIPE), ("mix_draws", MIX_RECIPE),
         ("label_draws", LABEL_RECIPE), ("label_control_draws", LABEL_CONTROL), ("half_mix_draws", HALF_MIX_RECIPE))
# (results key, the row drawn with calibration seeds 1 and 2 too), in the order --part=missing builds them; the
# labels' control with the labels' own seeds, so that the shrink's cost under equal learning is paired by seed
HELDOUT = (CELLS[0], RECIPE, CELLS[13], CELLS[15], GAINS_RECIPE, CELLS[24])  # the PCA map, then the map learned 16
# and 32 steps (and 32 on twice the calibration tokens), alone and with its norm gains: --part=heldout measures their
# KL on text the maps never saw
HELDOUT_BATCHES = 4  # windows of 16 × 256 tokens: 16,384 calibration tokens (seed 0's first 4 batches), as many val
HELDOUT_SEED = 50_000  # the val windows' seeds (HELDOUT_SEED + k): no calibration batch uses them
TIMED = (("recipe_timing", RECIPE), ("gains_recipe_timing", GAINS_RECIPE))  # (results key, the row --part=timing
# builds again on both cores)


def options(keep: int, more: tuple[str, ...]) -> tuple[str, ...]:
    return (TIE, f"--tie_keep={keep}", *more)


RECIPE_OPTIONS = list(options(*RECIPE[1:3]))  # the best −25% row's options, as its saved row lists them


def build(src: str, data: dict[str, str], spec: tuple, seed: int = 0, threads: int = THREADS) -> dict:
    m, keep, more, calib = spec
    return cell(src, data, m, "pca", calib=calib, extra=options(keep, more), seed=seed, threads=threads)


def recipe_timing(src: str, data: dict[str, str], spec: tuple = RECIPE) -> dict:
    """``spec`` (by default RECIPE, the best −25% shrink) again on both cores (--threads=2): the issue's "whole −25%
    recipe in ≤ 15 minutes on 2 CPU cores", timed as a user runs it (the CLI's subprocess: start, load, calibrate,
    learn, port, tie, save) with its record's seconds per phase. Run it with nothing else on the machine."""
    return dict(build(src, data, spec, threads=2), threads=2, of=list(options(*spec[1:3])))


def heldout_kl(src: str, rows: list[dict], text: str) -> dict:
    """KL(original ‖ shrunk) per token, the saved (tied) models', on the first HELDOUT_BATCHES calibration batches of
    calibration seed 0 (text the map learned on) and on as many val windows (text it never saw), for each HELDOUT
    row of ``rows``: does what learning longer gains on the calibration KL carry to held-out text, and does the val
    loss follow the held-out KL? ``text``: the prepared tinyshakespeare directory."""
    original = load_model(src)[0].eval()
    loader = BatchLoader(text, BLOCK, 16, "cpu")
    seen = calibration_batches(loader, HELDOUT_BATCHES, 0)
    unseen = [loader.get_batch("val", seed=HELDOUT_SEED + k)[0] for k in range(HELDOUT_BATCHES)]
    out = []
    for spec in progress(HELDOUT, "held-out KL", unit="model"):  # minutes per model: a line with an ETA
        row = next(x for x in rows if has_row([x], spec))
        model = load_model(row["out_dir"])[0].eval()
        with torch.no_grad():
            out.append({"m": row["m"], "options": row["options"], "calibration": calibration_kl(original, model, seen),
                        "heldout": calibration_kl(original, model, unseen), "val": row["losses"]["val"],
                        "general": row["losses"]["general"]})
        print(f"held-out KL, {' '.join(row['options'])}: calibration {out[-1]['calibration']:.4f}, val windows "
              f"{out[-1]['heldout']:.4f}", flush=True)
    return {"tokens": HELDOUT_BATCHES * 16 * BLOCK, "rows": out}


EVALUATED = {"general": "novel", "val": "shakespeare"}  # each loss's text (its val split): --part=distance reads
# every calibration text against each


def unigram_js_bits(a: torch.Tensor, b: torch.Tensor) -> float:
    """Jensen–Shannon divergence in bits between the token frequencies p of ``a`` and q of ``b`` (token ids):
    JS = ½·KL(p ‖ μ) + ½·KL(q ‖ μ), μ = ½·(p + q); 0 for the same frequencies, 1 for disjoint vocabularies."""
    size = int(max(a.max(), b.max())) + 1
    p, q = (torch.bincount(x.reshape(-1).long().cpu(), minlength=size).double().numpy() for x in (a, b))
    return float(js_rows(p[None], q)[0])


def text_distance(data: dict[str, str], batches: int = 8, seed: int = 0) -> dict:
    """Each calibration text's distance to each evaluated text (EVALUATED: the whole val split a loss is measured
    on): the unigram JS divergence between the tokens a map calibrates on (``batches`` × 16 × 256 of calibration
    seed ``seed``, the cells' own: equal counts for every text, so sampling noise weighs alike) and the evaluated
    tokens, and the share of the evaluated tokens whose id the calibration tokens contain. Token counts only."""
    seen = {text: torch.cat(calibration_batches(BatchLoader(data[text], BLOCK, 16, "cpu"), batches, seed))
            for text in TEXTS}
    out = {}
    for loss, evaluated in EVALUATED.items():
        target = torch.from_numpy(BatchLoader(data[evaluated], BLOCK, 16, "cpu").tokens("val").astype("int64"))
        texts = {text: {"js_bits": unigram_js_bits(tokens, target),
                        "covered": torch.isin(target, tokens.unique()).double().mean().item()}
                 for text, tokens in seen.items()}
        out[loss] = {"text": evaluated, "evaluated_tokens": len(target), "texts": texts}
        for text, x in texts.items():
            print(f"{text} → {evaluated}'s val split: JS {x['js_bits']:.4f} bits, {x['covered']:.1%} of its tokens "
                  "seen", flush=True)
    return {"calibration_tokens": batches * 16 * BLOCK, "seed": seed, "losses": out}


def per_block(src: str, data: dict[str, str], seed: int) -> dict:
    """results/real_model's best −25%-parameter row (per-block maps with SliceGPT's choices) with calibration seed."""
    return cell(src, data, PER_BLOCK_EQUAL_PARAMETERS_M, "pca", "per_block", extra=SLICEGPT_CHOICES, seed=seed)


def final_gain(src: str, outliers: int = 4) -> dict:
    """What --tie_keep reads: the final norm's gain γ (median, 5th and 95th percentiles) and its most outlying
    coordinates, farthest from the median first (refit.gain_outliers' order)."""
    model, _ = load_model(src)
    gain = model.transformer.ln_f.weight.detach().double()
    low, median, high = torch.quantile(gain, torch.tensor([0.05, 0.5, 0.95], dtype=gain.dtype)).tolist()
    return {"median": median, "p05": low, "p95": high, "outliers": [
        {"coordinate": i, "gain": gain[i].item()} for i in gain_outliers(model, outliers)]}


def real_model_results() -> dict:
    with open(os.path.join(RESULTS, "real_model", "results.json")) as f:
        return json.load(f)


def quoted_per_block() -> dict:
    """Seed 0 of ``per_block``, as results/real_model holds it (its model is not rebuilt)."""
    rows = real_model_results()["rows"]
    return next(x for x in rows if x["porting"] == "per_block" and x["m"] == PER_BLOCK_EQUAL_PARAMETERS_M
                and x["options"] == list(SLICEGPT_CHOICES) and x["calibration"] == "shakespeare")


def draws(src: str, data: dict[str, str], rows: list[dict]) -> dict:
    """val and general losses of both arms over calibration seeds 0, 1, 2 (seed 0: the table's row and the quote)."""
    tied = [rows[0]] + [build(src, data, CELLS[0], seed) for seed in SEEDS]
    blocks = [quoted_per_block()] + [per_block(src, data, seed) for seed in SEEDS]
    return {"seeds": [0, *SEEDS], **{name: [{k: x["losses"][k] for k in ("val", "general")} for x in arm]
                                     for name, arm in (("tied", tied), ("per_block", blocks))},
            "per_block_parameters": blocks[-1]["parameters"]}


def learned_draws(src: str, data: dict[str, str], rows: list[dict], seeds: tuple[int, ...] = SEEDS,
                  spec: tuple = RECIPE) -> dict:
    """``spec``'s (by default RECIPE's) val and general losses over calibration seeds 0, 1, 2 (seed 0: the table's
    row): how far the best shrink's zero-shot loss moves with the calibration text it learns on."""
    of = list(options(*spec[1:3]))
    first = next(x for x in rows if x.get("options") == of and x["m"] == spec[0] and x["calibration"] == spec[3])
    runs = [first] + [build(src, data, spec, seed) for seed in seeds]
    return {"seeds": [0, *seeds], "of": of, "m": spec[0],
            "learned": [{k: x["losses"][k] for k in ("val", "general")} for x in runs]}


def recovered(src: str, data: dict[str, str]) -> dict:
    """RECOVER's model finetuned with the control's recipe and loss (results/real_model_recovery's)."""
    start = build(src, data, RECOVER)
    label = f"pca-m{RECOVER[0]}-tied-keep{RECOVER[1]}-lm"
    return dict(finetuned(start["out_dir"], data, label), zero_shot=start["losses"], recipe=FINETUNE)


def untied_port(src: str, data: dict[str, str], row: dict, more: tuple[str, ...] = ()) -> dict:
    """``row``'s learned T ported again with the head untied (``--map_file``, everything else as results/real_model's
    cells, and ``more``), one factor: what the tie costs that map. ``kept_rows``: the least over the kept
    coordinates of their column's largest entry in T (1: each still a row e_iᵀ of its own)."""
    record = load_model(row["out_dir"])[1]["transform"]
    path = os.path.join(row["out_dir"], "T.pt")
    if not os.path.exists(path):  # the learned run's own T, written once beside it
        torch.save(record["T"].double(), path)
    kept = record["T"].double()[:, record["pca_keep"]].abs().max(0).values.min().item()
    port = cell(src, data, row["m"], "pca", extra=(f"--map_file={path}", *more))
    return dict(port, of=row["options"], kept_rows=kept)


def port_extra(port: dict) -> list[str]:
    """An untied port's options other than its map file ([] for the plain port of a learned T)."""
    return [o for o in port["options"] if not o.startswith("--map_file=")]


def untied_ports(src: str, data: dict[str, str], payload: dict, started: float) -> None:
    """An untied port of every learned m = M row that ``payload`` has none of, and RECIPE's T untied with the
    readers' refit too (does the refit hurt the learned map without a tie to fit afterwards?); saved after each."""
    ports = payload.setdefault("untied_ports", [])
    for row in [x for x in payload["rows"] if x.get("options") == RECIPE_OPTIONS and x["m"] == M]:
        if not any(p["of"] == RECIPE_OPTIONS and port_extra(p) == [READERS] for p in ports):
            ports.append(untied_port(src, data, row, (READERS,)))
            save(payload, started, "real_model_tied", "scripts/real_tied_head.sh")
    for row in [x for x in payload["rows"] if LEARN in x.get("options", []) and x["m"] == M
                and x.get("calibration") == "shakespeare" and READERS not in x["options"]
                and TO_ORIGINAL not in x["options"]
                and not any(o.startswith("--learn_gain_lr") for o in x["options"])]:
        # the 16-step maps calibrated as the PCA rows (a row that changes only what follows the map — the refit,
        # the tie's target — has its learned twin's T: ported already; learned gains are in the weights, not in T,
        # so a --map_file port would not be that model)
        if not any(p["of"] == row["options"] and not port_extra(p) for p in ports):
            ports.append(untied_port(src, data, row))
            save(payload, started, "real_model_tied", "scripts/real_tied_head.sh")


def self_samples_record(src: str) -> dict:
    """What the data-free calibration text cost: sample.py's options, wall seconds and peak memory (its cached step)."""
    step = self_samples(src)[1]["sample"]
    return {"args": SELF_SAMPLES, "seconds": step["seconds"], "peak_mb": step["peak_mb"], "threads": THREADS}


def has_row(rows: list[dict], spec: tuple) -> bool:
    """Whether saved ``rows`` hold the cell ``spec`` (its width, options and calibration text)."""
    m, keep, more, calib = spec
    return any(x["m"] == m and x.get("options") == list(options(keep, more)) and x["calibration"] == calib
               for x in rows)


def row_of(spec: tuple, row: dict) -> dict:
    m, keep, more, calib = spec
    print(f"m={m} tie_keep={keep} {' '.join(more)} ({calib}): val {row['losses']['val']:.4f}, "
          f"general {row['losses']['general']:.4f}", flush=True)
    return dict(row, tie_keep=keep, refit="readers" if READERS in more else "none")


def missing(src: str, data: dict[str, str], started: float, reverse: bool) -> None:
    """--part=missing: the CELLS and the DRAWN draws that results/real_model_tied/results.json lacks, built and added to
    it (the rest kept as is); ``reverse``: built from the end, nothing saved."""
    payload = saved("real_model_tied", "scripts/real_tied_head.sh")
    todo = [spec for spec in CELLS if not has_row(payload["rows"], spec)]
    if not reverse:  # the rows already saved first: their ports are minutes, a missing cell can take an hour
        untied_ports(src, data, payload, started)
    for spec in reversed(todo) if reverse else todo:
        row = build(src, data, spec)
        if not reverse:
            payload["rows"].append(row_of(spec, row))
            save(payload, started, "real_model_tied", "scripts/real_tied_head.sh")
    if not reverse:
        untied_ports(src, data, payload, started)
        if "self_samples" not in payload and any(x["calibration"] == "samples" for x in payload["rows"]):
            payload["self_samples"] = self_samples_record(src)
            save(payload, started, "real_model_tied", "scripts/real_tied_head.sh")
    for key, spec in DRAWN:
        if key in payload:
            continue
        if reverse:  # build only, from the last seed
            for seed in reversed(SEEDS):
                build(src, data, spec, seed)
        else:
            payload[key] = learned_draws(src, data, payload["rows"], spec=spec)
            save(payload, started, "real_model_tied", "scripts/real_tied_head.sh")


def main() -> None:
    args, started, src, data = start(__doc__.split("\n\n")[0], ("missing", "timing", "heldout", "distance", "all"))
    if args.part == "distance":  # token counts only, no model: seconds
        payload = saved("real_model_tied", "scripts/real_tied_head.sh")
        payload["text_distance"] = text_distance(data)
        save(payload, started, "real_model_tied", "scripts/real_tied_head.sh")
        return
    if args.part == "heldout":  # the saved models' KL on seen and unseen text (minutes per model)
        payload = saved("real_model_tied", "scripts/real_tied_head.sh")
        payload["heldout_kl"] = heldout_kl(src, payload["rows"], data["shakespeare"])
        save(payload, started, "real_model_tied", "scripts/real_tied_head.sh")
        return
    if args.part == "timing":  # alone on the machine: both cores are the run's
        payload = saved("real_model_tied", "scripts/real_tied_head.sh")
        for key, spec in TIMED:
            if key not in payload:
                payload[key] = recipe_timing(src, data, spec)
                save(payload, started, "real_model_tied", "scripts/real_tied_head.sh")
        return
    if args.part == "missing":
        missing(src, data, started, args.reverse)
        return
    if args.reverse:  # build only, from the end: the forward run writes the results in the table's order
        recovered(src, data)
        for seed in reversed(SEEDS):
            for _, spec in DRAWN:
                build(src, data, spec, seed)
            per_block(src, data, seed)
            build(src, data, CELLS[0], seed)
        for spec in reversed(CELLS):
            build(src, data, spec)
        return
    base = real_model_results()["base"]  # the original's losses and parameters, quoted: gaps are read against them
    payload = {"model": "SmolLM2-135M-Instruct (GGUF Q4_1, dequantized to float32)", "rows": [],
               "base": {"losses": base["losses"], "parameters": base["parameters"]}, "final_gain": final_gain(src)}
    for spec in CELLS:
        payload["rows"].append(row_of(spec, build(src, data, spec)))
        save(payload, started, "real_model_tied", "scripts/real_tied_head.sh")
    payload["self_samples"] = self_samples_record(src)  # what the rows calibrated on the own samples cost to sample
    untied_ports(src, data, payload, started)
    payload["draws"] = draws(src, data, payload["rows"])
    save(payload, started, "real_model_tied", "scripts/real_tied_head.sh")
    for key, spec in DRAWN:
        payload[key] = learned_draws(src, data, payload["rows"], spec=spec)
    save(payload, started, "real_model_tied", "scripts/real_tied_head.sh")
    payload["recovery"] = recovered(src, data)
    save(payload, started, "real_model_tied", "scripts/real_tied_head.sh")
    payload["heldout_kl"] = heldout_kl(src, payload["rows"], data["shakespeare"])
    payload["text_distance"] = text_distance(data)
    save(payload, started, "real_model_tied", "scripts/real_tied_head.sh")
    for key, spec in TIMED:  # last: both cores (a --reverse process has finished by now)
        payload[key] = recipe_timing(src, data, spec)
        save(payload, started, "real_model_tied", "scripts/real_tied_head.sh")


if __name__ == "__main__":
    main()
