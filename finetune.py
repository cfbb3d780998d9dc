"""
Brief recovery finetuning of a (transformed) checkpoint, through train.py's own training loop.

    python finetune.py --in_dir=out-m96 --out_dir=out-m96-ft --max_iters=200

Records the recovery curve (val loss at every evaluation) and the steps to recover: the first
evaluation step whose val loss is ≤ (1 + recover_tol) × the reference model's val loss. The reference
is the untransformed model named in the transform record (evaluated on the same val batches), or
``reference_val_loss`` when given. Everything lands in out_dir/metrics.jsonl, out_dir/finetune.json,
the checkpoint's ``finetune`` record and wandb.

A reference that got no extra training flatters recovery (finetuning an exact copy also lowers its loss), so
recovery is measured against a **control**: ``--control_dir`` names a finished finetune of the untransformed
model (its canonical same-width form: ``transform.py --kind=truncate --width=d``) run with the identical
recipe, data order and eval batches; the record then holds the gap to the control at every evaluation and
the steps to recover against it (the first evaluation with val ≤ (1 + recover_tol) × the control's val).
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import ClassVar

import torch

from lgpt.method.distill import distillation_loss
from lgpt.method.geometry import energy_outside_range
from lgpt.plumbing.checkpoint import (
    check_output_dir,
    check_transform_source,
    hold_run_dir,
    is_interrupted,
    load_checkpoint,
    load_model,
    model_from_checkpoint,
)
from lgpt.plumbing.cli import run_cli
from lgpt.plumbing.configurator import load_config
from lgpt.plumbing.dataset import (
    GPT2_META,
    check_tokenizer,
    data_dir_for_checkpoint,
    dataset_dir,
    tokenizer_fingerprint,
)
from lgpt.plumbing.errors import ConfigError
from train import Evaluator, TrainConfig, train


@dataclass
class FinetuneConfig(TrainConfig):
    """TrainConfig with finetuning defaults (tuned on the small CPU configs; docs/finetune_and_geometry.md)."""
    HELP_OMITS: ClassVar[tuple[str, ...]] = ()
    # finetuning
    in_dir: str = ""  # the checkpoint to finetune (required, unless init_from is a GPT-2 name)
    out_dir: str = ""  # where the finetuned ckpt.pt, metrics.jsonl and finetune.json go (required)
    recover_tol: float = 0.01  # recovered when val ≤ (1 + tol) × reference val loss
    reference_val_loss: float | None = None  # None: evaluate the reference named in the transform record
    control_dir: str = ""  # a finished finetune of the untransformed model with this recipe: recovery vs control
    control_any_loss: bool = False  # accept a control finetuned with another loss (the distill settings), to read
    #                                 several losses against one LM-finetuned control (the toy recovery experiments)
    # distillation from the original model (distill.py)
    distill: bool = False  # train on α·τ²·KL(teacher ‖ student) + (1 − α)·CE instead of CE alone
    teacher_dir: str = ""  # the teacher ('' → the transform record's source model)
    distill_alpha: float = 1.0  # weight α of the KL term (1: pure distillation, 0: plain LM loss)
    distill_temperature: float = 1.0  # τ of both softmaxes
    distill_chunk: int = 1024  # positions whose logits are held at once (memory, not results)
    distill_hidden: float = 0.0  # weight β of the hidden-state term: every block's output against T·(the teacher's)
    dataset: str = ""  # '' → the dataset recorded in in_dir's checkpoint
    learning_rate: float = 3e-4
    min_lr: float = 3e-5
    warmup_iters: int = 20
    max_iters: int = 200
    lr_decay_iters: int = 200
    weight_decay: float = 0.0
    eval_interval: int = 20
    eval_iters: int = 50
    log_interval: int = 10
    always_save_checkpoint: bool = False
    wandb_run_name: str = "finetune"

    def validate(self) -> None:
        if not self.in_dir and self.init_from == "scratch":
            raise ConfigError("in_dir is required: --in_dir=DIR (the checkpoint to finetune), or --init_from=gpt2")
        if not self.out_dir:
            raise ConfigError("out_dir is required: --out_dir=DIR")
        if self.control_dir and os.path.abspath(self.control_dir) == os.path.abspath(self.out_dir):
            raise ConfigError("control_dir is out_dir: the control is another finetune run (of the untransformed "
                              "model); give its directory")
        if self.reference_val_loss is not None and not self.reference_val_loss > 0:
            raise ConfigError(f"reference_val_loss must be > 0 (recovery is val / reference), got "
                              f"{self.reference_val_loss}")
        if not 0 <= self.distill_alpha <= 1:
            raise ConfigError(f"distill_alpha must lie in [0, 1], got {self.distill_alpha}")
        if self.distill_temperature <= 0 or self.distill_chunk <= 0:
            raise ConfigError("distill_temperature and distill_chunk must be > 0")
        if self.distill_hidden < 0:
            raise ConfigError(f"distill_hidden must be >= 0 (the weight of the hidden-state term), got "
                              f"{self.distill_hidden}")
        if self.distill_hidden and not self.distill:
            raise ConfigError("distill_hidden is set but distill is off: add --distill=True (or drop "
                              "--distill_hidden)")
        if self.teacher_dir and not self.distill:
            raise ConfigError("teacher_dir is set but distill is off: add --distill=True (or drop --teacher_dir)")
        if self.recover_tol < 0:
            raise ConfigError(f"recover_tol must be >= 0, got {self.recover_tol}")
        super().validate()


def transform_source(record: dict | None) -> tuple[str, dict] | None:
    """(path, checkpoint) of the model a transform record was made from, if it is still there; checked to be the
    model the transform read (not retrained or replaced in place since)."""
    source = (record or {}).get("source")
    if not source or not os.path.exists(os.path.join(source, "ckpt.pt")):
        return None
    source_ckpt = load_checkpoint(source)
    check_transform_source(record, source_ckpt, source)
    return source, source_ckpt


# the settings that make two finetunes comparable step for step (same data order, eval batches and schedule), the
# loss too: a distilled run's control is distilled with the same loss
RECIPE = ("seed", "eval_seed", "eval_iters", "eval_interval", "max_iters", "learning_rate", "min_lr", "warmup_iters",
          "lr_decay_iters", "decay_lr", "weight_decay", "batch_size", "gradient_accumulation_steps", "optimizer",
          "beta1", "beta2", "grad_clip", "dropout", "norm_reg", "data_dir", "init_state", "rewarm_iters",
          "distill", "distill_alpha", "distill_temperature", "distill_hidden")
LOSS = ("distill", "distill_alpha", "distill_temperature", "distill_hidden")  # what --control_any_loss lets differ


def load_teacher(cfg: FinetuneConfig, ckpt: dict):
    """The distillation teacher: --teacher_dir, else the transform record's source; checked against the student."""
    source = cfg.teacher_dir or (ckpt.get("transform") or {}).get("source") or ""
    if not source:
        raise ConfigError("--distill needs a teacher: the checkpoint records no transform source; pass "
                          "--teacher_dir=DIR (the model to learn from)")
    teacher, teacher_ckpt = load_model(source)  # on the CPU; distill.py moves it to the run's device
    if not cfg.teacher_dir:
        check_transform_source(ckpt.get("transform"), teacher_ckpt, source)
    ours, theirs = tokenizer_fingerprint(ckpt.get("meta")), tokenizer_fingerprint(teacher_ckpt.get("meta"))
    if (ours is not None and theirs is not None and ours != theirs) or (
            teacher.config.vocab_size != ckpt["model_args"]["vocab_size"]):
        raise ConfigError(f"the teacher {source} uses another tokenizer or vocabulary ({teacher.config.vocab_size} "
                          f"vs {ckpt['model_args']['vocab_size']} tokens); distil from a model of the student's "
                          "tokenizer")
    context = ckpt["model_args"]["block_size"]  # the windows the student trains on (a smaller --block_size crops)
    if "block_size" in getattr(cfg, "explicit_keys", ()) and cfg.block_size < context:
        context = cfg.block_size
    if teacher.config.block_size < context:
        raise ConfigError(f"the teacher {source} reads at most {teacher.config.block_size} positions, but the student "
                          f"trains on windows of {context}: pass --block_size={teacher.config.block_size} (or less)")
    return teacher, source


