"""
Train a GPT.  ``python train.py configs/shakespeare_char.py --max_iters=500``

Single process on CPU or one GPU, or DDP:  ``torchrun --standalone --nproc_per_node=8 train.py CONFIG``
(NCCL on GPU, gloo on CPU).

Read top to bottom, as nanoGPT's: the config (``TrainConfig``), the LR schedule, then ``train()``, which sets the run
up and holds the whole loop; below it the named steps the loop calls (setup, save, evaluate, the signal and NaN
stops). ``finetune.py`` reuses ``train()`` (a loss function for distillation, an ``on_eval`` callback for the
recovery record): there is one training loop.
"""
from __future__ import annotations

import dataclasses
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch.distributed import destroy_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

from lgpt.plumbing.checkpoint import (
    check_output_dir,
    hold_run_dir,
    load_checkpoint,
    model_from_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from lgpt.plumbing.cli import Interrupted, run_cli, signal_handlers
from lgpt.plumbing.configurator import load_config
from lgpt.plumbing.dataset import (
    GPT2_META,
    BatchLoader,
    batch_seed,
    check_tokenizer,
    dataset_dir,
    ensure_prepared,
    evaluate_loss,
    load_meta,
    loss_basis,
)
from lgpt.plumbing.devices import Runtime, announce_threads, setup_runtime
from lgpt.plumbing.errors import ConfigError, TrainingDiverged
from lgpt.plumbing.logger import MetricsLogger, drop_rows_after
from model import GPT, GPTConfig, advance_ramp, ramp_of, raw_state_dict

# model fields a run may set on a model that comes from a checkpoint: the rest is the checkpoint's architecture
CHECKPOINT_OVERRIDABLE = ("dropout", "norm_reg", "block_size")
DTYPES = ("auto", "float32", "bfloat16", "float16")
METRICS = "metrics.jsonl"
RECORDS = ("transform", "finetune")  # what a run's checkpoints carry on from the checkpoint it started from


@dataclass
class TrainConfig(GPTConfig):
    """Every run setting. The GPTConfig fields above are the model's: validated in ``validate`` for a model built
    from scratch; for a model from a checkpoint (resume, finetune, gpt2) only dropout, norm_reg and a smaller
    block_size may be set, and an explicitly given architecture field that differs is an error."""
    HELP_OMITS: ClassVar[tuple[str, ...]] = ("init_state", "rewarm_iters")  # finetune.py's options (its --help)
    vocab_size: int | None = None  # None: from the dataset's meta.pkl (else GPT-2's padded 50304)
    # I/O
    out_dir: str = "out"  # where ckpt.pt and metrics.jsonl go
    eval_interval: int = 250  # evaluate (and maybe save) every this many iterations
    log_interval: int = 10  # a console/metrics line every this many iterations
    eval_iters: int = 200  # fixed random batches per split at each evaluation
    eval_seed: int = -1  # seed of those fixed batches; -1: the run's seed (fix it to compare runs of other seeds)
    eval_train: bool = True  # also evaluate the train split (False: val only, half the eval time; same val numbers)
    eval_only: bool = False  # evaluate once and exit
    always_save_checkpoint: bool = True  # save at every evaluation (False: only when val loss improves, and at the end)
    init_from: str = "scratch"  # 'scratch' | 'resume' | 'gpt2' | 'gpt2-medium' | 'gpt2-large' | 'gpt2-xl'
    overwrite: bool = False  # with init_from='scratch' (or gpt2): replace a checkpoint already in out_dir
    progress_bar: bool = True  # a tqdm bar on interactive terminals
    # logging
    wandb_log: bool = False  # also log to wandb (offline unless WANDB_MODE says otherwise)
    wandb_project: str = "nanolgpt"  # wandb project name
    wandb_run_name: str = "run"  # wandb run name
    # data
    dataset: str = "shakespeare_char"  # data/<dataset>; shakespeare_char and shakespeare prepare themselves
    data_dir: str = ""  # '' → data/<dataset>
    gradient_accumulation_steps: int = 1  # micro-batches per step, over all DDP processes (rounded up to a multiple)
    batch_size: int = 12  # sequences per micro-batch and process
    # optimizer
    optimizer: str = "adamw"  # 'adamw' | 'adafactor'
    learning_rate: float = 1e-3  # peak learning rate
    max_iters: int = 2000  # total optimisation steps
    weight_decay: float = 0.1  # on matrices and embeddings only
    beta1: float = 0.9  # AdamW β1, in [0, 1)
    beta2: float = 0.99  # AdamW β2, in [0, 1)
    grad_clip: float = 1.0  # clip the gradient norm at this value; 0 disables clipping
    # learning-rate schedule: linear warmup, then cosine decay to min_lr
    decay_lr: bool = True  # False: constant learning_rate
    warmup_iters: int = 100  # linear warmup steps
    lr_decay_iters: int = 2000  # the cosine reaches min_lr here
    min_lr: float = 1e-4  # the floor of the cosine, ≤ learning_rate
    # continuing a run's state from an init checkpoint (finetune.py --in_dir, e.g. a grown model)
    init_state: bool = False  # keep its iter_num (the schedule goes on from there; max_iters counts from the
    #                           original run's start) and the AdamW moments it carries (transform.py --carry_optimizer)
    rewarm_iters: int = 0  # with init_state: ramp the LR linearly from 0 back onto the schedule over this many steps
    # system
    device: str = "auto"  # 'auto' (cuda if available, else cpu) | 'cpu' | 'cuda' | 'cuda:1' | 'mps'
    dtype: str = "auto"  # 'auto' (bfloat16 on a GPU that has it, else float32) | 'float32' | 'bfloat16' | 'float16'
    #                      (bfloat16 autocast works on the CPU too; float16 needs a GPU)
    compile: bool = True  # torch.compile on CUDA; on the CPU only when compile_backend names a backend
    compile_backend: str = ""  # '' = inductor, on CUDA only; a name ('inductor', 'aot_eager') compiles on any device
    peak_tflops: float = 0.0  # the accelerator's peak for MFU; 0 = from devices.PEAK_TFLOPS_BF16 (unknown GPU: no MFU)
    seed: int = 1337  # model init, batches and dropout are functions of it

    def __post_init__(self) -> None:
        """Model fields are checked in ``validate``, against the model the run will actually build."""

    def validate(self) -> None:
        positive = ("eval_interval", "log_interval", "eval_iters", "gradient_accumulation_steps", "batch_size")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}")
        for name in ("max_iters", "warmup_iters", "lr_decay_iters", "rewarm_iters", "weight_decay"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.max_iters == 0 and not self.eval_only:
            raise ConfigError("max_iters=0 trains nothing and would write no checkpoint; give max_iters >= 1, or "
                              "--eval_only=True to evaluate a model")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype={self.dtype!r} is not one of {DTYPES}")
        if self.optimizer not in ("adamw", "adafactor"):
            raise ConfigError(f"optimizer={self.optimizer!r} is not one of ('adamw', 'adafactor')")
        self._check_optimizer_schedule()
        if self.rewarm_iters and not self.init_state:
            raise ConfigError("rewarm_iters re-warms the LR after a continued state: add --init_state=True (with "
                              "finetune.py --in_dir) or drop --rewarm_iters")
        if self.eval_seed < -1:
            raise ConfigError(f"eval_seed must be >= 0, or -1 for the run's seed; got {self.eval_seed}")
        if self.compile_backend and self.compile_backend not in torch._dynamo.list_backends(exclude_tags=()):
            raise ConfigError(f"compile_backend={self.compile_backend!r} is not a torch.compile backend here; give one "
                              f"of {torch._dynamo.list_backends()} (or '' for inductor on CUDA)")
        if self.grad_clip < 0:
            raise ConfigError(f"grad_clip must be >= 0 (0 disables clipping), got {self.grad_clip}")
        if self.init_from == "scratch":
            GPTConfig(**self.model_args(vocab_size=self.vocab_size or 50304))  # fail early on model fields

    def _check_optimizer_schedule(self) -> None:
        if self.learning_rate <= 0 or self.min_lr < 0:
            raise ConfigError("learning_rate must be > 0 and min_lr >= 0")
        if self.decay_lr and self.min_lr > self.learning_rate:
            raise ConfigError(f"min_lr={self.min_lr} is above learning_rate={self.learning_rate}: the cosine decays "
                              "from learning_rate down to min_lr; lower --min_lr")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"{name} must lie in [0, 1), got {getattr(self, name)}")

    def model_args(self, **overrides) -> dict:
        args = {f: getattr(self, f) for f in GPTConfig.field_names()}
        args.update(overrides)
        return args

    def eval_batch_seed(self) -> int:
        return self.seed if self.eval_seed < 0 else self.eval_seed

    def resolved_data_dir(self) -> str:
        return dataset_dir(self.dataset, self.data_dir)


