"""
Recovery at −50% on a GPU (issue #40: "on a GPU, ≤ 50 M tokens bring −50% within 2%" of the control):
SmolLM2-135M shrunk to m = 288 with its head kept tied (results/real_model_tied's −50% row: PCA calibrated on
128 × 256 tinyshakespeare train tokens, ``--tie_head=True --tie_keep=32``, 67.3 M parameters), distilled from the
original on tinyshakespeare's train split.

    python scripts/real_distill_gpu.py --gguf=SmolLM2-135M-Instruct.Q4_1.gguf --data=DIR --out=DIR [--budget_s=S]

One self-contained run for one call of a lent GPU (scripts/real_distill_gpu.sh sends it): it imports the GGUF
(convert.py --from_gguf), shrinks it (transform.py --device=cuda, the CPU row's options), distils and evaluates,
each step as the command a user types. ``--data`` holds the prepared texts (DIR/shakespeare, DIR/novel: real_model's
``prepared`` directories, made on the CPU machine, so the tokens are the CPU rows' tokens). The recipe is
real_distill's (pure distillation: α = 1, τ = 1; AdamW without weight decay; cosine decay to a tenth of the rate;
fixed eval batches) with what a GPU changes: batches of ``BATCH`` × 256 tokens in bfloat16 autocast, a warmup of
``WARMUP_SHARE`` of the steps, and as many steps as fit in ``--budget_s`` seconds (measured by a probe of
``PROBE_ITERS`` steps), at most ``MAX_TOKENS`` tokens — the issue's bound; the record says how many were used. Each
rate of ``--lrs`` (default ``LRS``: the tuning effort, those values) runs at once in its own process on the one
GPU; ``--compile`` compiles the student (the teacher stays eager), and the control's check then runs compiled too.
The 305 k train tokens are passed over many times: the run's own evaluations (``EVALS_PER_RUN``, fixed val
batches) show whether val turns up again, and its train curve whether the student still fits the seen windows.
``--start=learned`` starts the arms from the map learned with its norm gains (``LEARNED``); ``--width=432`` shrinks
to −25% parameters instead; ``--text=mix`` calibrates and distils on real_model's calibration mix (the general
case); ``--teacher_tokens=N`` adds N tokens of the original's own continuations of train windows after the train
split (``teacher_text``), more distinct text in its style, generated on the GPU before the probe (so the arms get
the time that is left).

The control is the original distilled from itself with the identical recipe. Its KL gradient is zero (exactly:
distill.teacher_kl), so AdamW without weight decay takes no step and the control is the original bit for bit; the
run checks this on the GPU too (``CONTROL_CHECK_ITERS`` steps of the recipe, weights compared bit for bit) and
then takes the original's losses as the control's. Losses over the whole val splits of tinyshakespeare and
Botchan (256-token windows) in float32 on the GPU, TF32 off, as on the CPU; the original's GPU loss beside its
CPU one (results/real_model) says the two evaluations agree. Writes DIR/results.json (and DIR/log.txt).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("NANOLGPT_PROGRESS", "0")

import torch  # noqa: E402
from real_distill import unchanged  # noqa: E402
from real_tied_head import GAINS_RECIPE, HALF_GAINS_RECIPE  # noqa: E402

from harness import (
    ROOT,  # noqa: E402
    repo_relative,  # noqa: E402
)
from lgpt.plumbing.checkpoint import load_checkpoint, load_model, save_checkpoint  # noqa: E402
from lgpt.plumbing.dataset import (  # noqa: E402
    HF_TOKENIZER_FILE,
    BatchLoader,
    evaluate_loss,
    load_meta,
    tokenizer_fingerprint,
)
from real_model import BLOCK, CALIB, EVALS, RATIOS  # noqa: E402

M = RATIOS[0.5]  # 288: the −50% width (--width: the default)
TIE = ("--tie_head=True", "--tie_keep=32")  # results/real_model_tied's −50% row (real_tied_head.CELLS[4])
# --start: the zero-shot map the arms start from, PCA's (real_tied_head.CELLS[4] at −50%) or each width's best
# zero-shot recipe, the map learned with its norm gains (GAINS_RECIPE: 16 steps at −25%; HALF_GAINS_RECIPE: 32 at
# −50%), both with the head tied as TIE keeps it: the options each adds to TIE
STARTS = ("pca", "learned")
LEARNED = {spec[0]: spec[2] for spec in (GAINS_RECIPE, HALF_GAINS_RECIPE)}
TEXTS = ("shakespeare", "mix")  # --text: what the map is calibrated and the arms distil on (mix: real_model.MIX)
DISTILL = ("--distill=True", "--distill_alpha=1.0", "--distill_temperature=1.0")  # real_distill's loss
LRS = (1e-4, 3e-4)  # the CPU recipe's chosen rate, and three times it for a run of many more steps
BATCH = 64  # windows of 256 tokens per step: 16,384 tokens
MAX_TOKENS = 50_000_000  # the issue's bound on distilled tokens
# --teacher_tokens: the original's continuations of train windows after the train split (sample.py --continue_data)
TEACHER_PROMPT, TEACHER_NEW = 32, 96  # tokens of each prompt window and of its continuation: at temperature 1 over
# the whole vocabulary (seen on an H100) continuations leave Shakespeare within a hundred tokens or so, so they are
# kept short and sampled with sample.py's defaults (temperature 0.8, top 200)
TEACHER_BATCH = 512  # continuations generated at once
WARMUP_SHARE = 0.02  # of the steps (the CPU recipe: 4 of 48 at batch 8; 32 of 384 at batch 1)
EVALS_PER_RUN = 8  # evaluations along each run (fixed val batches: EVAL_ITERS × BATCH windows, eval seed 0)
EVAL_ITERS = 2  # 128 windows: about the whole val split's 140
PROBE_ITERS = 24  # steps of the probe that measures tokens per second (the first 4 are warm-up and not counted)
CONTROL_CHECK_ITERS = 8  # steps of the original distilled from itself, to check on the GPU that it does not move
EVAL_RESERVE_S = 60  # seconds kept for the final evaluations and the record
SPEED_MARGIN = 0.85  # of the probe's speed planned with: the arms' own evaluations and start (loading the teacher)


def recipe(lr: float, iters: int, device: str, batch: int = BATCH, compile: bool = False) -> list[str]:
    """real_distill's recipe on the GPU: ``iters`` steps of ``batch`` windows at ``lr`` (cosine to lr / 10), the
    student compiled or not (``compile``; the teacher runs eagerly either way)."""
    return [f"--block_size={BLOCK}", f"--batch_size={batch}", f"--max_iters={iters}", f"--lr_decay_iters={iters}",
            f"--learning_rate={lr:g}", f"--min_lr={lr / 10:g}", f"--warmup_iters={max(1, round(iters * WARMUP_SHARE))}",
            f"--eval_interval={max(1, iters // EVALS_PER_RUN)}", f"--eval_iters={EVAL_ITERS}", "--eval_seed=0",
            "--eval_train=False", "--seed=1337", f"--log_interval={max(1, iters // 40)}", "--progress_bar=False",
            f"--device={device}", f"--dtype={'bfloat16' if device.startswith('cuda') else 'float32'}",
            f"--compile={compile}", "--always_save_checkpoint=False", f"--distill_chunk={batch * BLOCK}", *DISTILL]


def planned_iters(tokens_per_s: float, budget_s: float, batch: int = BATCH, max_tokens: int | None = None) -> int:
    """The steps of one arm: as many as ``budget_s`` seconds hold at ``tokens_per_s`` (every arm running at once),
    at most ``max_tokens`` tokens, at least one."""
    per_step = batch * BLOCK
    return max(1, min((max_tokens or MAX_TOKENS) // per_step, math.floor(budget_s * tokens_per_s / per_step)))


class Log:
    """Every line printed with the minutes since the start, and kept for DIR/log.txt."""

    def __init__(self) -> None:
        self.started, self.lines = time.time(), []

    def __call__(self, line: str) -> None:
        line = f"[{(time.time() - self.started) / 60:5.1f} min] {line}"
        self.lines.append(line)
        print(line, flush=True)


def command(args: list[str], log: Log, name: str) -> subprocess.Popen:
    """One step as a user types it, in its own process; its output goes to its own log file."""
    log(f"{name}: python {' '.join(args)}")
    with open(os.path.join(WORK, f"{name}.log"), "w") as out:  # the child keeps its own copy of the file
        return subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env=dict(os.environ, NANOLGPT_PROGRESS="0"))


def finish(procs: dict[str, subprocess.Popen], log: Log, deadline: float = math.inf) -> dict[str, float]:
    """Wait for every step; the seconds each took. A step still running at ``deadline`` (a time.time()) is asked to
    stop (SIGTERM: finetune.py saves where it is and exits; its record says so); a step that fails otherwise ends
    the run with the last lines of its log."""
    started, seconds = time.time(), {}
    for name, proc in procs.items():
        try:
            proc.wait(timeout=max(0.0, deadline - time.time()) if deadline < math.inf else None)
        except subprocess.TimeoutExpired:
            log(f"{name}: past the deadline, stopped (SIGTERM)")
            proc.terminate()
            proc.wait()
            seconds[name] = round(time.time() - started, 1)
            continue
        if proc.returncode != 0:
            with open(os.path.join(WORK, f"{name}.log")) as f:
                tail = f.read().splitlines()[-12:]
            raise SystemExit(f"{name} failed ({proc.returncode}):\n" + "\n".join(tail))
        seconds[name] = round(time.time() - started, 1)
        log(f"{name}: done")
    return seconds


def run(args: list[str], log: Log, name: str) -> float:
    return finish({name: command(args, log, name)}, log)[name]


def same_ids(a: dict, b: dict) -> bool:
    """Whether two Hugging Face tokenizer records turn text into the same ids: the same vocabulary, merges and
    special ids (what other transformers versions write differently beside them, e.g. decoder flags, does not)."""
    x, y = (json.loads(meta["files"][HF_TOKENIZER_FILE])["model"] for meta in (a, b))
    return (x.get("vocab"), x.get("merges"), a.get("special_ids")) == (y.get("vocab"), y.get("merges"),
                                                                       b.get("special_ids"))


def adopt_data_tokenizer(model_dir: str, data_dir: str) -> str:
    """The imported model takes the prepared data's tokenizer record when another transformers version built other
    tokenizer files from the GGUF (the ids must be the same: same_ids); the weights come from the GGUF alone and the
    tokens were made on the CPU machine, so nothing the run computes changes. Says what it did."""
    ckpt, data_meta = load_checkpoint(model_dir), load_meta(data_dir)
    if tokenizer_fingerprint(ckpt.get("meta")) == tokenizer_fingerprint(data_meta):
        return "as imported"
    if ckpt.get("meta", {}).get("tokenizer") != "hf" or not same_ids(ckpt["meta"], data_meta):
        raise SystemExit(f"the GGUF's tokenizer as imported here ({tokenizer_fingerprint(ckpt.get('meta'))}) gives "
                         f"other ids than the data's in {data_dir}: prepare the data with this model's tokenizer")
    ckpt["meta"] = {k: v for k, v in data_meta.items() if k != "tokens"}
    save_checkpoint(ckpt, model_dir)
    return (f"the data's ({tokenizer_fingerprint(data_meta)}): this transformers wrote other tokenizer files from the "
            "GGUF, with the same vocabulary, merges and special ids")


def full_losses(model_dir: str, data: dict[str, str], device: str) -> dict[str, float]:
    """The model's loss on each evaluation text's whole val split (256-token windows), float32, TF32 off."""
    torch.backends.cuda.matmul.allow_tf32 = False
    model = load_model(model_dir)[0].to(device)
    return {name: evaluate_loss(model, BatchLoader(data[text], BLOCK, 8, device), "val", None)
            for name, text in EVALS.items()}


def check_control(src: str, data_dir: str, lr: float, device: str, batch: int, compile: bool, log: Log) -> dict:
    """CONTROL_CHECK_ITERS steps of the original distilled from itself with the arms' recipe: its weights must stay
    the original's bit for bit (then the control's losses are the original's). A control that moves — a compiled
    student against an eager teacher need not give a zero KL gradient — stops the run before any arm is distilled:
    its gaps would be against a control nobody ran."""
    check = os.path.join(WORK, "control-check")
    seconds = run(["finetune.py", f"--in_dir={src}", f"--teacher_dir={src}", f"--data_dir={data_dir}",
                   f"--out_dir={check}", "--overwrite=True",
                   *recipe(lr, CONTROL_CHECK_ITERS, device, batch, compile)], log, "control-check")
    if not unchanged(src, check):
        raise SystemExit(f"the original distilled from itself moved in {CONTROL_CHECK_ITERS} steps"
                         f"{' with --compile' if compile else ''}: the control is not the original; run without "
                         "--compile (the eager control is exact)")
    log(f"the original distilled from itself for {CONTROL_CHECK_ITERS} steps is unchanged")
    return {"check_iters": CONTROL_CHECK_ITERS, "unchanged": True, "seconds": seconds}


def teacher_text(src: str, data_dir: str, tokens: int, device: str, log: Log) -> tuple[str, dict]:
    """The arms' train data with ``tokens`` (rounded up to whole continuations) of the original's own text after the
    train split: continuations (sample.py's temperature and top-k; bfloat16 autocast on a GPU) of random
    TEACHER_PROMPT-token windows of it, by sample.py --continue_data; the val split is the data's. (the folder, its
    record)."""
    out, samples = os.path.join(WORK, "teacher-data"), -(-tokens // TEACHER_NEW)
    seconds = run(["sample.py", f"--out_dir={src}", f"--continue_data={data_dir}", f"--data_out={out}",
                   f"--num_samples={samples}", f"--batch_size={TEACHER_BATCH}", f"--prompt_tokens={TEACHER_PROMPT}",
                   f"--max_new_tokens={TEACHER_NEW}", "--seed=0", f"--device={device}",
                   f"--dtype={'bfloat16' if device.startswith('cuda') else 'float32'}", "--overwrite=True"],
                  log, "teacher-text")
    return out, {"samples": samples, "prompt_tokens": TEACHER_PROMPT, "new_tokens": TEACHER_NEW,
                 "generated": samples * TEACHER_NEW, "train_tokens": samples * (TEACHER_PROMPT + TEACHER_NEW),
                 "seconds": seconds}


def split_tokens(data_dir: str, split: str = "train") -> int:
    """How many tokens a prepared dataset's split holds (as the loaders read it, its manifest checked)."""
    return len(BatchLoader(data_dir, BLOCK, 1).tokens(split))


