"""
The experiment harness: one cache for every run an experiment needs (train, transform, finetune, geometry),
keyed by a hash of the run's full configuration, with one completion marker.

    out_dir, result = cached("train", spec, build)

``build(out_dir)`` runs once per distinct ``spec`` (the run's resolved configuration: editing a config file or a
default changes the key) and returns a JSON-able result; ``runs/<stage>-<label>-<key>/done.json`` then holds it.
A run that stops early (SIGINT, an error) writes no marker, so the next call builds it again from scratch; a lock
per entry lets two lanes of ``scripts/all.sh`` share the cache without building anything twice.

Every run is built through the project's own APIs (``train``, ``transform_checkpoint``, ``finetune``,
``evaluate_geometry``), exactly as the command-line scripts do.
"""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import platform
import re
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager

import torch

from eval_geometry import GeometryConfig, evaluate_geometry
from finetune import FinetuneConfig, finetune
from lgpt.plumbing.checkpoint import load_model
from lgpt.plumbing.configurator import load_config
from lgpt.plumbing.dataset import BatchLoader, calibration_scheme, data_dir_for_checkpoint, evaluate_loss
from train import TrainConfig, train
from transform import TransformConfig, transform_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = os.path.join(ROOT, "runs")
RESULTS = os.path.join(ROOT, "results")
MARKER = "done.json"
# settings that change where a run writes or how it reports, never what it computes: outside the cache key
# (eval_train: the train-split evaluations no experiment reads; the val numbers are the same without them)
NOT_IN_KEY = {"out_dir", "overwrite", "allow_broken", "progress_bar", "wandb_log", "wandb_project", "wandb_run_name",
              "eval_reference", "eval_train"}


class NotCached(Exception):
    """A run that ``--cost`` needs has not been built: the estimate covers built runs only."""


class Busy(Exception):
    """Another lane is building the run at ``path``: do other work and come back (``SKIP_BUSY``)."""

    def __init__(self, path: str):
        super().__init__(os.path.relpath(path, ROOT))
        self.path = path


# lanes (experiments.py --lanes): a run another lane is building raises Busy instead of waiting for it, and
# ``each`` walks its cells from the end that is LANE's (even lanes from the front, odd from the back)
SKIP_BUSY = False
LANE = 0
PREFETCH = False  # lanes: building the runs of an experiment another lane owns; only the owner writes results/
BUILT: list[str] = []  # runs this process built (the lane scheduler's measure of progress)


def writes_results() -> bool:
    """False in --cost mode and while prefetching: results/ is written only by the experiment's owner."""
    return TRACE is None and not PREFETCH


def building_elsewhere(path: str) -> bool:
    """Whether another process holds the lock of the run at ``path`` (a lane that died holds none)."""
    if os.path.exists(os.path.join(path, MARKER)) or not os.path.exists(path + ".lock"):
        return False
    try:
        with locked(path, wait=False):
            return False
    except Busy:
        return True


# experiments.py --cost: {run directory: its recorded build seconds} of every run read; nothing is built or saved
TRACE: dict[str, float] | None = None
# the same for the experiment running now (experiments.py resets it): its results record what they rest on
READ: dict[str, float] = {}


class Setting:
    """QUICK (CPU) or full (GPU) sizes of everything an experiment runs."""

    def __init__(self, quick: bool):
        self.quick = quick
        self.base = [os.path.join(ROOT, "configs", "shakespeare_char.py")]
        if not quick:
            self.base.append(os.path.join(ROOT, "configs", "gpu.py"))
        self.device = "cpu" if quick else ("cuda" if torch.cuda.is_available() else "cpu")
        self.seeds = (0, 1, 2) if quick else (0, 1, 2, 3, 4)
        # QUICK's budget: everything from an empty cache in under 90 min on 2 cores (docs/reference.md, experiments)
        self.finetune_iters = 100 if quick else 1000
        self.finetune_eval_interval = 10 if quick else 50
        self.finetune_eval_iters = 20 if quick else 50
        self.grow_iters = 500 if quick else 2500  # grow_staging: iterations per stage
        self.curve_eval = ["--eval_interval=100", "--eval_iters=50", "--eval_seed=0"]  # training curves' one basis
        # val-only evaluations: every table reads val losses; the train split doubled the evaluation time
        self.common = ["--progress_bar=False", "--eval_train=False",
                       "--wandb_log=" + os.environ.get("WANDB_LOG", "False")]


