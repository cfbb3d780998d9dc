"""
The width transform, in order: check the spec, canonicalize, calibrate, draw T, (learn T), port, grow, (refit).

``transform_model(model, spec, data)`` returns the new model and its record; every step is one small function
below, and the rooms it calls hold the rules:
- spec.py         what is asked (``TransformSpec``, grouped by concern) and every check of it;
- maps.py         what T is: the JL kinds, SRHT, orthogonal, PCA and its calibration, a given map;
- porting.py      what T does to each weight: ``canonicalize`` at width d (SliceGPT's / QuaRot's computational
                  invariance), then ``port_weights`` by ``porting_plan``, one named function per rule;
- paper_rules.py  the LGPT paper's ``sandwich`` and ``paper_code`` rules, inside their stated domain;
- per_block.py    SliceGPT's one map per site (``port_per_block_model``);
- refit.py        corrections after the port: the least-squares refit, gain fitting, the learned map, the tie;
- grow.py         growth beyond the residual width (new directions, heads, MLP, depth, MSG masks).

With orthonormal columns (TᵀT = I, m ≥ d), ``residual`` porting after ``fold`` reproduces the original logits to
float32 rounding. For m < d (shrink) nothing is exact; ``pca`` keeps the top-m principal directions of the
residual stream and loses far less than a random map.
"""
from __future__ import annotations

import copy
import math
import time
import warnings
from dataclasses import dataclass, field

import torch

from lgpt.method.grow import check_orthonormal_growth, grow
from lgpt.method.maps import (
    JL_KINDS,
    Calibration,
    Coordinates,
    calibration_points,
    check_coordinates,
    collect_calibration,
    jl_min_width,
    pseudo_inverse,
    starting_map,
    symmetry_breaking_pinv,
)
from lgpt.method.paper_rules import paper_code_projection, paper_code_weights, restore_attention_scale
from lgpt.method.per_block import port_per_block_model
from lgpt.method.porting import canonicalize, model_from_state, port_weights, rescale_tied_input, restore_layernorm
from lgpt.method.refit import (
    apply_refit,
    calibration_batches,
    fit_output_lengths,
    gain_outliers,
    gain_readers,
    gain_writers,
    learn_map,
    readers_by_norm,
)
from lgpt.method.roles import residual_roles
from lgpt.method.spec import TransformSpec, check_spec
from lgpt.plumbing.dataset import CALIBRATION_SEEDS, BatchLoader
from lgpt.plumbing.errors import TransformError
from model import GPT, GPTConfig, GrowthRamp, attach_ramp