def get_lr(it: int, cfg: TrainConfig, rewarm_from: int = 0) -> float:
    """Linear warmup for warmup_iters, cosine decay to min_lr at lr_decay_iters, min_lr after; with rewarm_iters,
    times a linear ramp over the rewarm_iters steps after ``rewarm_from`` (where a continued state started)."""
    ramp = 1.0
    if cfg.rewarm_iters and rewarm_from <= it < rewarm_from + cfg.rewarm_iters:
        ramp = (it - rewarm_from + 1) / (cfg.rewarm_iters + 1)
    if not cfg.decay_lr:
        return cfg.learning_rate * ramp
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1) * ramp
    if it >= cfg.lr_decay_iters:
        return cfg.min_lr * ramp
    ratio = (it - cfg.warmup_iters) / max(1, cfg.lr_decay_iters - cfg.warmup_iters)
    return (cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.learning_rate - cfg.min_lr)) * ramp


@dataclass
class TrainState:
    """What the loop changes; saved in every checkpoint and restored on resume."""
    iter_num: int = 0
    best_val_loss: float = float("inf")
    losses: dict = field(default_factory=dict)  # the last evaluation's
    stop_signal: str | None = None  # 'SIGINT' / 'SIGTERM' / 'SIGHUP' once a stop was requested
    last_eval_iter: int = -1  # a resumed run does not evaluate again the step its checkpoint evaluated
    rewarm_from: int = 0  # the iteration a continued state (init_state) started at: the re-warmup's origin