# ----------------------------------------------------------------------------------------------
# The cache


def key_of(spec: dict) -> str:
    return hashlib.sha1(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:10]


def relative(path: str) -> str:
    """Paths inside the repository go into keys relative to it, so a moved clone keeps its cache."""
    path = os.path.abspath(path)
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


# an absolute path of the machine that ran a script (its checkout, temp or stash directory), inside any string
ABSOLUTE = re.compile(r"(?<![\w.~<>\\-])/(?:tmp|root|home|work|Users|mnt|scratch|var|opt)/[^\s'\",;)\]\\]*")
REPO_PARTS = ("data", "runs", "results", "bench", "configs", "scripts")


def _repo_path(match: re.Match) -> str:
    path = match.group(0)
    if path.startswith(ROOT + os.sep):
        return os.path.relpath(path, ROOT)
    parts = path.strip("/").split("/")
    inside = next((i for i, p in enumerate(parts) if i > 0 and p in REPO_PARTS), None)
    if inside is not None:  # another clone's checkout or a stash of its data/: from there on
        return "/".join(parts[inside:])
    return ("<tmp>/" + "/".join(parts[1:])) if parts[0] == "tmp" else "<local>/" + parts[-1]


def repo_relative(value):
    """``value`` (a results payload) with every absolute path in its strings made relative to the repository; a
    path outside any checkout (a machine's temp directory) becomes '<tmp>/…' or '<local>/NAME'."""
    if isinstance(value, str):
        # the checkout itself first: it may live under a root ABSOLUTE does not know (CI clones into /check/…)
        value = re.sub(r"(?<![\w.~<>\\-])" + re.escape(ROOT + os.sep), "", value)
        while ABSOLUTE.search(value):  # a path may hold another (a run named after its map_file=…)
            value = ABSOLUTE.sub(_repo_path, value)
        return value
    if isinstance(value, dict):
        return {k: repo_relative(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [repo_relative(v) for v in value]
    return value


NEUTRAL = (None, False, 0, "", "none", "unit")  # "unit": calib_weighting's default, from before it existed
# options that matter only when another option is on: out of the key while that one is off
ONLY_WITH = {"refit_ridge": ("refit",), "learn_lr": ("learn_steps",), "grow_mode": ("n_head", "mlp_hidden"),
             "clone_noise": ("n_head", "mlp_hidden"), "distill_alpha": ("distill",),
             "distill_temperature": ("distill",), "distill_chunk": ("distill",)}


def spec_of(cfg, **extra) -> dict:
    """A run's cache key material: its whole resolved config (minus NOT_IN_KEY), paths made relative. A field left
    at a neutral default (off, 0, empty, None) is omitted, so adding a new option that defaults to off keeps every
    existing key (and cached run) valid; so is an option of ONLY_WITH while the option it tunes is off. Every other
    value is in the key."""
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}

    def neutral_default(k, v) -> bool:
        return type(v) is type(defaults[k]) and v == defaults[k] and defaults[k] in NEUTRAL

    values = dataclasses.asdict(cfg)
    idle = {k for k in ONLY_WITH if k in values and all(neutral_default(o, values[o]) for o in ONLY_WITH[k]
                                                         if o in values)}
    spec = {k: v for k, v in values.items() if k not in NOT_IN_KEY and not neutral_default(k, v) and k not in idle}
    for k in ("in_dir", "ref_dir", "control_dir", "data_dir"):
        if spec.get(k):
            spec[k] = relative(spec[k])
    spec = Spec(spec, **extra)
    if idle:  # the key this run had before those options joined ONLY_WITH: its cached build is still found
        spec.legacy = dict(spec, **{k: values[k] for k in idle if not neutral_default(k, values[k])})
    return spec


class Spec(dict):
    """A run's key material; ``legacy``: the same run as keyed by an older version of ``spec_of``."""
    legacy: dict | None = None


@contextmanager
def locked(path: str, wait: bool | None = None):
    """Hold the entry's lock. Without ``wait`` (default: not SKIP_BUSY), raise Busy at once if another process
    holds it."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    wait = not SKIP_BUSY if wait is None else wait
    with open(path + ".lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise Busy(path) from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read_marker(marker: str) -> dict | None:
    """A completion marker's record, or None when it is cut off or not a record (a disk that filled mid-write)."""
    try:
        with open(marker) as f:
            done = json.load(f)
    except (OSError, ValueError):
        return None
    return done if isinstance(done, dict) and {"result", "seconds"} <= set(done) else None


def run_dir(stage: str, label: str, spec: dict) -> str:
    """Where ``cached`` keeps (or would keep) the run ``spec``: its directory under runs/."""
    threads = torch.get_num_threads()  # float sums depend on it: a run built on more threads is another run
    extra = {"stage": stage, **({"threads": threads} if threads != 1 else {})}
    out = os.path.join(RUNS, f"{stage}-{label}-{key_of(dict(spec, **extra))}")
    legacy = getattr(spec, "legacy", None)
    if legacy is not None and legacy != spec and not os.path.exists(os.path.join(out, MARKER)):
        older = os.path.join(RUNS, f"{stage}-{label}-{key_of(dict(legacy, **extra))}")
        if os.path.exists(os.path.join(older, MARKER)):
            out = older
    return out


def is_built(stage: str, label: str, spec: dict) -> bool:
    """Whether ``cached`` would read the run ``spec`` rather than build it."""
    return os.path.exists(os.path.join(run_dir(stage, label, spec), MARKER))


def cached(stage: str, label: str, spec: dict, build: Callable[[str], dict]) -> tuple[str, dict]:
    """(out_dir, result) of the run ``spec``, building it with ``build(out_dir)`` unless its marker exists."""
    out = run_dir(stage, label, spec)
    marker = os.path.join(out, MARKER)
    if TRACE is not None:
        if not os.path.exists(marker):
            raise NotCached(f"{os.path.relpath(out, ROOT)} is not built: --cost sums the build times of built runs; "
                            "run the experiment first")
        done = read_marker(marker)
        if done is None:
            raise NotCached(f"{os.path.relpath(marker, ROOT)} is cut off or unreadable: run the experiment to rebuild "
                            "that run")
        TRACE[out] = done["seconds"]
        return out, done["result"]
    with locked(out):
        if os.path.exists(marker) and read_marker(marker) is None:
            print(f"note: {os.path.relpath(marker, ROOT)} is cut off or unreadable: the run is built again")
            os.remove(marker)
        if not os.path.exists(marker):
            started = time.time()
            result = build(out)  # an exception or SIGINT leaves no marker: the next call starts over
            tmp = marker + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"spec": spec, "result": result, "seconds": time.time() - started}, f, default=str)
            os.replace(tmp, marker)
            BUILT.append(out)
    done = read_marker(marker)
    READ[out] = done["seconds"]
    return out, done["result"]