def hidden_target_map(ckpt: dict, teacher) -> torch.Tensor | None:
    """T of the student's transform record, the map --distill_hidden carries the teacher's states by (None: the
    identity, for a model of the teacher's own width with no transform, e.g. a control)."""
    record = ckpt.get("transform") or {}
    width, teacher_width = ckpt["model_args"]["n_embd"], teacher.config.n_embd
    if record.get("porting") == "per_block":
        raise ConfigError("--distill_hidden needs one global map T, but this model was shrunk with a map per site "
                          "(porting=per_block): drop --distill_hidden")
    if ckpt["model_args"]["n_layer"] != teacher.config.n_layer:
        raise ConfigError(f"--distill_hidden matches each block's output with the teacher's, but the student has "
                          f"{ckpt['model_args']['n_layer']} blocks and the teacher {teacher.config.n_layer}: drop "
                          "--distill_hidden (the logits' KL needs no equal depth)")
    T = record.get("T")
    if T is None:
        if width != teacher_width:
            raise ConfigError(f"--distill_hidden needs the map from the teacher's width {teacher_width} to the "
                              f"student's {width}, but the checkpoint records no transform T: drop --distill_hidden")
        return None
    if tuple(T.shape) != (width, teacher_width):
        raise ConfigError(f"--distill_hidden: the recorded T is {tuple(T.shape)}, not (student width {width}, teacher "
                          f"width {teacher_width}): the teacher is not the model this one was transformed from")
    return T