class PhaseClock:
    """Seconds per named step of a pipeline: each ``lap(name)`` adds the time since the previous lap to ``name``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._mark = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._mark
        self._mark = now


@dataclass
class LearnedGains:
    """The per-coordinate gains a learned map brought (none unless ``learn_gain_lr`` > 0): folded in after the
    port into the readers of each norm's ``sites`` and the ``writers``' outputs."""
    sites: list = field(default_factory=list)
    writers: tuple = ()
    gains: dict = field(default_factory=dict)


def transform_model(model: GPT, spec: TransformSpec, data: BatchLoader | None = None) -> tuple[GPT, dict]:
    """Transform ``model`` to residual width ``spec.map.width``; returns (new model, transform record). ``data``:
    the calibration text (kind='pca', a refit, a learned map and tie_head need it; otherwise it only counts the
    JL bound's points). With ``grow_mask_iters`` the new model carries MSG's masks (closed) and the record a
    ``growth_ramp``."""
    started = time.perf_counter()
    clock = PhaseClock()  # seconds per step of the pipeline: where a long run spends its time
    porting = check_spec(spec, model.config)
    coordinates = held_coordinates(model, spec)
    check_calibration_data(spec, data)
    if porting == "per_block":
        return port_per_block_model(
            model, spec.map.width, spec.map.kind, spec.port.norms, spec.map.seed, data, spec.calib.calib_batches,
            spec.map.pca_damping, started=started, jl=(spec.map.jl_eps, spec.map.jl_delta),
            weighting=spec.calib.calib_weighting, sequential=spec.calib.sequential_calibration,
            vocabulary=spec.calib.calib_vocabulary, coordinates=coordinates, groups=spec.map.map_groups)
    sd, cfg, notes = canonical_form(model, spec, porting)
    clock.lap("check")  # the checks and the canonical form
    calibration = calibrate(spec, sd, cfg, data)
    d, m = model.config.n_embd, spec.map.width
    T, T_pinv = starting_map(spec.given_map, spec.map.kind, d, m, spec.map.seed, calibration, spec.map.pca_damping,
                             spec.port.keep_layernorm, coordinates, output_gains(model), spec.map.gain_groups)
    kind = "file" if spec.given_map is not None else spec.map.kind
    check_orthonormal_growth(T, kind, spec.grow.grow_reader_std, spec.grow.grow_mask_iters)
    clock.lap("calibrate")
    device = model.transformer.wte.weight.device
    T, T_pinv = T.to(device), T_pinv.to(device)  # the one move: every rule below meets the weights on their device
    corrections: dict = {}
    gains = LearnedGains()
    if needs_batches(spec):
        batches = calibration_batches(data, spec.calib.calib_batches, spec.map.seed)
        original = model_from_state(dict(sd), cfg)
    if spec.learn.learn_steps > 0:
        T, T_pinv, gains = learn(spec, sd, cfg, T, T_pinv, porting, original, batches, coordinates, kind, notes,
                                 corrections)
        clock.lap("learn")
    lengths = None
    if spec.port.fit_lengths > 0 and residual_roles(cfg).output_norms and cfg.norm_gain == "vector":
        lengths = fit_output_lengths(model_from_state(dict(sd), cfg), T, batches[:spec.port.fit_lengths])
        notes.append(f"peri-LN output lengths fitted on {min(spec.port.fit_lengths, len(batches))} calibration "
                     "batches (refit.fit_output_lengths)")
        clock.lap("fit lengths")
    new_sd, new_cfg, T, T_pinv = port(spec, sd, cfg, T, T_pinv, porting, gains, notes, lengths)
    new_model, ramp = finish(spec, model, new_sd, new_cfg, T, notes)
    clock.lap("port")
    if spec.learn.refit != "none" or spec.tie.tie_head:
        new_model = apply_refit(original, new_model, T, batches, spec.learn.refit, spec.learn.refit_ridge,
                                spec.tie.tie_head, corrections, notes, spec.tie.retie_target)
        c = rescale_tied_input(new_model, d)  # a retied head at width m: the input scale √m, as Gemma's exports say
        if c is not None:
            notes.append(f"the retied head's input scale moved to √{new_model.config.n_embd}: E × {c:.4f}, the final "
                         f"norm's gain ÷ {c:.4f} (the same function; porting.rescale_tied_input)")
        clock.lap("refit/tie")
    record = transform_record(spec, model.config, porting, kind, T, T_pinv, calibration, data, coordinates, notes,
                              corrections, started, clock)
    record["growth_ramp"] = ramp  # MSG's masks or None: transform_checkpoint stores them beside the weights
    return new_model, record


def output_gains(model: GPT) -> torch.Tensor | None:
    """The peri-LN output norms' per-dimension gains, one row per norm (what kind='split' must carry), or None."""
    norms = residual_roles(model.config).output_norms
    if not norms or model.config.norm_gain != "vector":
        return None
    state = model.state_dict()
    return torch.stack([state[f"{norm}.weight"].detach() for norm in norms])


def output_gain_outliers(model: GPT, count: int) -> tuple[int, ...]:
    """The ``count`` residual coordinates whose peri-LN output gains lie farthest from their norm's median, on a log
    scale: score_j = max_ℓ |log|γ_ℓj| − median_i log|γ_ℓi||. A PCA row that mixes such a coordinate with others
    cannot give both their gain (``porting.carry_output_norms`` fits one); kept as rows e_jᵀ of their own
    (``--output_keep``), they are carried exactly."""
    gains = output_gains(model)
    if count <= 0 or gains is None:
        return ()
    logs = gains.detach().double().cpu().abs().clamp_min(1e-12).log()
    score = (logs - logs.median(1, keepdim=True).values).abs().amax(0)
    return tuple(torch.argsort(-score, stable=True)[:count].tolist())


def held_coordinates(model: GPT, spec: TransformSpec) -> Coordinates:
    """The coordinates a PCA map keeps out of its range (pca_exclude) or in it as rows of their own (pca_keep,
    and tie_keep's outliers of the final gain: ``refit.gain_outliers``), checked against the model."""
    coordinates = Coordinates(spec.map.pca_exclude, spec.map.pca_keep + gain_outliers(model, spec.tie.tie_keep)
                              + output_gain_outliers(model, spec.map.output_keep)).normalized()
    check_coordinates(coordinates, model.config.n_embd, spec.map.width, spec.map.kind, spec.given_map is not None)
    return coordinates


def check_calibration_data(spec: TransformSpec, data: BatchLoader | None) -> None:
    """PCA, the corrections and the tie fit on calibration text: raise TransformError when there is none."""
    for what, needed in (("kind='pca'", spec.map.kind == "pca"), (f"refit={spec.learn.refit!r}",
                                                                  spec.learn.refit != "none"),
                         ("learn_steps", spec.learn.learn_steps > 0), ("tie_head", spec.tie.tie_head),
                         ("fit_lengths", spec.port.fit_lengths > 0)):
        if needed and data is None:
            raise TransformError(f"{what} needs calibration data: pass data, a BatchLoader (the CLI uses the "
                                 "checkpoint's training data, or --data_dir)")


def needs_batches(spec: TransformSpec) -> bool:
    """Whether a step after the map (learned map, refit, tie) fits on calibration batches and the original."""
    return (spec.learn.refit != "none" or spec.learn.learn_steps > 0 or spec.tie.tie_head
            or spec.port.fit_lengths > 0)


def canonical_form(model: GPT, spec: TransformSpec, porting: str) -> tuple[dict, GPTConfig, list[str]]:
    """The (state_dict, config) the port starts from, and the notes so far. The paper's code neither folds nor
    canonicalizes anything; peri-LN output gains are carried through T (``porting.carry_output_norms``) by our
    residual rule unless ``output_gains='average'``, or a learned map's gains will be fitted over them; a tied head
    then stays tied, its final gain carried alike, unless a refit or --tie_head fits it."""
    if porting == "paper_code":
        return (dict(model.state_dict()), copy.deepcopy(model.config),
                ["paper_code: weights mapped by shape, architecture kept"])
    carry = spec.port.output_gains == "carry" and porting == "residual" and spec.learn.learn_steps == 0
    keep_tied = carry and spec.learn.refit == "none" and not spec.tie.tie_head  # these fit the head their own way
    return canonicalize(model.state_dict(), model.config, spec.port.norms, "carry" if carry else "average",
                        keep_tied)


def calibrate(spec: TransformSpec, sd: dict, cfg: GPTConfig, data: BatchLoader | None) -> Calibration | None:
    """The hidden states a PCA map or a correction needs; None when nothing does (a random map needs only the
    count of points, for the JL bound)."""
    if data is None or not (spec.map.kind == "pca" and spec.given_map is None or spec.learn.refit != "none"
                            or spec.learn.learn_steps > 0):
        return None
    return collect_calibration(model_from_state(dict(sd), cfg), data, spec.calib.calib_batches, spec.map.seed,
                               spec.calib.calib_weighting, spec.calib.calib_vocabulary)


def learn(spec: TransformSpec, sd: dict, cfg: GPTConfig, T: torch.Tensor, T_pinv: torch.Tensor, porting: str,
          original: GPT, batches: list[torch.Tensor], coordinates: Coordinates, kind: str, notes: list[str],
          corrections: dict) -> tuple[torch.Tensor, torch.Tensor, LearnedGains]:
    """Learn T (orthonormal rows) from its start by ``refit.learn_map`` on a differentiable port, with the norms'
    (and writers') gains when asked; ``corrections['learned_map']`` and a note record it."""
    rescale, learning = spec.port.rescale_gains, spec.learn
    skeleton = model_from_state(*port_weights(dict(sd), cfg, T, T_pinv, porting, None, rescale))

    def differentiable_port(T_: torch.Tensor):
        return skeleton, port_weights(dict(sd), cfg, T_, T_.T, porting, None, rescale)[0]

    held = coordinates.exclude + coordinates.keep if learning.learn_hold else ()
    sites = readers_by_norm(skeleton)
    writers = residual_roles(skeleton.config).writers if learning.learn_writer_gains else ()
    T, learned_gains, corrections["learned_map"] = learn_map(
        original, T, differentiable_port, batches, learning.learn_steps, learning.learn_lr, spec.map.seed, held=held,
        gain_lr=learning.learn_gain_lr, sites=sites, writers=writers, decay=learning.learn_decay,
        label_weight=learning.learn_label_weight)
    gains = LearnedGains(sites, writers, learned_gains) if learned_gains else LearnedGains()
    gained = ("" if learning.learn_gain_lr <= 0 else "and norm and writer gains " if learning.learn_writer_gains
              else "and norm gains ")
    learned = corrections["learned_map"]
    notes.append(f"map {gained}learned for {learning.learn_steps} steps from "
                 f"kind={kind!r}: calibration {learned.get('objective', 'KL')} "
                 f"{learned['initial']:.4f} → {learned['learned']:.4f} (kept: {learned['kept']})")
    return T, T.T.clone(), gains


def port(spec: TransformSpec, sd: dict, cfg: GPTConfig, T: torch.Tensor, T_pinv: torch.Tensor, porting: str,
         gains: LearnedGains, notes: list[str], lengths: torch.Tensor | None = None
         ) -> tuple[dict, GPTConfig, torch.Tensor, torch.Tensor]:
    """Apply T to every weight by the porting rule; returns the new (state_dict, config) and the (T, T⁺) it used
    (paper_code's own projection of a sampled map)."""
    if porting == "paper_code":
        T = T if spec.given_map is not None else paper_code_projection(spec.map.kind, T)
        new_sd, new_cfg = paper_code_weights(sd, cfg, T)
        return new_sd, new_cfg, T, pseudo_inverse(T)
    grow_noise = spec.grow.grow_noise
    reader_T_pinv = symmetry_breaking_pinv(T, T_pinv, grow_noise, spec.map.seed) if grow_noise > 0 else None
    new_sd, new_cfg = port_weights(sd, cfg, T, T_pinv, porting, reader_T_pinv, spec.port.rescale_gains, notes,
                                   lengths)
    new_sd = gain_writers(gain_readers(new_sd, gains.sites, gains.gains), gains.writers, gains.gains)
    return new_sd, new_cfg, T, T_pinv


def finish(spec: TransformSpec, model: GPT, sd: dict, cfg: GPTConfig, T: torch.Tensor, notes: list[str]
           ) -> tuple[GPT, GrowthRamp | None]:
    """After the port: the attention scale, growth, LayerNorm kept; the new model and MSG's ramp (or None)."""
    d = model.config.n_embd
    if spec.port.restore_attn_scale:
        restore_attention_scale(sd, cfg, d)
        notes.append(f"attention scale restored: Q × √(m/d) = {math.sqrt(spec.map.width / d):.4f}")
    g = spec.grow
    ramp = grow(sd, cfg, model.config, T, spec.map.seed, notes, n_head=g.n_head, n_kv_head=g.n_kv_head,
                mlp_hidden=g.mlp_hidden, grow_mode=g.grow_mode, clone_noise=g.clone_noise, n_layer=g.n_layer,
                depth_mode=g.depth_mode, reader_std=g.grow_reader_std, mask_iters=g.grow_mask_iters,
                rms_preserve=g.rms_preserve)
    if spec.port.keep_layernorm:
        restore_layernorm(sd, cfg, model, T)
        notes.append("kept LayerNorm: T maps the all-ones direction to the all-ones direction")
    new_model = model_from_state(sd, cfg)
    if ramp is not None:
        attach_ramp(new_model, ramp)
    return new_model, ramp


def transform_record(spec: TransformSpec, old: GPTConfig, porting: str, kind: str, T: torch.Tensor,
                     T_pinv: torch.Tensor, calibration: Calibration | None, data: BatchLoader | None,
                     coordinates: Coordinates, notes: list[str], corrections: dict, started: float,
                     clock: PhaseClock) -> dict:
    """What was done, for the checkpoint and the results (their readers depend on these keys). Warns when a random
    map's width is below the JL minimum width of the calibration points."""
    d, m, mp, port_, learning = old.n_embd, spec.map.width, spec.map, spec.port, spec.learn
    n_points = (calibration.count if calibration is not None
                else calibration_points(old, data, spec.calib.calib_batches, spec.calib.calib_vocabulary))
    min_width = jl_min_width(n_points, mp.jl_eps, mp.jl_delta)
    if m < min_width and kind in JL_KINDS:
        warnings.warn(f"width m={m} is below the JL minimum width {min_width} for N={n_points} points at "
                      f"ε={mp.jl_eps}, δ={mp.jl_delta}: pairwise distances are not guaranteed", stacklevel=3)
    orthonormal = m >= d and bool(torch.allclose(T.T @ T, torch.eye(d, dtype=T.dtype, device=T.device), atol=1e-9))
    exact = (porting == "residual" and orthonormal and port_.norms == "fold" and port_.rescale_gains
             and not spec.tie.tie_head  # the tied head's final-norm gain is fitted, never carried exactly
             and learning.refit == "none" and learning.learn_steps == 0  # anything learned or refit changes it
             and not (spec.grow.n_layer > old.n_layer and spec.grow.depth_mode == "gstack")
             and not any(n.startswith("APPROX") for n in notes))
    return {"kind": kind, "d": d, "m": m, "seed": mp.seed, "calibration_seeds": CALIBRATION_SEEDS, "porting": porting,
            "norms": "kept" if porting == "paper_code" else port_.norms,
            "restore_attn_scale": port_.restore_attn_scale,
            "rescale_gains": port_.rescale_gains and porting != "paper_code",
            "grow_noise": spec.grow.grow_noise, "grow_reader_std": spec.grow.grow_reader_std,
            "rms_preserve": spec.grow.rms_preserve,
            "jl_eps": mp.jl_eps, "jl_delta": mp.jl_delta, "jl_points": n_points,
            "jl_min_width": min_width, "exact": exact, "notes": notes, "refit": learning.refit,
            "learn_steps": learning.learn_steps,
            "learn_hold": learning.learn_hold and learning.learn_steps > 0, "learn_gain_lr": learning.learn_gain_lr,
            "learn_writer_gains": learning.learn_writer_gains and learning.learn_gain_lr > 0,
            "learn_decay": learning.learn_decay, "learn_label_weight": learning.learn_label_weight,
            "corrections": corrections, "seconds": time.perf_counter() - started, "phase_seconds": clock.seconds,
            "calib_vocabulary": spec.calib.calib_vocabulary, "pca_exclude": list(coordinates.exclude),
            "pca_keep": list(coordinates.keep), "tie_keep": spec.tie.tie_keep,
            "retie_target": spec.tie.retie_target if spec.tie.tie_head else None,
            "T": T.float().cpu(), "T_pinv": T_pinv.float().cpu()}  # records are device-neutral
