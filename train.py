"""
Train a GPT.  ``python train.py configs/shakespeare_char.py --max_iters=500``

Single process on CPU or one GPU, or DDP:  ``torchrun --standalone --nproc_per_node=8 train.py CONFIG``
(NCCL on GPU, gloo on CPU). ``finetune.py`` reuses ``train()`` below: there is one training loop.
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
from torch.distributed import destroy_process_group, init_process_group
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
from lgpt.plumbing.devices import announce_threads, peak_flops, resolve_device
from lgpt.plumbing.errors import ConfigError, TrainingDiverged
from lgpt.plumbing.logger import MetricsLogger, drop_rows_after
from model import GPT, GPTConfig, advance_ramp, ramp_of, raw_state_dict

# model fields a run may set on a model that comes from a checkpoint: the rest is the checkpoint's architecture
CHECKPOINT_OVERRIDABLE = ("dropout", "norm_reg", "block_size")
DTYPES = ("auto", "float32", "bfloat16", "float16")


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


# ----------------------------------------------------------------------------------------------
# Setup: where the run executes, the model, and the state the loop carries


@dataclass
class Runtime:
    """Where and how this process runs: device, precision, DDP rank."""
    device: str
    device_type: str
    ptdtype: torch.dtype
    ddp: bool
    rank: int
    local_rank: int
    world_size: int
    peak_flops: float | None = None  # what MFU is measured against (None: not reported)

    @property
    def master(self) -> bool:
        return self.rank == 0

    def autocast(self):
        if self.ptdtype == torch.float32:
            return nullcontext()
        return torch.amp.autocast(device_type=self.device_type, dtype=self.ptdtype)

    def synchronize(self) -> None:
        """Wait for this process's GPU (timings); nothing elsewhere."""
        if self.device_type == "cuda":
            torch.cuda.synchronize(self.device)


def setup_runtime(cfg: TrainConfig) -> Runtime:
    """Pick the device and dtype; join the DDP process group when launched by torchrun."""
    ddp = int(os.environ.get("RANK", -1)) != -1
    device = resolve_device(cfg.device)
    device_type = device.split(":")[0]
    dtype = cfg.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if device_type != "cuda" and dtype == "float16":
        raise ConfigError(f"dtype='float16' needs a CUDA GPU (its loss scaling is CUDA's); on {device_type} use "
                          "--dtype=bfloat16 (autocast) or float32")
    rank, local_rank, world_size = 0, 0, 1
    if ddp:
        rank, local_rank, world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
        init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
        if device_type == "cuda":
            device = f"cuda:{local_rank}"
    if device_type == "cuda":
        if ":" in device:  # cuda:N without DDP too: synchronize() and new tensors then mean that GPU
            torch.cuda.set_device(torch.device(device))
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    return Runtime(device, device_type, ptdtype, ddp, rank, local_rank, world_size,
                   peak_flops(device, ptdtype, cfg.peak_tflops))


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


def init_model(cfg: TrainConfig, init_checkpoint: dict | None, data_meta: dict | None) -> tuple[GPT, dict | None]:
    """(model, checkpoint to resume from or None) for the run's init_from setting."""
    explicit = getattr(cfg, "explicit_keys", frozenset())
    resume_ckpt = None
    if init_checkpoint is not None:  # finetune.py: weights from a given checkpoint, a fresh optimizer
        check_checkpoint_overrides(cfg, init_checkpoint["model_args"], "the input checkpoint")
        model = model_from_checkpoint(init_checkpoint, growth_masks=True, dropout=cfg.dropout,
                                      **({"norm_reg": cfg.norm_reg} if "norm_reg" in explicit else {}))
    elif cfg.init_from == "resume":
        resume_ckpt = load_checkpoint(cfg.out_dir)
        check_checkpoint_overrides(cfg, resume_ckpt["model_args"], f"the checkpoint in {cfg.out_dir} (resume)")
        model = model_from_checkpoint(resume_ckpt, growth_masks=True, **{k: getattr(cfg, k) for k in
                                                                         ("dropout", "norm_reg") if k in explicit})
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


@dataclass
class TrainState:
    """What the loop changes; saved in every checkpoint."""
    iter_num: int = 0
    best_val_loss: float = float("inf")
    losses: dict = field(default_factory=dict)
    stop_signal: str | None = None  # 'SIGINT' / 'SIGTERM' once a stop was requested
    last_eval_iter: int = -1  # a resumed run does not evaluate again the step its checkpoint evaluated
    rewarm_from: int = 0  # the iteration a continued state (init_state) started at: the re-warmup's origin