@dataclass(frozen=True)
class Evaluator:
    """How the run measures a model: on its device, in its autocast dtype, on its fixed eval batches. ``on_eval``
    is handed it, so a callback measures another model (finetune's reference) exactly as the run measures its own."""
    cfg: TrainConfig
    rt: Runtime
    loader: BatchLoader
    model: torch.nn.Module  # the model being trained, as evaluated: compiled when it is, never the DDP wrapper
    #                         (rank 0 evaluates alone; through DDP it would wait for its peers)

    def loss(self, split: str, model: torch.nn.Module | None = None) -> float:
        """Mean loss of ``model`` (default: the run's) on the fixed eval batches of ``split``."""
        return evaluate_loss(self.model if model is None else model, self.loader, split, self.cfg.eval_iters,
                             self.cfg.eval_batch_seed(), self.rt.autocast())

    def basis(self) -> str:
        """The basis of the losses the log prints (each split on its own fixed batches)."""
        return loss_basis(self.loader, self.cfg.eval_iters, self.cfg.eval_batch_seed(), split=None)


LossFn = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]  # (model, x, y) -> loss
OnEval = Callable[[int, dict, Evaluator], "dict | None"]  # (iter_num, losses, evaluator) -> metrics to log


def lm_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The default micro-batch loss: the model's own next-token loss (which sets its ``last_loss_terms``)."""
    return model(x, y)[1]


# ----------------------------------------------------------------------------------------------
# The loop