# ----------------------------------------------------------------------------------------------
# The runs


def trained(s: Setting, name: str, overlays: list[str] = (), args: list[str] = (), seed: int = 0,
            curve: bool = True) -> str:
    """A model of the base config + config ``overlays`` + ``args`` (training seed 1337 + seed). ``curve=False``:
    evaluated at the start and the end only — for models whose training curve no table reads; train.py keeps the
    final weights whatever the eval schedule (eval batches have their own seeds), so the model is the same."""
    argv = s.base + list(overlays) + list(args) + s.common + [f"--seed={1337 + seed}", f"--device={s.device}"]
    cfg = load_config(TrainConfig, argv)
    if not curve:
        cfg.eval_interval = cfg.max_iters

    def build(out: str) -> dict:
        cfg.out_dir, cfg.overwrite = out, True  # a directory without a marker is a partial run: start again
        return train(cfg)

    return cached("train", f"{name}-s{seed}", spec_of(cfg), build)[0]


def transformed(s: Setting, src: str, width: int, kind: str, porting: str = "residual", norms: str = "fold",
                seed: int = 0, **options) -> tuple[str, dict]:
    """``src`` transformed; the record holds the zero-shot val loss on the full val split."""
    cfg = TransformConfig(in_dir=src, out_dir="", width=width, kind=kind, porting=porting, norms=norms, seed=seed,
                          eval_iters=None, eval_reference=False, device=s.device, overwrite=True,
                          allow_broken=True, **options)  # experiments measure broken models too (random maps)

    def build(out: str) -> dict:
        cfg.out_dir = out
        record = transform_checkpoint(cfg)
        return {k: v for k, v in record.items() if k not in ("T", "T_pinv")}

    label = f"{os.path.basename(src).split('-')[1]}-{kind}-{porting}-m{width}"
    return cached("transform", label, {**spec_of(cfg, source=os.path.basename(src)), **calibration_scheme(seed)},
                  build)


