"""
Carrying AdamW's state across a transform (``transform.py --carry_optimizer``), so that a grown model continues
training where the small one stopped (Staged Training's idea) instead of restarting with an empty optimizer.

AdamW's moments are running averages of gradients (exp_avg of g, exp_avg_sq of g²), so they map the way the
gradients map. The exact rule preserves the function, and with a T of orthonormal columns (m ≥ d) a parameter
ported as W' = A·W·B sees inputs and upstream gradients mapped by the same orthonormal maps, so its gradient on the
image of the old model is G' = A·G·B:

- **exp_avg maps exactly** (it is linear in the gradients): exp_avg' = A·exp_avg·B.
- **exp_avg_sq has no exact image** under a dense rotation, (A·G·B)² ≠ A·G²·B. We take the diagonal
  approximation exp_avg_sq' = (A∘A)·exp_avg_sq·(B∘B) (the cross terms E[g_i·g_j], i ≠ j, dropped): exact when A and
  B are coordinate embeddings (``kind=truncate``), non-negative always, and it keeps each row's total.

Step by step (the rules of ``transform.canonicalize``, ``transform.port_weights`` and ``grow.py``):

- fold, W → W·diag(γ): the reader's input became n(x) instead of γ⊙n(x), so G → G·diag(1/γ) (exp_avg_sq: 1/γ²).
  The folded norm's new scalar gain, a dropped LayerNorm bias and a gain that changed form start with no history.
- LayerNorm → RMSNorm centring, E → E·C and W → C·W: exp_avg maps by C (a projection is its own contragredient);
  exp_avg_sq is kept (centring changes it by O(1/d), below the approximation above).
- port: embeddings and readers m·Tᵀ (with growth symmetry breaking too: the readers' input T·x lies in range(T),
  where the extra term vanishes), writers T·m, scalar gains g·√(d/m) → m·√(m/d) (exp_avg_sq ×m/d).
- growth: ``grow.moment_growth`` (new units start empty; clones split their inputs' gradients k ways).

AdamW's step count (its bias correction) and the run's ``iter_num`` are kept, so the LR schedule continues from the
same position (``finetune.py --init_state``), optionally re-warmed (``--rewarm_iters``).
"""
from __future__ import annotations

import copy

import torch

from lgpt.method.grow import grow_depth, grow_heads, grow_mlp, moment_growth
from lgpt.method.maps import PortMaps
from lgpt.method.porting import canonicalize, porting_plan, scale_gain
from lgpt.method.roles import residual_roles
from lgpt.plumbing.errors import TransformError
from model import GPT, GPTConfig

MOMENTS = ("exp_avg", "exp_avg_sq")  # power 1 and power 2 of the gradient


def check_carry(ckpt: dict, porting: str, norms: str, kind: str, d: int, m: int, keep_layernorm: bool,
                refit: str, learn_steps: int, regroups: bool = False) -> None:
    """Raise TransformError unless ``--carry_optimizer`` can map this checkpoint's state through this transform."""
    if regroups:
        raise TransformError("carry_optimizer cannot follow a change of the query heads per key/value head (--n_kv_head"
                             "): a copied key/value head's gradient comes from fewer query heads than the original's, "
                             "so its moments have no exact image; keep the ratio or drop --carry_optimizer")
    if ckpt.get("growth_ramp"):
        raise TransformError("carry_optimizer: this checkpoint was saved while its growth masks were still opening "
                             "(its optimizer state belongs to the masked raw weights); train it past the ramp first, "
                             "or drop --carry_optimizer")
    state = ckpt.get("optimizer")
    if not state or not state.get("state"):
        raise TransformError("carry_optimizer: the input checkpoint holds no optimizer state (it was itself made by "
                             "a transform or an import); carry from a checkpoint train.py wrote, or drop "
                             "--carry_optimizer")
    if any(k not in s for s in state["state"].values() for k in MOMENTS):
        raise TransformError("carry_optimizer maps AdamW moments (exp_avg, exp_avg_sq); this checkpoint's optimizer "
                             "is not AdamW (train with --optimizer=adamw) or drop --carry_optimizer")
    needs = {"porting='residual'": porting in ("residual", "head"), "norms='fold'": norms == "fold",
             f"width ≥ d={d}": m >= d, "kind 'orthogonal' or 'truncate' (orthonormal columns)":
             kind in ("orthogonal", "truncate") or (kind == "pca" and m == d),
             "no keep_layernorm, refit or learn_steps": not keep_layernorm and refit == "none" and not learn_steps}
    failed = [what for what, ok in needs.items() if not ok]
    if failed:
        raise TransformError(f"carry_optimizer needs {' and '.join(failed)}: moments map exactly only through the "
                             "exact port with an orthonormal-column T; change those settings or drop "
                             "--carry_optimizer")