@dataclass
class Run:
    """Everything one training run holds: settings, runtime, model (raw / for training / for evaluation),
    optimizer, data, logger and the state. Built by ``setup``; the steps below take it."""
    cfg: TrainConfig
    rt: Runtime
    model: GPT
    train_model: torch.nn.Module
    eval_model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    loader: BatchLoader
    logger: MetricsLogger
    meta: dict | None
    extra_checkpoint: dict
    grad_accum: int
    tokens_per_iter: int
    on_eval: Callable[[int, dict], dict | None] | None
    state: TrainState
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None  # None: the model's own LM loss


def setup(cfg: TrainConfig, init_checkpoint: dict | None, on_eval, extra_checkpoint: dict | None,
          logger_name: str) -> Run:
    """Runtime, data, model, optimizer (restored on resume), wrappers and logger, checked before any write."""
    if cfg.init_from != "resume":
        check_output_dir(cfg.out_dir, overwrite=cfg.overwrite)
    rt = setup_runtime(cfg)
    torch.manual_seed(cfg.seed)
    data_dir = cfg.resolved_data_dir()
    if rt.master and not cfg.data_dir:  # the repo's own data/<dataset>: prepared on first use, as nanoGPT
        ensure_prepared(data_dir, cfg.dataset)
    if rt.ddp:
        torch.distributed.barrier()
    grad_accum = math.ceil(cfg.gradient_accumulation_steps / rt.world_size)  # per process
    model, resume_ckpt = init_model(cfg, init_checkpoint, load_meta(data_dir))
    source_ckpt = resume_ckpt or init_checkpoint
    model_meta = source_ckpt.get("meta") if source_ckpt else GPT2_META if cfg.init_from.startswith("gpt2") else None
    data_meta = check_tokenizer(model_meta, data_dir, "--data_dir", model.config.vocab_size)
    meta = model_meta or data_meta  # the tokenizer recorded in our checkpoints
    loader = BatchLoader(data_dir, model.config.block_size, cfg.batch_size, rt.device)
    model.to(rt.device)
    scaler = torch.amp.GradScaler(rt.device_type, enabled=rt.ptdtype == torch.float16)
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2),
                                           rt.device_type, cfg.optimizer)
    state = TrainState()
    extra_checkpoint = dict(extra_checkpoint or {})
    if resume_ckpt is not None:
        restore(resume_ckpt, optimizer, state, extra_checkpoint, rt.master)
        dropped = drop_rows_after(os.path.join(cfg.out_dir, logger_name), state.iter_num) if rt.master else 0
        if dropped:
            print(f"note: {dropped} metrics rows logged after the checkpoint's iteration {state.iter_num} were dropped "
                  "(the run stopped without saving them); they are logged again as the run resumes")
    elif cfg.init_state:
        continue_state(cfg, init_checkpoint, model, optimizer, state, rt.master)
    elif cfg.overwrite and rt.master and os.path.exists(os.path.join(cfg.out_dir, logger_name)):
        os.remove(os.path.join(cfg.out_dir, logger_name))  # a new run: never append to the replaced run's metrics
    train_model = compiled(model, cfg, rt)
    eval_model = train_model  # rank 0 evaluates alone, so never through the DDP wrapper (it would wait for peers)
    if rt.ddp:
        train_model = DDP(train_model, device_ids=[rt.local_rank] if rt.device_type == "cuda" else None)
    logger = MetricsLogger(cfg.out_dir, enabled=rt.master, wandb_log=cfg.wandb_log, project=cfg.wandb_project,
                           run_name=cfg.wandb_run_name, config=dataclasses.asdict(cfg), filename=logger_name)
    tokens_per_iter = grad_accum * rt.world_size * cfg.batch_size * model.config.block_size
    if rt.master:
        if grad_accum * rt.world_size != cfg.gradient_accumulation_steps:
            print(f"gradient_accumulation_steps={cfg.gradient_accumulation_steps} rounded up to "
                  f"{grad_accum * rt.world_size}: {grad_accum} per process × {rt.world_size} DDP processes")
        announce_threads(rt.device_type)
        print(f"{model.get_num_params() / 1e6:.2f}M parameters, {tokens_per_iter:,} tokens per iteration, "
              f"device {rt.device}, {rt.ptdtype}")
    return Run(cfg, rt, model, train_model, eval_model, optimizer, scaler, loader, logger, meta, extra_checkpoint,
               grad_accum, tokens_per_iter, on_eval, state)


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


