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
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

from checkpoint import load_checkpoint, model_from_checkpoint, rng_state, save_checkpoint, set_rng_state
from configurator import ConfigError, load_config
from dataset import BatchLoader, batch_seed, ensure_prepared, evaluate_loss, load_meta
from logger import MetricsLogger
from model import GPT, GPTConfig


@dataclass
class TrainConfig(GPTConfig):
    """Every run setting. The GPTConfig fields above are the model's; they are validated when it is built."""
    vocab_size: int | None = None  # None: from the dataset's meta.pkl (else GPT-2's padded 50304)
    # I/O
    out_dir: str = "out"
    eval_interval: int = 250
    log_interval: int = 10
    eval_iters: int = 200
    eval_only: bool = False
    always_save_checkpoint: bool = True
    init_from: str = "scratch"  # 'scratch' | 'resume' | 'gpt2' | 'gpt2-medium' | 'gpt2-large' | 'gpt2-xl'
    progress_bar: bool = True  # a tqdm bar on interactive terminals
    # logging
    wandb_log: bool = False
    wandb_project: str = "nanolgpt"
    wandb_run_name: str = "run"
    # data
    dataset: str = "shakespeare_char"
    data_dir: str = ""  # '' → data/<dataset>
    gradient_accumulation_steps: int = 1
    batch_size: int = 12
    # optimizer
    optimizer: str = "adamw"  # 'adamw' | 'adafactor'
    learning_rate: float = 1e-3
    max_iters: int = 2000
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # 0 disables clipping
    # learning-rate schedule: linear warmup, then cosine decay to min_lr
    decay_lr: bool = True
    warmup_iters: int = 100
    lr_decay_iters: int = 2000
    min_lr: float = 1e-4
    # system
    device: str = "auto"  # 'auto' (cuda if available, else cpu) | 'cpu' | 'cuda' | 'cuda:1' | 'mps'
    dtype: str = "auto"  # 'auto' (bfloat16 on a GPU that has it, float32 on CPU) | 'float32' | 'bfloat16' | 'float16'
    compile: bool = True  # torch.compile; used on CUDA only
    seed: int = 1337

    def __post_init__(self) -> None:  # the model fields are checked by GPTConfig when the model is built
        pass

    def validate(self) -> None:
        positive = ("eval_interval", "log_interval", "eval_iters", "gradient_accumulation_steps", "batch_size")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.max_iters < 0:
            raise ConfigError(f"max_iters must be >= 0, got {self.max_iters}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype={self.dtype!r} is not one of ('auto', 'float32', 'bfloat16', 'float16')")
        if self.optimizer not in ("adamw", "adafactor"):
            raise ConfigError(f"optimizer={self.optimizer!r} is not one of ('adamw', 'adafactor')")
        if self.learning_rate <= 0 or self.min_lr < 0:
            raise ConfigError("learning_rate must be > 0 and min_lr >= 0")
        GPTConfig(**self.model_args(vocab_size=self.vocab_size or 50304))  # fail early on model fields

    def model_args(self, **overrides) -> dict:
        args = {f: getattr(self, f) for f in GPTConfig.field_names()}
        args.update(overrides)
        return args

    def resolved_data_dir(self) -> str:
        return self.data_dir or os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", self.dataset)


def get_lr(it: int, cfg: TrainConfig) -> float:
    """Linear warmup for warmup_iters, cosine decay to min_lr at lr_decay_iters, min_lr after."""
    if not cfg.decay_lr:
        return cfg.learning_rate
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    if it >= cfg.lr_decay_iters:
        return cfg.min_lr
    ratio = (it - cfg.warmup_iters) / max(1, cfg.lr_decay_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.learning_rate - cfg.min_lr)


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


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

    @property
    def master(self) -> bool:
        return self.rank == 0

    def autocast(self):
        if self.device_type == "cpu" or self.ptdtype == torch.float32:
            return nullcontext()
        return torch.amp.autocast(device_type=self.device_type, dtype=self.ptdtype)