# one function on purpose (hence noqa: C901): the loop is read in one place, as nanoGPT's; its steps are named below
def train(cfg: TrainConfig, init_checkpoint: dict | None = None, loss_fn: LossFn | None = None,  # noqa: C901
          on_eval: OnEval | None = None) -> dict:
    """Train ``cfg``'s model and return a summary: warmup + cosine LR, gradient accumulation, clipping, an
    evaluation and atomic checkpoint every eval_interval, exact resume, SIGINT/SIGTERM/SIGHUP save and raise
    ``Interrupted``, a non-finite loss raises ``TrainingDiverged``.

    ``init_checkpoint``: the checkpoint to start from: finetuning's input (its weights, a fresh optimizer), or with
    init_from='resume' the run's own checkpoint already read (None: read from out_dir). Every checkpoint the run
    saves carries on its ``transform`` and ``finetune`` records (finetune.py updates its record there).
    ``loss_fn(model, x, y)``: a micro-batch's loss in place of the LM loss (distillation); ``model`` is the model as
    trained (compiled, DDP-wrapped), and the function must set the raw model's ``last_loss_terms`` for the log.
    ``on_eval(iter_num, losses, evaluator)``: called on the master after each evaluation; a dict it returns is
    logged with the losses.
    """
    # setup: device, data, model, optimizer (restored on resume); everything is checked before anything is written
    if cfg.init_from != "resume":
        check_output_dir(cfg.out_dir, overwrite=cfg.overwrite)
    rt = setup_runtime(cfg.device, cfg.dtype, cfg.peak_tflops)  # device, precision, DDP rank
    torch.manual_seed(cfg.seed)
    data_dir = cfg.resolved_data_dir()
    if rt.master and not cfg.data_dir:  # the repo's own data/<dataset>: prepared on first use, as nanoGPT
        ensure_prepared(data_dir, cfg.dataset)
    if rt.ddp:
        torch.distributed.barrier()
    model, optimizer, st, carried = model_and_state(cfg, rt, init_checkpoint, data_dir)
    loader = BatchLoader(data_dir, model.config.block_size, cfg.batch_size, rt.device)
    scaler = torch.amp.GradScaler(rt.device_type, enabled=rt.ptdtype == torch.float16)  # loss scaling: float16 only
    eval_model = train_model = compiled(model, cfg, rt)
    if rt.ddp:
        train_model = DDP(train_model, device_ids=[rt.local_rank] if rt.device_type == "cuda" else None)
    evaluator = Evaluator(cfg, rt, loader, eval_model)
    logger = MetricsLogger(cfg.out_dir, enabled=rt.master, wandb_log=cfg.wandb_log, project=cfg.wandb_project,
                           run_name=cfg.wandb_run_name, config=dataclasses.asdict(cfg), filename=METRICS)
    grad_accum = math.ceil(cfg.gradient_accumulation_steps / rt.world_size)  # micro-steps per process
    tokens_per_iter = grad_accum * rt.world_size * cfg.batch_size * model.config.block_size
    if rt.master:
        announce(cfg, rt, model, grad_accum, tokens_per_iter)
    loss_fn = loss_fn or lm_loss

    step_times: list[float] = []
    try:
        with stop_on_signals(st, rt.master), progress_bar(cfg, rt, st.iter_num) as bar:
            if cfg.eval_only:
                st.losses = evaluate(evaluator, st.iter_num)  # printed, not logged: evaluating changes no run
                print(loss_line(st.iter_num, st.losses, evaluator.basis()))
                return {"iter_num": st.iter_num, "train_loss": st.losses.get("train"), "val_loss": st.losses["val"],
                        "eval_basis": evaluator.basis()}
            while True:
                it = st.iter_num
                lr = get_lr(it, cfg, st.rewarm_from)
                last = it >= cfg.max_iters
                # evaluate, log and save: every eval_interval, and at the end (rank 0 alone)
                if rt.master and (last or (it % cfg.eval_interval == 0 and it != st.last_eval_iter)):
                    st.losses = evaluate(evaluator, it)
                    st.last_eval_iter = it
                    record = {**{f"{split}/loss": value for split, value in st.losses.items()}, "lr": lr}
                    if on_eval is not None:
                        record.update(on_eval(it, st.losses, evaluator) or {})
                    print(loss_line(it, st.losses, evaluator.basis()))
                    logger.log(record, step=it)
                    improved = st.losses["val"] < st.best_val_loss
                    st.best_val_loss = min(st.best_val_loss, st.losses["val"])
                    if (improved or cfg.always_save_checkpoint or last) and it > 0:
                        save(cfg, model, optimizer, st, carried, complete=last)
                if last:
                    break
                if stop_requested(st, rt):  # a signal: save where the state is consistent, and stop
                    if rt.master:
                        save(cfg, model, optimizer, st, carried, complete=False)
                    if rt.ddp:
                        torch.distributed.barrier()  # the checkpoint is written before any process leaves
                    raise Interrupted(f"saved {cfg.out_dir}/ckpt.pt at iter {it} (marked incomplete); resume with "
                                      "--init_from=resume")

                # one optimisation step: gradients accumulated over grad_accum micro-batches
                t0 = time.perf_counter()
                for group in optimizer.param_groups:
                    group["lr"] = lr
                if cfg.dropout > 0:  # dropout's randomness is a function of (seed, iter, rank) too: exact resume
                    torch.manual_seed(batch_seed(cfg.seed, it, -1, rt.rank))
                x, y = loader.get_batch("train", batch_seed(cfg.seed, it, 0, rt.rank))
                nonfinite = torch.zeros((), device=rt.device)  # stays on the device: no host sync per micro-step
                for micro_step in range(grad_accum):
                    if rt.ddp:  # sync gradients on the last micro-step only
                        train_model.require_backward_grad_sync = micro_step == grad_accum - 1
                    with rt.autocast():
                        loss = loss_fn(train_model, x, y) / grad_accum
                    if micro_step + 1 < grad_accum:  # fetch the next micro-batch while backward runs on the GPU
                        x, y = loader.get_batch("train", batch_seed(cfg.seed, it, micro_step + 1, rt.rank))
                    nonfinite = torch.maximum(nonfinite, (~torch.isfinite(loss.detach())).float())
                    scaler.scale(loss).backward()
                stop_if_diverged(rt, nonfinite, it, cfg.out_dir)
                if cfg.grad_clip > 0:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(train_model.parameters(), cfg.grad_clip)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                advance_ramp(model)  # a model grown with MSG masks: they open by one step
                rt.synchronize()
                dt = time.perf_counter() - t0
                step_times.append(dt)

                if it % cfg.log_interval == 0 and rt.master:
                    record, line = step_log(it, lr, dt, model, tokens_per_iter,
                                            cfg.batch_size * grad_accum, rt.peak_flops)
                    logger.log(record, step=it)
                    (bar.write if bar else print)(line)
                st.iter_num += 1
                if bar:
                    bar.update(1)
    finally:
        logger.summary({"best_val_loss": st.best_val_loss})
        logger.finish()
        if rt.ddp:
            destroy_process_group()
    timed = sorted(step_times[1:]) or step_times  # the first step compiles and warms up
    return {"iter_num": st.iter_num, "train_loss": st.losses.get("train"), "val_loss": st.losses.get("val"),
            "best_val_loss": st.best_val_loss, "eval_basis": evaluator.basis(),
            "ms_per_iter_median": 1000 * timed[len(timed) // 2] if timed else None}


# ----------------------------------------------------------------------------------------------
# Setup: where the run executes, the model and the state it starts from


def model_and_state(cfg: TrainConfig, rt: Runtime, init_checkpoint: dict | None,
                    data_dir: str) -> tuple[GPT, torch.optim.Optimizer, TrainState, dict]:
    """The model on the run's device, its optimizer and the loop's state, as the run starts: new, resumed exactly
    (``restore``) or continued from an init checkpoint (``continue_state``); and what every checkpoint carries
    unchanged: the tokenizer, and the source checkpoint's records (the same dicts: finetune.py updates its record)."""
    model, resume_ckpt = init_model(cfg, init_checkpoint, load_meta(data_dir))
    source = resume_ckpt or init_checkpoint or {}
    model_meta = source.get("meta") if source else GPT2_META if cfg.init_from.startswith("gpt2") else None
    data_meta = check_tokenizer(model_meta, data_dir, "--data_dir", model.config.vocab_size)  # stops on a mismatch
    carried = {"meta": model_meta or data_meta, **{k: source[k] for k in RECORDS if k in source}}
    model.to(rt.device)
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2),
                                           rt.device_type, cfg.optimizer)
    state = TrainState()
    metrics_path = os.path.join(cfg.out_dir, METRICS)
    if resume_ckpt is not None:
        restore(resume_ckpt, optimizer, state, rt.master, metrics_path)
    elif cfg.init_state:
        continue_state(cfg, init_checkpoint, model, optimizer, state, rt.master)
    elif cfg.overwrite and rt.master and os.path.exists(metrics_path):
        os.remove(metrics_path)  # a new run: never append to the replaced run's metrics
    return model, optimizer, state, carried