def restore(ckpt: dict, optimizer: torch.optim.Optimizer, state: TrainState, extra: dict, master: bool) -> None:
    """Resume: optimizer, iteration, best loss, RNG and the records a checkpoint carries (transform, finetune)."""
    if ckpt.get("optimizer") is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
    elif master:
        print("note: the checkpoint has no optimizer state (a transform or import output): a fresh optimizer starts")
    state.iter_num, state.best_val_loss = ckpt["iter_num"], ckpt["best_val_loss"]
    state.last_eval_iter = ckpt.get("last_eval_iter", -1)
    state.rewarm_from = ckpt.get("rewarm_from", 0)
    if "rng" in ckpt:
        set_rng_state(ckpt["rng"])
    for key in ("transform", "finetune"):
        if key in ckpt and key not in extra:
            extra[key] = ckpt[key]


# ----------------------------------------------------------------------------------------------
# The steps of the loop


def save(run: Run, val_loss: float, complete: bool) -> None:
    """An atomic checkpoint; ``complete`` is True only for the final save of a run that reached max_iters."""
    st = run.state
    ckpt = {"model": raw_state_dict(run.model), "model_args": run.model.config.to_dict(),
            "config": dataclasses.asdict(run.cfg), "iter_num": st.iter_num, "best_val_loss": st.best_val_loss,
            "val_loss": val_loss, "optimizer": run.optimizer.state_dict(), "rng": rng_state(), "meta": run.meta,
            "complete": complete, "interrupted": st.stop_signal, "last_eval_iter": st.last_eval_iter,
            "rewarm_from": st.rewarm_from}
    ckpt.update(run.extra_checkpoint)
    ramp = ramp_of(run.model)
    if ramp is not None:  # the masks are still opening: the raw weights, and where the ramp stands
        ckpt["growth_ramp"] = ramp.record()
    save_checkpoint(ckpt, run.cfg.out_dir)


def evaluate(run: Run) -> dict:
    """Mean loss on the fixed eval batches of the val split (and the train split unless ``eval_train`` is off: each
    split's batches have their own seeds, so the val numbers are the same either way); a non-finite loss stops the
    run."""
    cfg = run.cfg
    splits = ("train", "val") if cfg.eval_train else ("val",)
    losses = {split: evaluate_loss(run.eval_model, run.loader, split, cfg.eval_iters, cfg.eval_batch_seed(),
                                   run.rt.autocast()) for split in splits}
    for split, value in losses.items():
        if not math.isfinite(value):
            raise TrainingDiverged(f"{split} loss is {value} at iter {run.state.iter_num}; {last_good(run)}. "
                                   "Lower learning_rate or raise warmup_iters.")
    return losses


def loss_record(losses: dict[str, float]) -> dict[str, float]:
    """The metrics of one evaluation: ``train/loss`` (when evaluated) and ``val/loss``."""
    return {f"{split}/loss": value for split, value in losses.items()}


def loss_line(iter_num: int, losses: dict[str, float], basis: str) -> str:
    return (f"step {iter_num}: " + ", ".join(f"{split} loss {value:.4f}" for split, value in losses.items())
            + f" ({basis})")


def eval_basis(run: Run) -> str:
    """The basis of the losses the training log prints (each split on its own fixed batches)."""
    return loss_basis(run.loader, run.cfg.eval_iters, run.cfg.eval_batch_seed(), split=None)


def last_good(run: Run) -> str:
    path = os.path.join(run.cfg.out_dir, "ckpt.pt")
    return (f"the last good checkpoint {path} is kept" if os.path.exists(path)
            else "no checkpoint was saved before it")


def eval_and_save(run: Run, final: bool = False) -> None:
    """Evaluate, log (with the ``on_eval`` callback's values), and save when due."""
    cfg, st = run.cfg, run.state
    st.losses = evaluate(run)
    st.last_eval_iter = st.iter_num
    record = {**loss_record(st.losses), "lr": get_lr(st.iter_num, cfg, st.rewarm_from)}
    if run.on_eval is not None:
        record.update(run.on_eval(st.iter_num, st.losses) or {})
    print(loss_line(st.iter_num, st.losses, eval_basis(run)))
    run.logger.log(record, step=st.iter_num)
    improved = st.losses["val"] < st.best_val_loss
    st.best_val_loss = min(st.best_val_loss, st.losses["val"])
    if (improved or cfg.always_save_checkpoint or final) and st.iter_num > 0 and not cfg.eval_only:
        save(run, st.losses["val"], complete=final)