def setup_runtime(cfg: TrainConfig) -> Runtime:
    """Pick the device and dtype; join the DDP process group when launched by torchrun."""
    ddp = int(os.environ.get("RANK", -1)) != -1
    device = cfg.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    rank, local_rank, world_size = 0, 0, 1
    if ddp:
        rank, local_rank, world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
        backend = "nccl" if device.startswith("cuda") else "gloo"
        init_process_group(backend=backend)
        if device.startswith("cuda"):
            device = f"cuda:{local_rank}"
            torch.cuda.set_device(device)
    device_type = "cuda" if device.startswith("cuda") else device.split(":")[0]
    dtype = cfg.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    return Runtime(device, device_type, ptdtype, ddp, rank, local_rank, world_size)


def build_model(cfg: TrainConfig, init_checkpoint: dict | None, data_meta: dict | None):
    """(model, checkpoint to resume from or None, model_args) for the run's init_from setting."""
    if init_checkpoint is not None:  # finetune.py: weights from a given checkpoint, a fresh optimizer
        model = model_from_checkpoint(init_checkpoint, dropout=cfg.dropout)
        return model, None, model.config.to_dict()
    if cfg.init_from == "resume":
        ckpt = load_checkpoint(cfg.out_dir)
        model = model_from_checkpoint(ckpt)
        return model, ckpt, model.config.to_dict()
    if cfg.init_from.startswith("gpt2"):
        from convert import gpt2_from_pretrained
        model = gpt2_from_pretrained(cfg.init_from, dropout=cfg.dropout)
        return model, None, model.config.to_dict()
    if cfg.init_from != "scratch":
        raise ConfigError(f"init_from={cfg.init_from!r} is not one of 'scratch', 'resume', 'gpt2', "
                          "'gpt2-medium', 'gpt2-large', 'gpt2-xl'")
    vocab_size = cfg.vocab_size or (data_meta["vocab_size"] if data_meta else 50304)
    model = GPT(GPTConfig(**cfg.model_args(vocab_size=vocab_size)))
    return model, None, model.config.to_dict()