def init_model(cfg: TrainConfig, init_checkpoint: dict | None, data_meta: dict | None) -> tuple[GPT, dict | None]:
    """(model, checkpoint to resume from or None) for the run's init_from setting."""
    explicit = getattr(cfg, "explicit_keys", frozenset())
    resume_ckpt = None
    if cfg.init_from == "resume":  # the run's own checkpoint (finetune.py passes it in, already read)
        resume_ckpt = init_checkpoint if init_checkpoint is not None else load_checkpoint(cfg.out_dir)
        check_checkpoint_overrides(cfg, resume_ckpt["model_args"], f"the checkpoint in {cfg.out_dir} (resume)")
        model = model_from_checkpoint(resume_ckpt, growth_masks=True, **{k: getattr(cfg, k) for k in
                                                                         ("dropout", "norm_reg") if k in explicit})
    elif init_checkpoint is not None:  # finetune.py: weights from a given checkpoint, a fresh optimizer
        check_checkpoint_overrides(cfg, init_checkpoint["model_args"], "the input checkpoint")
        model = model_from_checkpoint(init_checkpoint, growth_masks=True, dropout=cfg.dropout,
                                      **({"norm_reg": cfg.norm_reg} if "norm_reg" in explicit else {}))
    elif cfg.init_from.startswith("gpt2"):
        from convert import gpt2_from_pretrained
        model = gpt2_from_pretrained(cfg.init_from, dropout=cfg.dropout)
        check_checkpoint_overrides(cfg, model.config.to_dict(), f"Hugging Face {cfg.init_from}")
    elif cfg.init_from == "scratch":
        vocab_size = cfg.vocab_size or (data_meta["vocab_size"] if data_meta else 50304)
        model = GPT(GPTConfig(**cfg.model_args(vocab_size=vocab_size)))
        record_architecture(cfg, model)
        return model, None
    else:
        raise ConfigError(f"init_from={cfg.init_from!r} is not one of 'scratch', 'resume', 'gpt2', "
                          "'gpt2-medium', 'gpt2-large', 'gpt2-xl'")
    if "block_size" in explicit and cfg.block_size < model.config.block_size:
        model.crop_block_size(cfg.block_size)  # e.g. finetune GPT-2 (1024) on shorter contexts, as nanoGPT
    record_architecture(cfg, model)
    return model, resume_ckpt