def read_control(cfg: FinetuneConfig) -> list:
    """The control's recovery curve, after checking it is finished and ran the identical recipe."""
    path = os.path.join(cfg.control_dir, "finetune.json")
    if not os.path.exists(path):
        raise ConfigError(f"--control_dir={cfg.control_dir} holds no finetune.json: finetune the untransformed model "
                          "there first, with this recipe")
    try:
        with open(path) as f:
            control = json.load(f)
        theirs = control.get("config") or {}
        curve = control["curve"]
        if not (isinstance(theirs, dict) and isinstance(curve, list) and curve
                and all(isinstance(p, list) and len(p) == 2 for p in curve)
                and isinstance(theirs.get("eval_seed", -1), int) and isinstance(theirs.get("seed", 0), int)):
            raise ValueError("its config or curve is not what finetune.py writes")
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as e:
        raise ConfigError(f"--control_dir={cfg.control_dir}: its finetune.json is damaged ({type(e).__name__}: "
                          f"{str(e)[:80]}); finetune the control again with this recipe") from None
    ours = dataclasses.asdict(cfg)
    for key in ("eval_seed", "data_dir"):  # compare what they resolve to
        ours[key] = cfg.eval_batch_seed() if key == "eval_seed" else os.path.abspath(cfg.resolved_data_dir())
        theirs[key] = (theirs.get("seed") if theirs.get("eval_seed", -1) < 0 else theirs["eval_seed"]
                       ) if key == "eval_seed" else os.path.abspath(theirs.get("data_dir") or "")
    defaults = {f.name: f.default for f in dataclasses.fields(FinetuneConfig)}  # a control older than a setting
    differ = [k for k in RECIPE if theirs.get(k, defaults[k]) != ours[k] and not (cfg.control_any_loss and k in LOSS)]
    if differ:
        hint = (" (or --control_any_loss=True to read this loss against it on purpose)"
                if set(differ) & set(LOSS) else "")
        words = "; ".join(f"{k}: {theirs.get(k, defaults[k])!r} there vs {ours[k]!r} here" for k in differ)
        raise ConfigError(f"--control_dir={cfg.control_dir} ran another recipe ({words}); a control must match it "
                          f"exactly{hint}")
    return curve


def against_control(curve: list, control_curve: list, tol: float) -> dict:
    """The gap val / control − 1 at every evaluation step, and the first step where it is ≤ tol (None: never)."""
    control = {step: val for step, val in control_curve}
    missing = [step for step, _ in curve if step not in control]
    if missing:
        raise ConfigError(f"the control has no evaluation at steps {missing[:5]}: it must use the same eval_interval "
                          "and max_iters")
    gaps = [[step, val / control[step] - 1] for step, val in curve]
    return {"gap_to_control": gaps,
            "steps_to_recover_vs_control": next((step for step, gap in gaps if gap <= tol), None)}