def optimisation_step(run: Run) -> float:
    """One step: set the LR, accumulate gradients over the micro-batches, clip, update. Returns seconds taken."""
    cfg, rt, it = run.cfg, run.rt, run.state.iter_num
    t0 = time.perf_counter()
    for group in run.optimizer.param_groups:
        group["lr"] = get_lr(it, cfg, run.state.rewarm_from)
    if cfg.dropout > 0:  # dropout's randomness is a function of (seed, iter, rank) too: exact resume
        torch.manual_seed(batch_seed(cfg.seed, it, -1, rt.rank))
    x, y = run.loader.get_batch("train", batch_seed(cfg.seed, it, 0, rt.rank))
    nonfinite = torch.zeros((), device=rt.device)  # stays on the device: no host sync per micro-step
    for micro_step in range(run.grad_accum):
        if rt.ddp:  # sync gradients on the last micro-step only
            run.train_model.require_backward_grad_sync = micro_step == run.grad_accum - 1
        with rt.autocast():
            loss = run.loss_fn(x, y) if run.loss_fn is not None else run.train_model(x, y)[1]
            loss = loss / run.grad_accum
        if micro_step + 1 < run.grad_accum:  # fetch the next micro-batch while backward runs on GPU
            x, y = run.loader.get_batch("train", batch_seed(cfg.seed, it, micro_step + 1, rt.rank))
        nonfinite = torch.maximum(nonfinite, (~torch.isfinite(loss.detach())).float())
        run.scaler.scale(loss).backward()
    if agree(rt, nonfinite):  # one sync per step; under DDP every rank stops together (none waits in an all-reduce)
        raise TrainingDiverged(f"training loss is not finite (nan or inf) at iter {it}; {last_good(run)}. "
                               "Lower learning_rate, raise warmup_iters or set grad_clip.")
    if cfg.grad_clip > 0:
        run.scaler.unscale_(run.optimizer)
        torch.nn.utils.clip_grad_norm_(run.train_model.parameters(), cfg.grad_clip)
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.optimizer.zero_grad(set_to_none=True)
    advance_ramp(run.model)  # a model grown with MSG masks: they open by one step
    rt.synchronize()
    return time.perf_counter() - t0


def agree(rt: Runtime, flag: torch.Tensor | float) -> float:
    """The largest value of ``flag`` over all DDP processes (this process's own without DDP): every rank takes the
    same decision at the same point, so none is left waiting in a collective the others never reach."""
    value = torch.as_tensor(flag, dtype=torch.float32, device=rt.device).reshape(1)
    if rt.ddp:
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return value.item()


def log_step(run: Run, dt: float, write: Callable[[str], object] = print) -> None:
    """The console line and metrics record of one step (loss terms, lr, speed, MFU on GPU)."""
    terms = {k: v.item() for k, v in run.model.last_loss_terms.items()}
    lr = get_lr(run.state.iter_num, run.cfg, run.state.rewarm_from)
    record = {"train/lm_loss": terms["lm"], "lr": lr, "ms_per_iter": dt * 1000,
              "tokens_per_s": run.tokens_per_iter / dt}
    line = f"iter {run.state.iter_num}: loss {terms['lm']:.4f}, lr {lr:.2e}, {dt * 1000:.1f} ms, " \
           f"{run.tokens_per_iter / dt:,.0f} tok/s"
    for name in ("kd", "hidden", "norm_reg"):  # distillation's KL and hidden-state terms, the norm regularizer
        if name in terms:
            record[f"train/{name}" + ("_loss" if name in ("kd", "hidden") else "")] = terms[name]
            line += f", {name} {terms[name]:.4f}"
    if run.rt.peak_flops:
        record["mfu"] = run.model.estimate_mfu(run.cfg.batch_size * run.grad_accum, dt, run.rt.peak_flops)  # per GPU
        line += f", mfu {record['mfu'] * 100:.1f}%"
    run.logger.log(record, step=run.state.iter_num)
    write(line)


@contextmanager
def stop_on_signals(state: TrainState, master: bool) -> Iterator[None]:
    """SIGINT (Ctrl-C) and SIGTERM (schedulers; torchrun forwards them to every process) ask the loop to save and
    stop at the next iteration boundary, where the state is consistent; a second Ctrl-C aborts at once. Installed
    on every DDP process: a process without it would die at once and leave its peers in a collective."""
    def request_stop(signum, frame):
        if state.stop_signal and signum == signal.SIGINT:
            raise KeyboardInterrupt
        state.stop_signal = signal.Signals(signum).name
        if master:
            print(f"\n{state.stop_signal}: saving a checkpoint at the end of this iteration (Ctrl-C again to abort)")

    with signal_handlers((signal.SIGINT, signal.SIGTERM), request_stop):
        yield