def canonical(s: Setting, src: str, norms: str = "fold") -> str:
    """The untransformed model in the form the transform gives it (T = I, same width): what controls finetune."""
    d = load_model(src)[0].config.n_embd
    return transformed(s, src, d, "truncate", "residual", norms)[0]


def finetuned(s: Setting, src: str, seed: int = 0, control: str | None = None, iters: int | None = None,
              extra: tuple[str, ...] = ()) -> dict:
    """A finetune with the experiments' one recipe (data order = seed; the eval batches are the same for every
    seed and every arm); with ``control`` (a finetuned control's directory) it also measures against it."""
    iters = iters or s.finetune_iters
    args = s.common + [f"--in_dir={src}", f"--max_iters={iters}", f"--lr_decay_iters={iters}",
                       f"--eval_interval={s.finetune_eval_interval}", f"--eval_iters={s.finetune_eval_iters}",
                       "--eval_seed=0", f"--seed={1337 + seed}", f"--device={s.device}", "--log_interval=50",
                       "--out_dir=unset", *extra]
    if control:
        args.append(f"--control_dir={control}")
    cfg = load_config(FinetuneConfig, args)

    def build(out: str) -> dict:
        cfg.out_dir, cfg.overwrite = out, True
        return finetune(cfg)

    out, result = cached("finetune", f"{os.path.basename(src).split('-', 1)[1][:40]}-s{seed}", spec_of(cfg), build)
    return dict(result, out_dir=out)  # where the run is now: a moved clone's cache keeps its controls' keys


def recovery(s: Setting, src: str, control_src: str, seeds: tuple[int, ...] | None = None,
             extra: tuple[str, ...] = ()) -> dict:
    """Finetune ``src`` (with ``extra`` finetune options, e.g. distillation) and its control (``control_src``: the
    untransformed model, canonical form, plain LM finetuning) with each seed; steps to recover and the gap are
    measured against the control of the same seed."""
    def pair(seed: int) -> tuple[dict, dict]:
        control = finetuned(s, control_src, seed)
        other_loss = ("--control_any_loss=True",) if "--distill=True" in extra else ()  # one LM control for all
        return control, finetuned(s, src, seed, control=control["out_dir"], extra=(*extra, *other_loss))

    runs = []
    for seed, (control, run) in zip(seeds or s.seeds, each(seeds or s.seeds, pair)):
        runs.append({"seed": seed, "steps_to_recover_vs_control": run["steps_to_recover_vs_control"],
                     "gap_to_control": run["gap_to_control"], "val_loss": run["val_loss"],
                     "control_val_loss": control["val_loss"], "curve": run["curve"], "control_curve": control["curve"]})
    final_gaps = [r["gap_to_control"][-1][1] for r in runs]
    return {"seeds": runs, "steps_to_recover_vs_control": [r["steps_to_recover_vs_control"] for r in runs],
            "final_gap": mean_spread(final_gaps), "final_val_loss": mean_spread([r["val_loss"] for r in runs]),
            "control_val_loss": mean_spread([r["control_val_loss"] for r in runs])}