class RecoveryTracker:
    """The on_eval callback: recovery curve and steps to recover, kept in the ``finetune`` record that every
    checkpoint of the run carries; for a model grown in width (m > d), also the share of its residual energy outside
    range(T). At its first call it measures what needs the run's device, dtype and eval batches: the reference loss
    (the transform's source, on the same batches as the curve it is compared with) and the batch the energy reads."""

    def __init__(self, record: dict, transform: dict | None = None, source: tuple[str, dict] | None = None):
        self.record, self.transform = record, transform
        self.source = source  # the transform's source (as ``transform_source`` read it) to measure, or None
        self.energy: Callable[[], float] | None = None
        self.started = False

    def start(self, evaluator: Evaluator) -> None:
        self.started = True
        if self.source is not None:
            reference = model_from_checkpoint(self.source[1]).to(evaluator.rt.device)
            self.record["reference_val_loss"] = evaluator.loss("val", reference)
            del reference
            self.source = None  # the source's weights are not held through training
        self.energy = self.watch(evaluator)

    def watch(self, evaluator: Evaluator) -> Callable[[], float] | None:
        """The energy outside range(T) of a grown model, on its first fixed val batch (every run of one recipe and
        eval seed reads the same tokens); None for any other model."""
        T, model = (self.transform or {}).get("T"), evaluator.model
        if T is None or T.shape[0] <= T.shape[1] or model.config.n_embd != T.shape[0] or \
                self.transform.get("porting") == "per_block":  # one map per site: no single range(T) to watch
            return None
        x, _ = evaluator.loader.get_batch("val", evaluator.cfg.eval_batch_seed())

        @torch.no_grad()
        def energy() -> float:
            with evaluator.rt.autocast():
                hidden = model(x, return_hidden=True)[2]
            return energy_outside_range(torch.cat([h.reshape(-1, h.shape[-1]) for h in hidden[1:]]), T)

        return energy

    def __call__(self, iter_num: int, losses: dict, evaluator: Evaluator | None = None) -> dict:
        if not self.started and evaluator is not None:  # None: called outside a run, nothing to measure
            self.start(evaluator)
        self.record.setdefault("curve", []).append([iter_num, losses["val"]])
        out = {}
        if self.energy is not None:
            share = out["growth/energy_outside_range_T"] = self.energy()
            self.record.setdefault("energy_outside_range_T", []).append([iter_num, share])
        reference = self.record.get("reference_val_loss")
        if reference is None:
            return out
        threshold = (1 + self.record["recover_tol"]) * reference
        if self.record.get("steps_to_recover") is None and losses["val"] <= threshold:
            self.record["steps_to_recover"] = iter_num
        out["recovery/val_over_reference"] = losses["val"] / reference
        if self.record.get("steps_to_recover") is not None:
            out["recovery/steps_to_recover"] = self.record["steps_to_recover"]
        return out