def check_checkpoint_overrides(cfg: TrainConfig, model_args: dict, source: str) -> None:
    """A model that comes from a checkpoint keeps its architecture. A model field given on the command line that
    differs (other than dropout, norm_reg, a smaller block_size) would be silently ignored, so it is an error; one
    that only a config file sets (e.g. the file the run was started with, resuming a transformed model) gets a
    note saying the checkpoint's value is used."""
    explicit = getattr(cfg, "explicit_keys", frozenset())
    cli = getattr(cfg, "cli_keys", explicit)

    def differs(k: str) -> bool:
        if k == "block_size":
            return getattr(cfg, k) > model_args[k]  # a smaller context crops the model
        return k not in CHECKPOINT_OVERRIDABLE and getattr(cfg, k) != model_args.get(k)

    differing = [k for k in GPTConfig.field_names() if k in explicit and differs(k)]
    described = {k: f"{k}={getattr(cfg, k)!r} (checkpoint: {model_args.get(k)!r})" for k in differing}
    contradicting = [described[k] for k in differing if k in cli]
    if contradicting:
        raise ConfigError(f"the model comes from {source}, whose architecture is fixed; these settings contradict "
                          f"it: {', '.join(contradicting)}. Drop them (only dropout, norm_reg and a smaller "
                          "block_size can change), or train from scratch in a new out_dir")
    if differing:
        print(f"note: the architecture comes from {source}; the config file's "
              f"{', '.join(described[k] for k in differing)} are not used", file=sys.stderr)


def record_architecture(cfg: TrainConfig, model: GPT) -> None:
    """The run's config holds the architecture it trained, not the defaults or a config file's unused values. The
    fields a run may set itself (dropout, norm_reg) stay as the run's settings: finetune's control check compares
    them as part of the recipe; block_size is the context the model runs with (a larger setting is not used)."""
    for k, v in model.config.to_dict().items():
        if hasattr(cfg, k) and (k not in CHECKPOINT_OVERRIDABLE or k == "block_size"):
            setattr(cfg, k, v)


def restore(ckpt: dict, optimizer: torch.optim.Optimizer, state: TrainState, master: bool, metrics_path: str) -> None:
    """Resume exactly: the optimizer, iteration, best loss and RNG state as saved, so the resumed run continues as the
    uninterrupted one would (batches and dropout are functions of seed and iteration). Metrics rows logged after the
    checkpoint (a run killed between saves) are dropped: the resumed run logs those iterations again."""
    if ckpt.get("optimizer") is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
    elif master:
        print("note: the checkpoint has no optimizer state (a transform or import output): a fresh optimizer starts")
    state.iter_num, state.best_val_loss = ckpt["iter_num"], ckpt["best_val_loss"]
    state.last_eval_iter = ckpt.get("last_eval_iter", -1)
    state.rewarm_from = ckpt.get("rewarm_from", 0)
    if "rng" in ckpt:
        set_rng_state(ckpt["rng"])
    dropped = drop_rows_after(metrics_path, state.iter_num) if master else 0
    if dropped:
        print(f"note: {dropped} metrics rows logged after the checkpoint's iteration {state.iter_num} were dropped "
              "(the run stopped without saving them); they are logged again as the run resumes")


def continue_state(cfg: TrainConfig, ckpt: dict | None, model: GPT, optimizer: torch.optim.Optimizer,
                   state: TrainState, master: bool) -> None:
    """init_state: the init checkpoint's iter_num (the schedule's position) and its carried AdamW moments."""
    if ckpt is None:
        raise ConfigError("init_state continues an init checkpoint's state: use it with finetune.py --in_dir=DIR "
                          "(train.py resumes its own runs with --init_from=resume)")
    # a transform output records where its source stopped; a training checkpoint is its own position
    state.iter_num = state.rewarm_from = int(ckpt.get("source_iter_num", ckpt.get("iter_num")) or 0)
    if cfg.max_iters <= state.iter_num:
        raise ConfigError(f"max_iters={cfg.max_iters} is not beyond the checkpoint's iter_num={state.iter_num}: with "
                          "init_state, max_iters counts from the original run's start; raise --max_iters")
    carried = ckpt.get("optimizer_moments")
    if carried is not None:
        if cfg.optimizer != "adamw":
            raise ConfigError("the checkpoint carries AdamW moments: use --optimizer=adamw with --init_state")
        from lgpt.method.carry import load_moments
        load_moments(optimizer, model, carried)
    if master:
        print(f"continuing at iter {state.iter_num} with "
              + ("the carried AdamW moments" if carried is not None else "a fresh optimizer (none carried)"))


