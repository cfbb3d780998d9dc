"""
Change the residual width of a trained GPT from d to m with one linear map T (m×d) and its
pseudo-inverse T⁺ (d×m): the command line.

    python transform.py --in_dir=out-shakespeare-char --out_dir=out-m96 --width=96 --kind=pca --porting=residual

The transform itself lives in the library: ``lgpt.method.spec`` says what is asked (``TransformSpec``, one group
per concern, each option written once) and checks it; ``lgpt.method.pipeline.transform_model(model, spec, data)``
runs it — check everything, canonicalize, calibrate, draw T, (learn T), port, grow, (refit) — and returns the new
model and its record. This file is the command around it: ``TransformConfig`` is the spec's groups as flat config
keys (``width = 432`` in a config file, ``--kind=pca`` on the command line) plus the command's own (where to read
and write, the calibration text, evaluation), and ``transform_checkpoint`` reads, transforms, evaluates before
and after, and writes atomically. With orthonormal columns (TᵀT = I, m ≥ d), ``residual`` porting after ``fold``
reproduces the original logits to float32 rounding.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, replace

from lgpt.method.grow import regroups_heads
from lgpt.method.maps import JL_KINDS, read_map_file
from lgpt.method.pipeline import transform_model
from lgpt.method.spec import (
    CalibrationSpec,
    GrowthSpec,
    LearningSpec,
    MapSpec,
    PortingSpec,
    TieSpec,
    check_settings,
    check_spec,
    spec_from_config,
)
from lgpt.plumbing.checkpoint import (
    check_output_dir,
    hold_run_dir,
    is_interrupted,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
    weights_fingerprint,
)
from lgpt.plumbing.cli import run_cli
from lgpt.plumbing.configurator import load_config
from lgpt.plumbing.dataset import (
    BatchLoader,
    BosFirstLoader,
    check_tokenizer,
    data_dir_for_checkpoint,
    evaluate_loss,
    loss_basis,
    window_size,
)
from lgpt.plumbing.devices import announce_threads, resolve_device
from lgpt.plumbing.errors import ConfigError, TransformError
from model import GPTConfig, raw_state_dict


@dataclass
class TransformIO:
    # the transform: what it reads and writes
    in_dir: str = "out-shakespeare-char"  # the checkpoint to transform
    out_dir: str = ""  # where the transformed ckpt.pt goes (required)
    map_file: str = ""  # a saved T (torch.save of an m×d tensor, e.g. the paper script's --proj_out) used as it is,
    #                     instead of sampling kind: to compare rules, or our code with another's, on one T
    carry_optimizer: bool = False  # map the AdamW moments (carry.py); finetune.py --init_state continues them


@dataclass
class CalibrationText:
    # the calibration text (the command's BatchLoader over the training data)
    data_dir: str = ""  # '' → the data directory recorded in the input checkpoint
    calib_batch_size: int = 16  # sequences per calibration batch
    calib_bos: bool = False  # calibration windows start with the tokenizer's BOS token (each window's last token
    #                          dropped): the states of a model that always reads BOS first (Gemma), whose first
    #                          position can hold activations no mid-text window shows; needs a checkpoint that
    #                          records a BOS token (an imported HF or GGUF model)
    block_size: int = 0  # tokens per calibration / evaluation window (0: the model's context, which for an imported
    #                      Llama or Qwen, 32k–128k, can exceed a small corpus)


@dataclass
class EvaluationAndSystem:
    # evaluation and system
    eval_iters: int | None = None  # val batches for the before/after loss; None = the full val split; 0 = skip
    eval_reference: bool = True  # also evaluate the untransformed model (the "before" loss)
    device: str = "cpu"  # where the transform and its evaluation run: 'cpu' | 'cuda' | 'cuda:N' | 'mps' | 'auto'
    overwrite: bool = False  # replace a checkpoint already in out_dir (never the input checkpoint itself)
    allow_broken: bool = False  # write the model even when it ends worse than a uniform guess (val loss above
    #                             log V), or approximate where the options ask for an exact map (an orthonormal
    #                             map at m ≥ d, residual porting, folded norms, nothing learned)


@dataclass
class TransformConfig(EvaluationAndSystem, CalibrationText, CalibrationSpec, TieSpec, LearningSpec, GrowthSpec,
                      PortingSpec, MapSpec, TransformIO):
    """transform.py's flat config: the spec's groups (lgpt/method/spec.py, each option written there once) and
    the command's own options; --help lists them in that order (dataclass fields run from the last base up)."""

    def validate(self) -> None:
        if not self.out_dir:
            raise ConfigError("out_dir is required: --out_dir=DIR (where the transformed ckpt.pt goes)")
        if self.block_size < 0:
            raise ConfigError(f"block_size must be >= 0, got {self.block_size}")
        if self.calib_batch_size <= 0:
            raise ConfigError(f"calib_batch_size must be a positive integer, got {self.calib_batch_size}")
        if self.eval_iters is not None and self.eval_iters < 0:
            raise ConfigError(f"eval_iters must be >= 0 (0 skips evaluation) or None (full val split), "
                              f"got {self.eval_iters}")
        if self.carry_optimizer and self.porting == "per_block":
            raise ConfigError("carry_optimizer maps AdamW's moments with one T; porting='per_block' has one per site: "
                              "drop --carry_optimizer")
        check_settings(spec_from_config(self), ConfigError, map_file=bool(self.map_file))  # the spec's own checks
        if not self.rescale_gains and self.carry_optimizer:  # the command's own option against the spec's
            raise ConfigError("rescale_gains=False applies without carry_optimizer (carried moments need the exact "
                              "port); drop --rescale_gains=False")