def train(cfg: TrainConfig, init_checkpoint: dict | None = None,
          on_eval: Callable[[int, dict], dict | None] | None = None, extra_checkpoint: dict | None = None,
          logger_name: str = "metrics.jsonl") -> dict:
    """The training loop: warmup + cosine LR, gradient accumulation, clipping, periodic evaluation and
    atomic checkpoints, exact resume, Ctrl-C saves, NaN stops. Returns a summary dict.

    ``init_checkpoint``: start from these weights with a fresh optimizer (finetuning).
    ``on_eval(iter_num, losses)``: called after each evaluation; a dict it returns is logged too.
    ``extra_checkpoint``: extra keys stored in every checkpoint (e.g. the transform record).
    """
    rt = setup_runtime(cfg)
    torch.manual_seed(cfg.seed)
    data_dir = cfg.resolved_data_dir()
    if rt.master:
        ensure_prepared(data_dir, cfg.dataset)
    if rt.ddp:
        torch.distributed.barrier()
    if cfg.gradient_accumulation_steps % rt.world_size:
        raise ConfigError(f"gradient_accumulation_steps={cfg.gradient_accumulation_steps} must be divisible by "
                          f"the number of DDP processes ({rt.world_size})")
    grad_accum = cfg.gradient_accumulation_steps // rt.world_size
    data_meta = load_meta(data_dir)
    meta = (init_checkpoint or {}).get("meta") or data_meta  # the tokenizer recorded in our checkpoints

    model, resume_ckpt, model_args = build_model(cfg, init_checkpoint, data_meta)
    if data_meta and data_meta["vocab_size"] > model.config.vocab_size:
        raise ConfigError(f"the data in {data_dir} has vocab_size {data_meta['vocab_size']} but the model only "
                          f"{model.config.vocab_size}; use a dataset with the model's tokenizer")
    block_size = model.config.block_size
    loader = BatchLoader(data_dir, block_size, cfg.batch_size, rt.device)
    model.to(rt.device)
    scaler = torch.amp.GradScaler(enabled=rt.ptdtype == torch.float16)
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2),
                                           rt.device_type, cfg.optimizer)
    iter_num, best_val_loss = 0, float("inf")
    if resume_ckpt is not None:
        optimizer.load_state_dict(resume_ckpt["optimizer"])
        iter_num, best_val_loss = resume_ckpt["iter_num"], resume_ckpt["best_val_loss"]
        if "rng" in resume_ckpt:
            set_rng_state(resume_ckpt["rng"])
        extra_checkpoint = {k: resume_ckpt[k] for k in ("transform", "finetune") if k in resume_ckpt} | (
            extra_checkpoint or {})
        meta = resume_ckpt.get("meta", meta)
        resume_ckpt = None  # free the memory

    raw_model = model
    if cfg.compile and rt.device_type == "cuda":
        model = torch.compile(model)
    eval_model = model  # rank 0 evaluates alone, so never through the DDP wrapper (it would wait for peers)
    if rt.ddp:
        model = DDP(model, device_ids=[rt.local_rank] if rt.device_type == "cuda" else None)

    logger = MetricsLogger(cfg.out_dir, enabled=rt.master, wandb_log=cfg.wandb_log, project=cfg.wandb_project,
                           run_name=cfg.wandb_run_name, config=dataclasses.asdict(cfg), filename=logger_name)
    tokens_per_iter = grad_accum * rt.world_size * cfg.batch_size * block_size
    if rt.master:
        print(f"{raw_model.get_num_params() / 1e6:.2f}M parameters, {tokens_per_iter:,} tokens per iteration, "
              f"device {rt.device}, {rt.ptdtype}")

    def checkpoint(val_loss: float) -> None:
        ckpt = {"model": raw_model.state_dict(), "model_args": model_args, "config": dataclasses.asdict(cfg),
                "iter_num": iter_num, "best_val_loss": best_val_loss, "val_loss": val_loss,
                "optimizer": optimizer.state_dict(), "rng": rng_state(), "meta": meta}
        ckpt.update(extra_checkpoint or {})
        save_checkpoint(ckpt, cfg.out_dir)

    def evaluate() -> dict:
        losses = {split: evaluate_loss(eval_model, loader, split, cfg.eval_iters, cfg.seed, rt.autocast())
                  for split in ("train", "val")}
        for split, value in losses.items():
            if not math.isfinite(value):
                raise TrainingDiverged(f"{split} loss is {value} at iter {iter_num}; the last good checkpoint in "
                                       f"{cfg.out_dir} is kept. Lower learning_rate or raise warmup_iters.")
        return losses

    def eval_and_save(final: bool = False) -> dict:
        nonlocal best_val_loss
        losses = evaluate()
        record = {"train/loss": losses["train"], "val/loss": losses["val"], "lr": get_lr(iter_num, cfg)}
        if on_eval is not None:
            record.update(on_eval(iter_num, losses) or {})
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        logger.log(record, step=iter_num)
        improved = losses["val"] < best_val_loss
        best_val_loss = min(best_val_loss, losses["val"])
        if (improved or cfg.always_save_checkpoint or final) and iter_num > 0 and not cfg.eval_only:
            checkpoint(losses["val"])
        return losses

    # Ctrl-C asks the loop to stop at the next iteration boundary, where the state is consistent
    stop_requested = False

    def request_stop(signum, frame):
        nonlocal stop_requested
        if stop_requested:
            raise KeyboardInterrupt
        stop_requested = True
        print("\ninterrupt: saving a checkpoint at the end of this iteration (Ctrl-C again to abort)")

    previous_handler = signal.signal(signal.SIGINT, request_stop) if rt.master else None
    progress = None
    if rt.master and cfg.progress_bar and sys.stderr.isatty() and not cfg.eval_only:
        from tqdm import tqdm
        progress = tqdm(total=cfg.max_iters, initial=iter_num, dynamic_ncols=True, leave=False)
    step_times: list[float] = []
    losses = {}
    try:
        if cfg.eval_only:
            losses = evaluate()
            print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
            logger.log({"train/loss": losses["train"], "val/loss": losses["val"]}, step=iter_num)
            return {"iter_num": iter_num, "train_loss": losses["train"], "val_loss": losses["val"]}
        while iter_num < cfg.max_iters:
            if iter_num % cfg.eval_interval == 0 and rt.master:
                losses = eval_and_save()
            if stop_requested:
                checkpoint(losses.get("val", float("nan")))
                print(f"saved {cfg.out_dir}/ckpt.pt at iter {iter_num}; resume with --init_from=resume")
                break
            t0 = time.perf_counter()
            lr = get_lr(iter_num, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            if cfg.dropout > 0:  # dropout's randomness is a function of (seed, iter, rank) too: exact resume
                torch.manual_seed(batch_seed(cfg.seed, iter_num, -1, rt.rank))
            x, y = loader.get_batch("train", batch_seed(cfg.seed, iter_num, 0, rt.rank))
            for micro_step in range(grad_accum):
                if rt.ddp:  # sync gradients on the last micro-step only
                    model.require_backward_grad_sync = micro_step == grad_accum - 1
                with rt.autocast():
                    _, loss = model(x, y)
                    loss = loss / grad_accum
                if micro_step + 1 < grad_accum:  # fetch the next micro-batch while backward runs on GPU
                    x, y = loader.get_batch("train", batch_seed(cfg.seed, iter_num, micro_step + 1, rt.rank))
                if not torch.isfinite(loss):
                    raise TrainingDiverged(f"training loss is {loss.item() * grad_accum} at iter {iter_num}; the "
                                           f"last good checkpoint in {cfg.out_dir} is kept. Lower learning_rate, "
                                           "raise warmup_iters or set grad_clip.")
                scaler.scale(loss).backward()
            if cfg.grad_clip > 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            if rt.device_type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            step_times.append(dt)
            if iter_num % cfg.log_interval == 0 and rt.master:
                terms = {k: v.item() for k, v in raw_model.last_loss_terms.items()}
                record = {"train/lm_loss": terms["lm"], "lr": lr, "ms_per_iter": dt * 1000,
                          "tokens_per_s": tokens_per_iter / dt}
                if "norm_reg" in terms:
                    record["train/norm_reg"] = terms["norm_reg"]
                line = f"iter {iter_num}: loss {terms['lm']:.4f}, lr {lr:.2e}, {dt * 1000:.1f} ms, " \
                       f"{tokens_per_iter / dt:,.0f} tok/s"
                if "norm_reg" in terms:
                    line += f", norm_reg {terms['norm_reg']:.4f}"
                if rt.device_type == "cuda":
                    record["mfu"] = raw_model.estimate_mfu(cfg.batch_size * grad_accum, dt)
                    line += f", mfu {record['mfu'] * 100:.1f}%"
                logger.log(record, step=iter_num)
                (progress.write if progress else print)(line)
            iter_num += 1
            if progress:
                progress.update(1)
        else:
            if rt.master:
                losses = eval_and_save(final=True)
    finally:
        if progress:
            progress.close()
        if previous_handler is not None:
            signal.signal(signal.SIGINT, previous_handler)
        logger.summary({"best_val_loss": best_val_loss})
        logger.finish()
        if rt.ddp:
            destroy_process_group()
    timed = sorted(step_times[1:]) or step_times
    return {"iter_num": iter_num, "train_loss": losses.get("train"), "val_loss": losses.get("val"),
            "best_val_loss": best_val_loss, "ms_per_iter_median": 1000 * timed[len(timed) // 2] if timed else None}


def main(argv: list[str]) -> None:
    cfg = load_config(TrainConfig, argv)
    summary = train(cfg)
    if summary.get("val_loss") is not None:
        print(f"done: iter {summary['iter_num']}, val loss {summary['val_loss']:.4f}, "
              f"best {summary['best_val_loss']:.4f}")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (ConfigError, TrainingDiverged) as e:
        sys.exit(f"error: {e}")