def compiled(model: GPT, cfg: TrainConfig, rt: Runtime) -> torch.nn.Module:
    """torch.compile(model) when asked for and it applies (CUDA, or any device with an explicit compile_backend).
    Dynamo's caches are reset first: one process that trains many models (the experiment harness) would otherwise
    reach its recompile limit after a few architectures and silently run every later model uncompiled."""
    if not cfg.compile or (rt.device_type != "cuda" and not cfg.compile_backend):
        if cfg.compile and "compile" in getattr(cfg, "explicit_keys", ()) and rt.master:  # asked for, not the default
            print(f"note: compile applies on CUDA; on {rt.device_type} the model runs uncompiled (add "
                  "--compile_backend=inductor or aot_eager to compile it here, or --compile=False to silence this)")
        return model
    torch._dynamo.reset()
    return torch.compile(model, backend=cfg.compile_backend or "inductor")


def announce(cfg: TrainConfig, rt: Runtime, model: GPT, grad_accum: int, tokens_per_iter: int) -> None:
    """The run's opening lines: a rounded-up accumulation, the CPU threads, the model's size and where it runs."""
    if grad_accum * rt.world_size != cfg.gradient_accumulation_steps:
        print(f"gradient_accumulation_steps={cfg.gradient_accumulation_steps} rounded up to "
              f"{grad_accum * rt.world_size}: {grad_accum} per process × {rt.world_size} DDP processes")
    announce_threads(rt.device_type)
    print(f"{model.get_num_params() / 1e6:.2f}M parameters, {tokens_per_iter:,} tokens per iteration, "
          f"device {rt.device}, {rt.ptdtype}")


# ----------------------------------------------------------------------------------------------
# What the loop calls


def evaluate(evaluator: Evaluator, iter_num: int) -> dict[str, float]:
    """Mean loss on the fixed eval batches of the val split (and the train split unless ``eval_train`` is off: each
    split's batches have their own seeds, so the val numbers are the same either way). A non-finite loss stops the
    run before it is saved, so the checkpoint on disk stays the last good one."""
    splits = ("train", "val") if evaluator.cfg.eval_train else ("val",)
    losses = {split: evaluator.loss(split) for split in splits}
    for split, value in losses.items():
        if not math.isfinite(value):
            raise TrainingDiverged(f"{split} loss is {value} at iter {iter_num}; {last_good(evaluator.cfg.out_dir)}. "
                                   "Lower learning_rate or raise warmup_iters.")
    return losses


def loss_line(iter_num: int, losses: dict[str, float], basis: str) -> str:
    return (f"step {iter_num}: " + ", ".join(f"{split} loss {value:.4f}" for split, value in losses.items())
            + f" ({basis})")


def save(cfg: TrainConfig, model: GPT, optimizer: torch.optim.Optimizer, st: TrainState, carried: dict,
         complete: bool) -> None:
    """An atomic checkpoint (never half-written, even on kill -9) with everything an exact resume needs: optimizer,
    RNG, iteration. ``complete`` is True only for the final save of a run that reached max_iters."""
    ckpt = {"model": raw_state_dict(model), "model_args": model.config.to_dict(), "config": dataclasses.asdict(cfg),
            "iter_num": st.iter_num, "best_val_loss": st.best_val_loss, "val_loss": st.losses.get("val", math.nan),
            "optimizer": optimizer.state_dict(), "rng": rng_state(), "complete": complete,
            "interrupted": st.stop_signal, "last_eval_iter": st.last_eval_iter, "rewarm_from": st.rewarm_from,
            **carried}
    ramp = ramp_of(model)
    if ramp is not None:  # the masks are still opening: the raw weights, and where the ramp stands
        ckpt["growth_ramp"] = ramp.record()
    save_checkpoint(ckpt, cfg.out_dir)


def last_good(out_dir: str) -> str:
    path = os.path.join(out_dir, "ckpt.pt")
    return (f"the last good checkpoint {path} is kept" if os.path.exists(path)
            else "no checkpoint was saved before it")