def records(out_dir: str) -> list[dict]:
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def probe_speed(out_dir: str) -> float:
    """Median tokens per second of a run's logged steps after the first four (warm-up)."""
    speeds = [r["tokens_per_s"] for r in records(out_dir) if "tokens_per_s" in r and r.get("iter", 0) >= 4]
    if not speeds:
        raise SystemExit(f"the probe in {out_dir} logged no step after the warm-up: raise PROBE_ITERS")
    return statistics.median(speeds)


def curve(out_dir: str, batch: int = BATCH) -> list[list[float]]:
    """(tokens, val loss on the fixed eval batches) at each of the run's evaluations."""
    return [[r["iter"] * batch * BLOCK, r["val/loss"]] for r in records(out_dir) if "val/loss" in r]


def train_curve(out_dir: str, batch: int = BATCH) -> list[list[float]]:
    """(tokens, the student's cross-entropy on its train batch, its KL to the teacher there) at each logged step:
    beside the val curve, whether the passes over the train split fit it better than val."""
    return [[r["iter"] * batch * BLOCK, r["train/lm_loss"], r.get("train/kd_loss", math.nan)]
            for r in records(out_dir) if "train/lm_loss" in r]


def progress(procs: dict[str, subprocess.Popen], dirs: dict[str, str], iters: int, log: Log,
             stop: threading.Event) -> None:
    """A progress line with an ETA every half minute while the arms run."""
    started = time.time()
    while not stop.wait(30):
        done = []
        for name in procs:
            try:
                done.append(max((r.get("iter", 0) for r in records(dirs[name])), default=0))
            except (OSError, ValueError):
                done.append(0)
        step = min(done)
        eta = (time.time() - started) / step * (iters - step) if step else float("nan")
        log(f"distilling: step {step}/{iters} of every arm, ETA {eta / 60:.1f} min")