def transform_checkpoint(cfg: TransformConfig) -> dict:
    """The CLI's work: read in_dir/ckpt.pt, transform, evaluate before/after, write out_dir/ckpt.pt.
    Every check runs before any work, and nothing is written unless all of it succeeds."""
    check_output_dir(cfg.out_dir, cfg.in_dir, cfg.overwrite)
    cfg.device = resolve_device(cfg.device)  # before any work: a missing GPU is one clear error
    ckpt = load_checkpoint(cfg.in_dir)
    model = model_from_checkpoint(ckpt).to(cfg.device).eval()
    spec = spec_from_config(cfg)
    check_spec(spec, model.config)
    if cfg.carry_optimizer:
        from lgpt.method.carry import check_carry
        check_carry(ckpt, cfg.porting, cfg.norms, cfg.kind, model.config.n_embd, cfg.width, cfg.keep_layernorm,
                    cfg.refit, cfg.learn_steps, regroups=regroups_heads(model.config, cfg.n_head, cfg.n_kv_head))
    if cfg.map_file:
        spec = replace(spec, given_map=read_map_file(cfg.map_file, cfg.width, model.config.n_embd))
    bos_id = ((ckpt.get("meta") or {}).get("special_ids") or {}).get("bos_token_id")
    if cfg.calib_bos and bos_id is None:
        raise ConfigError(f"calib_bos=True needs a BOS token, and the checkpoint in '{cfg.in_dir}' records none (a "
                          "model trained here or a character model): drop --calib_bos")
    loader = None
    if cfg.kind == "pca" or cfg.eval_iters != 0 or cfg.refit != "none" or cfg.learn_steps > 0:
        data_dir = data_dir_for_checkpoint(ckpt, cfg.data_dir, "--data_dir")
        check_tokenizer(ckpt, data_dir, "--data_dir")
        loader = BatchLoader(data_dir, window_size(cfg.block_size, model.config.block_size), cfg.calib_batch_size,
                             cfg.device)
    announce_threads(cfg.device)
    calibration = loader if loader is None or not cfg.calib_bos else BosFirstLoader(loader, bos_id)
    new_model, record = transform_model(model, spec, calibration)  # evaluation below reads the text as it is
    if cfg.calib_bos and loader is not None:
        record["notes"].append(f"calibration windows started with BOS (token {bos_id}); evaluation did not")
    ramp = record.pop("growth_ramp", None)
    record["source"] = os.path.abspath(cfg.in_dir)
    record["source_fingerprint"] = weights_fingerprint(ckpt["model"])  # consumers check the source is unchanged
    if is_interrupted(ckpt):
        record["notes"].append(f"in_dir is an interrupted training run (stopped at iter {ckpt.get('iter_num', 0)}, "
                               "marked incomplete): the transformed model is marked incomplete too")
    carried = None
    if cfg.carry_optimizer:
        from lgpt.method.carry import carry_moments
        carried = carry_moments(model, ckpt["optimizer"], record["T"], new_model, cfg.n_head, cfg.mlp_hidden,
                                cfg.grow_mode, cfg.n_kv_head, cfg.n_layer, cfg.depth_mode,
                                stream_scale=math.sqrt(cfg.width / model.config.n_embd) if cfg.rms_preserve else 1.0)
        record["optimizer"] = {"carried": True, "step": carried["step"], "iter_num": ckpt.get("iter_num", 0),
                               "exp_avg": "exact on range(T)", "exp_avg_sq": "diagonal approximation (T∘T)"}
    if loader is not None and cfg.eval_iters != 0:
        if cfg.eval_reference:
            record["val_loss_before"] = evaluate_loss(model, loader, "val", cfg.eval_iters)
        record["val_loss_after"] = evaluate_loss(new_model, loader, "val", cfg.eval_iters)
        record["val_loss_basis"] = loss_basis(loader, cfg.eval_iters)
    if not cfg.allow_broken:
        check_not_broken(cfg, record, model.config)
    check_weights_usable(new_model)
    out = {"model": raw_state_dict(new_model), "model_args": new_model.config.to_dict(),
           "config": dict(ckpt.get("config") or {}, **{f"transform_{k}": v for k, v in asdict(cfg).items()}),
           "iter_num": 0, "source_iter_num": ckpt.get("iter_num", 0),  # finetune.py --init_state goes on from it
           "best_val_loss": record.get("val_loss_after", float("inf")), "optimizer": None,
           "optimizer_moments": carried, "meta": ckpt.get("meta"), "transform": record}
    if ramp is not None:
        out["growth_ramp"] = ramp.record()
    if is_interrupted(ckpt):
        out["complete"] = False
    save_checkpoint(out, cfg.out_dir)
    return record