def finetune(cfg: FinetuneConfig) -> dict:
    resume = cfg.init_from == "resume"
    if not resume:
        check_output_dir(cfg.out_dir, cfg.in_dir, cfg.overwrite,
                         also_read={"--teacher_dir": cfg.teacher_dir, "--control_dir": cfg.control_dir})
    if cfg.init_from.startswith("gpt2") and not cfg.in_dir:  # straight from Hugging Face
        from convert import gpt2_from_pretrained
        model = gpt2_from_pretrained(cfg.init_from)
        ckpt = {"model": model.state_dict(), "model_args": model.config.to_dict(), "meta": GPT2_META,
                "config": {"init_from": cfg.init_from}}
        cfg.init_from = "scratch"  # the weights come in as init_checkpoint below
    else:
        ckpt = load_checkpoint(cfg.out_dir if resume else cfg.in_dir)
    if not resume and (ckpt.get("transform") or {}).get("source"):  # the reference and default teacher: read too
        check_output_dir(cfg.out_dir, overwrite=True, also_read={"the transform's source": ckpt["transform"]["source"]})
    cfg.data_dir = data_dir_for_checkpoint(ckpt, cfg.data_dir or (dataset_dir(cfg.dataset) if cfg.dataset else ""))
    cfg.dataset = cfg.dataset or (ckpt.get("config") or {}).get("dataset") or os.path.basename(cfg.data_dir)
    check_tokenizer(ckpt, cfg.data_dir)
    if is_interrupted(ckpt) and not resume:
        print(f"note: in_dir '{cfg.in_dir}' comes from an interrupted training run (marked incomplete); finetuning "
              "it anyway", file=sys.stderr)
    control_curve = read_control(cfg) if cfg.control_dir else None
    # the reference (the transform's source) is checked before any work: a source changed since is an error; every
    # process checks it (they stop together), only rank 0 keeps it until it has measured the reference loss
    source = None if resume or cfg.reference_val_loss is not None else transform_source(ckpt.get("transform"))
    if int(os.environ.get("RANK", "0")) != 0:
        source = None
    loss_fn = None
    if cfg.distill:
        teacher, teacher_source = load_teacher(cfg, ckpt)
        target_map = hidden_target_map(ckpt, teacher) if cfg.distill_hidden else None
        loss_fn = distillation_loss(teacher, cfg.distill_alpha, cfg.distill_temperature, cfg.distill_chunk,
                                    cfg.distill_hidden, target_map)
    record = ckpt.get("finetune") if resume else None
    if record is None:  # a new finetune: its reference is the given loss, else measured at the first evaluation
        record = {"in_dir": os.path.abspath(cfg.in_dir), "recover_tol": cfg.recover_tol, "curve": [],
                  "steps_to_recover": None, "reference_val_loss": cfg.reference_val_loss}
        if cfg.reference_val_loss is None and source is None and ckpt.get("transform"):
            record["reference_val_loss"] = ckpt["transform"].get("val_loss_before")  # the source is gone
    if cfg.distill:
        record["teacher"] = os.path.abspath(teacher_source)
    ckpt["finetune"] = record  # train() carries it into every checkpoint; the tracker updates it at each evaluation
    summary = train(cfg, init_checkpoint=ckpt, loss_fn=loss_fn,
                    on_eval=RecoveryTracker(record, ckpt.get("transform"), source))
    if int(os.environ.get("RANK", "0")) != 0:  # under DDP only the master evaluates and writes
        return summary
    summary.update({k: record[k] for k in ("reference_val_loss", "steps_to_recover", "curve", "recover_tol",
                                           "energy_outside_range_T") if k in record})
    if control_curve is not None:
        summary["control_dir"] = os.path.abspath(cfg.control_dir)
        summary.update(against_control(record["curve"], control_curve, cfg.recover_tol))
    os.makedirs(cfg.out_dir, exist_ok=True)
    with open(os.path.join(cfg.out_dir, "finetune.json"), "w") as f:
        json.dump(dict(summary, config=dataclasses.asdict(cfg)), f, indent=2)
    return summary


def main(argv: list[str]) -> None:
    cfg = load_config(FinetuneConfig, argv, prog="finetune.py")
    with hold_run_dir(cfg.out_dir, "finetune.py") if int(os.environ.get("RANK", "0")) == 0 else nullcontext():
        summary = finetune(cfg)
    if summary.get("val_loss") is None:  # a non-master DDP process
        return
    for line in report_lines(summary):
        print(line)


def report_lines(summary: dict) -> list[str]:
    """What finetune.py prints at the end: every loss with its basis, and what 'recovered' was measured against."""
    ref, tol = summary["reference_val_loss"], summary["recover_tol"]
    lines = [f"val loss {summary['val_loss']:.4f}" + (f", reference {ref:.4f}" if ref is not None else "")
             + f" ({summary['eval_basis']})"]
    steps = summary["steps_to_recover"]
    when = str(steps) if steps is not None else "not within max_iters"
    if ref is not None:
        lines.append(f"steps to come within {tol:.0%} of the reference: {when} (the reference is the untransformed "
                     "model, not finetuned: not a control; --control_dir=<the control's finetune> measures recovery "
                     "against one)")
    if "gap_to_control" in summary:
        steps = summary["steps_to_recover_vs_control"]
        lines.append(f"gap to the control at the end: {summary['gap_to_control'][-1][1]:+.2%}; steps to come within "
                     f"{tol:.0%} of the control: " + (str(steps) if steps is not None else "not within max_iters"))
    return lines


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