def stop_requested(run: Run) -> bool:
    """Has any process been asked to stop? Under DDP the processes agree (one tiny all-reduce per iteration), so
    all of them stop at the same iteration whichever received the signal first."""
    code = signal.Signals[run.state.stop_signal].value if run.state.stop_signal else 0
    if not run.rt.ddp:
        return bool(code)
    code = int(agree(run.rt, code))
    if code and not run.state.stop_signal:
        run.state.stop_signal = signal.Signals(code).name
    return bool(code)


@contextmanager
def progress_bar(run: Run) -> Iterator[object | None]:
    cfg = run.cfg
    bar = None
    if run.rt.master and cfg.progress_bar and sys.stderr.isatty() and not cfg.eval_only:
        from tqdm import tqdm
        bar = tqdm(total=cfg.max_iters, initial=run.state.iter_num, dynamic_ncols=True, leave=False)
    try:
        yield bar
    finally:
        if bar is not None:
            bar.close()


# ----------------------------------------------------------------------------------------------
# The loop


def train(cfg: TrainConfig, init_checkpoint: dict | None = None,
          on_eval: Callable[[int, dict], dict | None] | None = None, extra_checkpoint: dict | None = None,
          logger_name: str = "metrics.jsonl", make_loss: Callable[[Run], Callable] | None = None,
          on_start: Callable[[Run], None] | None = None) -> dict:
    """The training loop: warmup + cosine LR, gradient accumulation, clipping, periodic evaluation and
    atomic checkpoints, exact resume, SIGINT/SIGTERM save and raise ``Interrupted``, NaN stops. Returns a summary.

    ``init_checkpoint``: start from these weights with a fresh optimizer (finetuning).
    ``on_eval(iter_num, losses)``: called after each evaluation; a dict it returns is logged too.
    ``extra_checkpoint``: extra keys stored in every checkpoint (e.g. the transform record).
    ``make_loss(run)``: returns the training loss of a micro-batch, loss_fn(x, y), in place of the LM loss
    (distillation); it must set ``run.model.last_loss_terms`` for the log.
    ``on_start(run)``: called on every process once the run is set up (device, dtype, process group, loader), before
    the first step (finetuning's reference loss).
    """
    run = setup(cfg, init_checkpoint, on_eval, extra_checkpoint, logger_name)
    if make_loss is not None:
        run.loss_fn = make_loss(run)
    if on_start is not None:
        on_start(run)
    st, master = run.state, run.rt.master
    step_times: list[float] = []
    try:
        with stop_on_signals(st, master), progress_bar(run) as bar:
            if cfg.eval_only:
                st.losses = evaluate(run)  # printed, not appended to the run's metrics: evaluating changes no run
                print(loss_line(st.iter_num, st.losses, eval_basis(run)))
                return {"iter_num": st.iter_num, "train_loss": st.losses.get("train"), "val_loss": st.losses["val"],
                        "eval_basis": eval_basis(run)}
            while st.iter_num < cfg.max_iters:
                if st.iter_num % cfg.eval_interval == 0 and st.iter_num != st.last_eval_iter and master:
                    eval_and_save(run)
                if stop_requested(run):
                    if master:
                        save(run, st.losses.get("val", float("nan")), complete=False)
                    if run.rt.ddp:
                        torch.distributed.barrier()  # the checkpoint is written before any process leaves
                    raise Interrupted(f"saved {cfg.out_dir}/ckpt.pt at iter {st.iter_num} (marked incomplete); "
                                      "resume with --init_from=resume")
                dt = optimisation_step(run)
                step_times.append(dt)
                if st.iter_num % cfg.log_interval == 0 and master:
                    log_step(run, dt, bar.write if bar else print)
                st.iter_num += 1
                if bar:
                    bar.update(1)
            if master:
                eval_and_save(run, final=True)
    finally:
        run.logger.summary({"best_val_loss": st.best_val_loss})
        run.logger.finish()
        if run.rt.ddp:
            destroy_process_group()
    timed = sorted(step_times[1:]) or step_times
    return {"iter_num": st.iter_num, "train_loss": st.losses.get("train"), "val_loss": st.losses.get("val"),
            "best_val_loss": st.best_val_loss, "eval_basis": eval_basis(run),
            "ms_per_iter_median": 1000 * timed[len(timed) // 2] if timed else None}


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