def state_by_name(model: GPT, optimizer_state: dict) -> tuple[dict[str, dict[str, torch.Tensor]], int]:
    """({parameter name: {exp_avg, exp_avg_sq}}, AdamW step) from a torch optimizer state_dict of ``model``."""
    decay, no_decay = model.optimizer_groups()
    names = decay + no_decay
    indices = [i for group in optimizer_state["param_groups"] for i in group["params"]]
    if len(indices) != len(names):
        raise TransformError(f"the checkpoint's optimizer holds {len(indices)} parameters, its model {len(names)}: "
                             "the state belongs to another model")
    moments, steps = {}, set()
    for name, index in zip(names, indices):
        entry = optimizer_state["state"].get(index)
        if entry is None:  # never stepped (e.g. frozen): no history
            continue
        moments[name] = {k: entry[k].detach().double().cpu() for k in MOMENTS}
        steps.add(int(float(entry["step"])))
    return moments, max(steps) if steps else 0


def canonical_moments(moment: dict[str, torch.Tensor], weights: dict[str, torch.Tensor], cfg: GPTConfig,
                      power: int) -> dict[str, torch.Tensor]:
    """One moment (``power`` 1 or 2) of every parameter, mapped as ``transform.canonicalize(norms='fold')``
    maps the weights."""
    moment = dict(moment)
    roles = residual_roles(cfg)
    vector = cfg.norm_gain == "vector"
    if vector and cfg.head != "linear":
        raise TransformError(f"carry_optimizer: folding the norm gains unties the {cfg.head} head, whose one moment "
                             "mixes two uses; carry from a model with a linear head or scalar norm gains")
    for norm, readers in roles.norm_readers:
        if vector:
            gamma = weights[f"{norm}.weight"].double()
            inverse = gamma.sign().where(gamma != 0, torch.ones_like(gamma)) / gamma.abs().clamp_min(1e-8)
            for reader in readers:
                if f"{reader}.weight" in moment:
                    moment[f"{reader}.weight"] = moment[f"{reader}.weight"] * inverse ** power
    for norm in roles.norms:
        moment.pop(f"{norm}.bias", None)
        if cfg.norm_gain != "scalar":  # the gain became a new scalar: no history
            moment.pop(f"{norm}.weight", None)
    if cfg.norm_type == "layernorm" and power == 1:
        for name in roles.embeddings:
            if name in moment:
                moment[name] = moment[name] - moment[name].mean(1, keepdim=True)
        for writer in roles.writers:
            for name, axis in ((f"{writer}.weight", 0), (f"{writer}.bias", 0)):
                if name in moment:
                    moment[name] = moment[name] - moment[name].mean(axis, keepdim=True)
    return moment