def geometry(s: Setting, ref: str, new: str = "", **options) -> dict:
    cfg = GeometryConfig(ref_dir=ref, in_dir=new, out_dir="", wandb_log=False, device=s.device, overwrite=True,
                         **options)  # overwrite: a directory without a marker is a partial run

    def build(out: str) -> dict:
        cfg.out_dir = out
        return evaluate_geometry(cfg)

    out, result = cached("geometry", os.path.basename(new or ref).split("-", 1)[1][:40], spec_of(cfg), build)
    return dict(result, out_dir=out)


FULL_VAL = "full_val_loss.json"  # a finished run's full-val loss, kept beside its checkpoint


def full_val_loss(model_dir: str, device: str) -> float:
    """Val loss over the whole val split (the zero-shot basis of every table). A finished cached run keeps it in
    FULL_VAL, tied to its checkpoint's size and mtime: experiments (and the lanes that prefetch them) ask for the
    same models' losses again and again, and each evaluation costs seconds."""
    ckpt_path = os.path.join(model_dir, "ckpt.pt")
    memo = os.path.join(model_dir, FULL_VAL)
    stat = os.stat(ckpt_path)
    of = [stat.st_size, stat.st_mtime_ns]
    finished = os.path.exists(os.path.join(model_dir, MARKER))
    if finished and os.path.exists(memo):
        with open(memo) as f:
            kept = json.load(f)
        if kept["checkpoint"] == of:
            return kept["loss"]
    model, ckpt = load_model(model_dir, device=device)
    loader = BatchLoader(data_dir_for_checkpoint(ckpt), model.config.block_size, 32, device)
    loss = evaluate_loss(model, loader, "val", None)
    if finished:
        tmp = f"{memo}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"checkpoint": of, "loss": loss}, f)
        os.replace(tmp, memo)
    return loss


# ----------------------------------------------------------------------------------------------
# Small helpers shared by the experiments


def each(cells: list | tuple, run: Callable) -> list:
    """``[run(c) for c in cells]`` for cells that do not depend on each other. Odd lanes walk them from the back,
    so two lanes building one experiment meet in the middle; with SKIP_BUSY a cell another lane is building is
    passed over, and once every other cell is done Busy is raised (the scheduler comes back for it)."""
    results, busy = {}, None
    order = range(len(cells)) if LANE % 2 == 0 else reversed(range(len(cells)))
    for i in order:
        try:
            results[i] = run(cells[i])
        except Busy as e:
            busy = e
    if busy is not None:
        raise busy
    return [results[i] for i in range(len(cells))]


def width(ratio: float, d: int, n_head: int) -> int:
    """m = ratio·d rounded to a multiple of n_head (the sandwich rules re-split the heads), the same everywhere."""
    return max(n_head, int(round(ratio * d / n_head)) * n_head)


def mean_spread(values: list[float]) -> dict:
    """Mean, sample std (n − 1) and n of a list of measurements."""
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "n": len(values), "values": values}


def save(experiment: str, payload: dict, started: float, s: Setting) -> None:
    if not writes_results():  # --cost reads the cache; a prefetching lane builds runs; neither writes
        return
    out = os.path.join(RESULTS, experiment)
    os.makedirs(out, exist_ok=True)
    payload = dict(payload, meta={"quick": s.quick, "seconds": round(time.time() - started), "runs": len(READ),
                                  "threads": torch.get_num_threads(),
                                  "build_minutes": round(sum(READ.values()) / 60, 1),
                                  "hardware": hardware(), "command": f"scripts/{experiment}.sh"
                                  + (" --quick" if s.quick else "")})
    tmp = os.path.join(out, f"results.json.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(repo_relative(payload), f, indent=2)
    os.replace(tmp, os.path.join(out, "results.json"))
    print(f"wrote {out}/results.json")


def hardware() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"CPU ({platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__})"