def main() -> None:
    global WORK
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", required=True, help="SmolLM2-135M-Instruct.Q4_1.gguf (fetch.py --what=smollm2)")
    parser.add_argument("--data", required=True, help="a folder with the prepared texts shakespeare/ and novel/")
    parser.add_argument("--out", required=True, help="where results.json and log.txt go")
    parser.add_argument("--work", default="/tmp/real_distill_gpu", help="checkpoints and step logs")
    parser.add_argument("--budget_s", type=float, default=520.0, help="seconds for the whole run: the arms get what "
                        "is left after the probe, less EVAL_RESERVE_S and a margin for their own evaluations")
    parser.add_argument("--start", default="pca", choices=STARTS, help="the zero-shot map the arms start "
                        "from: pca, or learned (T and the norm gains learned on the calibration KL: LEARNED, the "
                        "width's best zero-shot recipe)")
    parser.add_argument("--width", type=int, default=M, choices=sorted(LEARNED), help="m: 288 (−50%% parameters, "
                        "the default) or 432 (−25%%)")
    parser.add_argument("--text", default="shakespeare", choices=TEXTS, help="the text the map is calibrated on "
                        "and the arms distil on (its train split; the losses stay on Shakespeare's val and the "
                        "novel's): shakespeare, or mix (real_model.MIX; the general case)")
    parser.add_argument("--teacher_tokens", type=int, default=0, help="the original's own continuations of train "
                        "windows, this many tokens, added after the train split the arms distil on (0: none)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=BATCH, help="windows per step (a CPU dry run: 1)")
    parser.add_argument("--lrs", default=",".join(f"{lr:g}" for lr in LRS),
                        help="learning rates, comma-separated: each runs at once in its own process")
    parser.add_argument("--compile", action="store_true", help="compile the student (the control is checked "
                        "with it: a control that moves stops the run)")
    args = parser.parse_args()
    try:
        lrs = tuple(float(x) for x in args.lrs.split(","))
    except ValueError:
        raise SystemExit(f"--lrs={args.lrs!r} is not a comma-separated list of learning rates, e.g. "
                         "--lrs=3e-4") from None
    if not lrs or min(lrs) <= 0:
        raise SystemExit(f"--lrs={args.lrs!r}: every learning rate must be > 0")
    if args.teacher_tokens < 0:
        raise SystemExit(f"--teacher_tokens={args.teacher_tokens}: must be >= 0 (0: the train split alone)")
    data = {text: os.path.join(args.data, text) for text in dict.fromkeys(("shakespeare", "novel", args.text))}
    options = LEARNED[args.width] if args.start == "learned" else ()
    for path in [args.gguf, *data.values()]:
        if not os.path.exists(path):
            raise SystemExit(f"{path} is missing: pass --gguf=FILE and --data=DIR (see this script's docstring)")
    WORK = args.work
    os.makedirs(WORK, exist_ok=True)
    log, result = Log(), {"device": args.device, "batch": args.batch, "block": BLOCK, "lrs": list(lrs), "m": args.width,
                          "options": [*TIE, *options], "start_map": args.start, "text": args.text,
                          "max_tokens": MAX_TOKENS, "budget_s": args.budget_s, "compile": args.compile}
    if args.device.startswith("cuda"):
        result["gpu"] = torch.cuda.get_device_name(0)
    result["torch"] = torch.__version__
    src, student = os.path.join(WORK, "original"), os.path.join(WORK, f"m{args.width}")
    seconds = {"import": run(["convert.py", f"--from_gguf={args.gguf}", f"--out_dir={src}", "--overwrite=True"],
                             log, "import")}
    result["tokenizer"] = adopt_data_tokenizer(src, data["shakespeare"])
    log(f"tokenizer: {result['tokenizer']}")
    result["original"] = full_losses(src, data, args.device)
    log(f"original: {result['original']}")
    write(result, args.out, log)
    seconds["transform"] = run(["transform.py", f"--in_dir={src}", f"--width={args.width}", "--kind=pca",
                                "--porting=residual",
                                f"--data_dir={data[args.text]}", f"--block_size={BLOCK}", *CALIB,
                                "--eval_iters=0", "--seed=0", f"--device={args.device}", *TIE, *options,
                                f"--out_dir={student}",
                                "--overwrite=True"], log, "transform")
    result["start"] = dict(full_losses(student, data, args.device),
                           parameters=sum(p.numel() for p in load_model(student)[0].parameters()))
    log(f"m = {args.width} zero-shot: {result['start']}")
    write(result, args.out, log)
    train_data = data[args.text]
    if args.teacher_tokens:
        train_data, result["teacher_text"] = teacher_text(src, data[args.text], args.teacher_tokens, args.device,
                                                          log)
        seconds["teacher_text"] = result["teacher_text"].pop("seconds")
    result["train_tokens"] = split_tokens(train_data)
    write(result, args.out, log)

    result["control"] = dict(check_control(src, train_data, max(lrs), args.device, args.batch,
                                           args.compile, log), losses=result["original"])
    seconds["control_check"] = result["control"].pop("seconds")

    probes = {f"probe-lr{lr:g}": os.path.join(WORK, f"probe-lr{lr:g}") for lr in lrs}
    seconds["probe"] = max(finish({name: command(
        ["finetune.py", f"--in_dir={student}", f"--data_dir={train_data}", f"--out_dir={out}",
         "--overwrite=True", *recipe(lr, PROBE_ITERS, args.device, args.batch, args.compile), "--log_interval=1"], log,
        name) for (name, out), lr in zip(probes.items(), lrs)}, log).values())
    speed = min(probe_speed(out) for out in probes.values())
    left = args.budget_s - (time.time() - log.started) - EVAL_RESERVE_S
    iters = planned_iters(speed * SPEED_MARGIN, left, args.batch)
    result |= {"probe_tokens_per_s": speed, "iters": iters, "tokens": iters * args.batch * BLOCK}
    log(f"{speed:,.0f} tokens/s per arm with {len(lrs)} at once: {iters} steps, {result['tokens']:,} tokens each")

    write(result, args.out, log)
    dirs = {f"lr{lr:g}": os.path.join(WORK, f"distilled-lr{lr:g}") for lr in lrs}
    procs = {name: command(["finetune.py", f"--in_dir={student}", f"--data_dir={train_data}",
                            f"--out_dir={out}", "--overwrite=True", *recipe(lr, iters, args.device, args.batch,
                                                                        args.compile)],
                           log, name) for (name, out), lr in zip(dirs.items(), lrs)}
    stop = threading.Event()
    threading.Thread(target=progress, args=(procs, dirs, iters, log, stop), daemon=True).start()
    try:
        seconds["distill"] = max(finish(procs, log, log.started + args.budget_s - EVAL_RESERVE_S / 2).values())
    finally:
        stop.set()
    arms = []
    for (name, out), lr in zip(dirs.items(), lrs):
        done = max((r.get("iter", 0) for r in records(out)), default=0)
        arm = {"lr": lr, "losses": full_losses(out, data, args.device), "curve": curve(out, args.batch),
               "train_curve": train_curve(out, args.batch),
               "iters_done": done, "stopped_early": done < iters}
        arm["gap_to_control"] = {k: arm["losses"][k] / result["control"]["losses"][k] - 1 for k in EVALS}
        arms.append(arm)
        log(f"{name}: {arm['losses']} (val {arm['gap_to_control']['val']:+.2%} against the control)")
        result["arms"] = arms
        write(result, args.out, log)
    total = round(time.time() - log.started, 1)
    result |= {"seconds": seconds, "total_seconds": total,
               "meta": {"command": "scripts/real_distill_gpu.py " + " ".join(sys.argv[1:]), "seconds": total,
                        "hardware": f"{result.get('gpu', args.device)}, torch {torch.__version__}"}}
    write(result, args.out, log)
    log(f"wrote {os.path.join(args.out, 'results.json')}")


def write(result: dict, out: str, log: Log) -> None:
    """results.json and log.txt as they stand: a run cut off by its machine's limit keeps what it measured."""
    os.makedirs(out, exist_ok=True)
    for name, text in (("results.json", json.dumps(repo_relative(result), indent=1)),
                       ("log.txt", "\n".join(log.lines) + "\n")):
        with open(os.path.join(out, name + ".tmp"), "w") as f:
            f.write(text)
        os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))


WORK = "/tmp/real_distill_gpu"

if __name__ == "__main__":
    main()