def stop_if_diverged(rt: Runtime, nonfinite: torch.Tensor, iter_num: int, out_dir: str) -> None:
    """Stop on a non-finite training loss before the step applies it, so no NaN reaches the weights or a checkpoint.
    One host sync per step (the flag is gathered on the device over the micro-steps); under DDP the ranks agree, so
    every rank stops at the same step and none is left waiting in an all-reduce."""
    if agree(rt, nonfinite):
        raise TrainingDiverged(f"training loss is not finite (nan or inf) at iter {iter_num}; {last_good(out_dir)}. "
                               "Lower learning_rate, raise warmup_iters or set grad_clip.")


def agree(rt: Runtime, flag: torch.Tensor | float) -> float:
    """The largest value of ``flag`` over all DDP processes (this process's own without DDP): every rank takes the
    same decision at the same point, so none is left waiting in a collective the others never reach."""
    value = torch.as_tensor(flag, dtype=torch.float32, device=rt.device).reshape(1)
    if rt.ddp:
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return value.item()


def step_log(iter_num: int, lr: float, dt: float, model: GPT, tokens_per_iter: int, sequences_per_iter: int,
             peak: float | None) -> tuple[dict, str]:
    """The metrics record and console line of one step: loss terms, lr, speed, and MFU (per GPU) where the peak
    is known."""
    terms = {k: v.item() for k, v in model.last_loss_terms.items()}
    speed = tokens_per_iter / dt
    record = {"train/lm_loss": terms["lm"], "lr": lr, "ms_per_iter": dt * 1000, "tokens_per_s": speed}
    line = f"iter {iter_num}: loss {terms['lm']:.4f}, lr {lr:.2e}, {dt * 1000:.1f} ms, {speed:,.0f} tok/s"
    for name in ("kd", "hidden", "norm_reg"):  # distillation's KL and hidden-state terms, the norm regularizer
        if name in terms:
            record[f"train/{name}" + ("_loss" if name in ("kd", "hidden") else "")] = terms[name]
            line += f", {name} {terms[name]:.4f}"
    if peak:
        record["mfu"] = model.estimate_mfu(sequences_per_iter, dt, peak)
        line += f", mfu {record['mfu'] * 100:.1f}%"
    return record, line


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def stop_on_signals(state: TrainState, master: bool) -> Iterator[None]:
    """SIGINT (Ctrl-C), SIGTERM (schedulers; torchrun forwards them to every process) and SIGHUP (a closed terminal
    or ssh session) ask the loop to save and stop at the next iteration boundary, where the state is consistent;
    a second Ctrl-C aborts at once. Installed on every DDP process: a process without it would die at once and
    leave its peers in a collective."""
    def request_stop(signum, frame):
        if state.stop_signal and signum == signal.SIGINT:
            raise KeyboardInterrupt
        state.stop_signal = signal.Signals(signum).name
        if master:
            print(f"\n{state.stop_signal}: saving a checkpoint at the end of this iteration (Ctrl-C again to abort)")

    with signal_handlers(STOP_SIGNALS, request_stop):
        yield


def stop_requested(state: TrainState, rt: Runtime) -> bool:
    """Has any process been asked to stop? Under DDP the processes agree (one tiny all-reduce per iteration), so
    all of them stop at the same iteration whichever received the signal first."""
    code = signal.Signals[state.stop_signal].value if state.stop_signal else 0
    if not rt.ddp:
        return bool(code)
    code = int(agree(rt, code))
    if code and not state.stop_signal:
        state.stop_signal = signal.Signals(code).name
    return bool(code)


@contextmanager
def progress_bar(cfg: TrainConfig, rt: Runtime, initial: int) -> Iterator[object | None]:
    """A tqdm bar with ETA on an interactive terminal (master only); None elsewhere."""
    bar = None
    if rt.master and cfg.progress_bar and sys.stderr.isatty() and not cfg.eval_only:
        from tqdm import tqdm
        bar = tqdm(total=cfg.max_iters, initial=initial, dynamic_ncols=True, leave=False)
    try:
        yield bar
    finally:
        if bar is not None:
            bar.close()


def main(argv: list[str]) -> None:
    cfg = load_config(TrainConfig, argv, prog="train.py")
    with hold_run_dir(cfg.out_dir, "train.py") if int(os.environ.get("RANK", "0")) == 0 else nullcontext():
        summary = train(cfg)
    if cfg.eval_only:
        print(f"evaluated at iter {summary['iter_num']}: val loss {summary['val_loss']:.4f} ({summary['eval_basis']})")
    elif summary.get("val_loss") is not None:
        print(f"done: iter {summary['iter_num']}, val loss {summary['val_loss']:.4f}, "
              f"best {summary['best_val_loss']:.4f} ({summary['eval_basis']})")


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