def port_moments(moment: dict[str, torch.Tensor], cfg: GPTConfig, T: torch.Tensor,
                 power: int) -> dict[str, torch.Tensor]:
    """One canonical moment ported to width m by the exact rule's role table (``transform.porting_plan``), with
    T∘T in place of T for the second moment and the contragredient of the gain scaling."""
    T_power = T.double() ** power
    maps = PortMaps(T_power, T_power.T, T_power.T)
    factor = (T.shape[0] / T.shape[1]) ** (power / 2)  # g·√(d/m) → gradient·√(m/d)
    plan = porting_plan(list(moment), cfg, "residual")
    return {name: (moment[name] * factor if plan[name] is scale_gain else plan[name](moment[name], maps))
            for name in moment}


def carry_moments(model: GPT, optimizer_state: dict, T: torch.Tensor, new_model: GPT, n_head: int = 0,
                  mlp_hidden: int = 0, grow_mode: str = "zero", n_kv_head: int = 0, n_layer: int = 0,
                  depth_mode: str = "interleave", stream_scale: float = 1.0) -> dict:
    """AdamW's state of ``model`` mapped onto ``new_model`` (its transform by T, then head / MLP / depth growth;
    new blocks start with no history):
    {"step": AdamW's step, "moments": {name: {exp_avg, exp_avg_sq}}} for every parameter of ``new_model``
    (zeros where a parameter has no history). ``stream_scale`` a: the stream was scaled by a (``--rms_preserve``),
    so the gradients of the embeddings and writers are 1/a of what they were (the norms after them divide by a)."""
    m, d = T.shape
    T = T.detach().double().cpu()  # moments are mapped on the host, like the weights they came with
    if m < d or not torch.allclose(T.T @ T, torch.eye(d, dtype=torch.float64), atol=1e-5):
        raise TransformError("carry_optimizer needs a T with orthonormal columns (m ≥ d, kind orthogonal/truncate)")
    by_name, step = state_by_name(model, optimizer_state)
    weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    canonical_cfg = canonicalize(weights, model.config, "fold")[1]  # the config the port starts from
    out: dict[str, dict[str, torch.Tensor]] = {}
    for power, key in enumerate(MOMENTS, start=1):
        moment = canonical_moments({n: v[key] for n, v in by_name.items()}, weights, model.config, power)
        moment = port_moments(moment, canonical_cfg, T, power)
        roles = residual_roles(canonical_cfg)
        for name in [*roles.embeddings, *(f"{w}.{p}" for w in roles.writers for p in ("weight", "bias"))]:
            if name in moment:
                moment[name] = moment[name] / stream_scale ** power
        grown_cfg = copy.deepcopy(canonical_cfg)
        growth = moment_growth(grow_mode, power)
        grow_heads(moment, grown_cfg, n_head, growth, n_kv_head)
        grow_mlp(moment, grown_cfg, mlp_hidden, growth)
        grow_depth(moment, grown_cfg, n_layer, depth_mode, copies=False)
        for name, p in new_model.named_parameters():
            value = moment.get(name)
            if value is not None and tuple(value.shape) != tuple(p.shape):
                raise TransformError(f"carry_optimizer: the moment of {name} maps to {tuple(value.shape)}, the "
                                     f"parameter is {tuple(p.shape)}")
            # stored on the host (a checkpoint's tensors are device-neutral); AdamW's load moves them to p's device
            out.setdefault(name, {})[key] = (torch.zeros(p.shape, dtype=p.dtype) if value is None
                                             else value.to(p.dtype)).detach()
    return {"step": step, "moments": out}


def load_moments(optimizer: torch.optim.Optimizer, model: GPT, carried: dict) -> None:
    """Put carried moments into a fresh AdamW of ``model`` (its hyperparameters stay the run's own)."""
    fresh = optimizer.state_dict()
    decay, no_decay = model.optimizer_groups()
    indices = [i for group in fresh["param_groups"] for i in group["params"]]
    step = torch.tensor(float(carried["step"]))
    state = {i: {"step": step.clone(), **{k: v.clone() for k, v in carried["moments"][name].items()}}
             for name, i in zip(decay + no_decay, indices) if name in carried["moments"]}
    optimizer.load_state_dict({"state": state, "param_groups": fresh["param_groups"]})