EXACT_KINDS = ("orthogonal", "hadamard", "truncate", "pca", "split")  # orthonormal maps at m ≥ d


def asks_for_exact(cfg: TransformConfig, d: int) -> bool:
    """Whether the options ask for the same function: an orthonormal map at m ≥ d, ported by our residual rule with
    the norms folded, nothing learned, refit or tied, no non-exact depth growth."""
    return (cfg.width >= d and cfg.kind in EXACT_KINDS and not cfg.map_file and cfg.porting in ("residual", "head")
            and cfg.norms == "fold" and cfg.rescale_gains and cfg.refit == "none" and cfg.learn_steps == 0
            and not cfg.tie_head and cfg.depth_mode != "gstack")


def check_weights_usable(new_model) -> None:
    """Refuse, before anything is written, a model no loader would take (a NaN, infinite or overflow-prone weight:
    a huge --grow_noise or --map_file): written with exit 0 whether or not it was evaluated, it could not be read
    back. Not even --allow_broken writes one."""
    from lgpt.plumbing.checkpoint import CheckpointError, check_finite
    try:
        check_finite(raw_state_dict(new_model), "the transformed model")
    except CheckpointError as e:
        raise TransformError(f"{str(e).split(':')[0]}: nothing was written; the options made weights no loader "
                             "takes (a --map_file or --grow_noise far too large?)") from None


def check_not_broken(cfg: TransformConfig, record: dict, old: GPTConfig) -> None:
    """Refuse, before anything is written, a transformed model worse than a uniform guess over its vocabulary
    (val loss above log V: it has lost what the model knew; not when the input was already there, measured by
    eval_reference) and an approximate result where the options ask for an exact one — both were written with
    exit 0 (a peri-LN Gemma 3 grown by an orthogonal map: 6.0 → 294.6)."""
    uniform = math.log(old.vocab_size)
    after, before = record.get("val_loss_after"), record.get("val_loss_before")
    if before is not None and not before <= uniform:  # already at or past chance: the transform did not break it
        record["notes"].append(f"the input model's val loss {before:.4f} was already above log V = {uniform:.4f}")
    elif after is not None and not after <= uniform:
        raise TransformError(f"the transformed model's val loss {after:.4f} is above a uniform guess's log V = "
                             f"{uniform:.4f}: the transform broke the model, and nothing was written "
                             f"({'; '.join(record['notes'][:2]) or 'no note'}). Pass --allow_broken=True to write "
                             "it anyway")
    if asks_for_exact(cfg, old.n_embd) and not record["exact"]:
        why = next((n for n in record["notes"] if n.startswith("APPROX")), "a step that is not exact")
        raise TransformError(f"these options ask for the same function (an orthonormal map at m ≥ d, residual "
                             f"porting, norms folded), but the result is approximate ({why}); nothing was written. "
                             "Pass --allow_broken=True to write it anyway")


def jl_line(record: dict) -> str:
    """What the Johnson–Lindenstrauss bound says about this run, in words."""
    bound = (f"JL minimum width for N={record['jl_points']} points at ε={record['jl_eps']}, δ={record['jl_delta']}: "
             f"{record['jl_min_width']}")
    if record["kind"] not in JL_KINDS:
        return f"{bound} (applies to random maps only; kind={record['kind']!r} is not one, so it says nothing here)"
    if record["m"] >= record["jl_min_width"]:
        return f"{bound}; m={record['m']} reaches it: pairwise distances are kept within ε with probability 1 − δ"
    return f"{bound}; m={record['m']} is below it: pairwise distances are not guaranteed to stay within ε"


def main(argv: list[str]) -> None:
    cfg = load_config(TransformConfig, argv, prog="transform.py")
    with hold_run_dir(cfg.out_dir, "transform.py"):
        record = transform_checkpoint(cfg)
    print(f"{record['kind']} {record['porting']} d={record['d']} → m={record['m']} (norms={record['norms']}); "
          f"exact: {record['exact']} (True: the same function)")
    print(f"  {jl_line(record)}")
    for note in record["notes"]:
        print(f"  note: {note}")
    if record.get("phase_seconds"):
        print("  seconds: " + ", ".join(f"{phase} {t:.1f}" for phase, t in record["phase_seconds"].items())
              + f" (transform {record['seconds']:.1f})")
    if "val_loss_after" in record:
        before = f"{record['val_loss_before']:.4f} → " if "val_loss_before" in record else ""
        print(f"val loss ({record['val_loss_basis']}): {before}{record['val_loss_after']:.4f}")
    print(f"wrote {os.path.join(cfg.out_dir, 'ckpt.pt')}")


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
