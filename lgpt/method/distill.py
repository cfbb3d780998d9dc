"""
Recovery by distillation (``finetune.py --distill=True``): the student learns from the original model.

    loss = α·τ²·KL(p_teacher^τ ‖ p_student^τ) + (1 − α)·CE(student, next token)     (+ the student's norm_reg)
           + β·H                                                          (``--distill_hidden=β``, 0 by default)

H is the hidden-state term: the residual stream after every block of the student against the teacher's carried
by the transform's own map T (``hidden_state_loss``). A width transform makes h_student ≈ T·h_teacher at every
layer by construction, so T is the target map and no projection has to be learned (feature distillation à la
TinyBERT / MiniLM needs one); with no transform record (a control: the original distilled from itself) T = I.

p^τ = softmax(logits / τ); both terms are means over tokens; τ² keeps the KL's gradient scale independent of τ
(Hinton et al.). Forward KL at τ = 1 is what Minitron found best for recovering pruned models.

The teacher (eval mode, no grad, the student's autocast) runs per micro-batch. Both heads are applied to
chunks of positions inside ``torch.utils.checkpoint``, so neither a (B, T, V) float32 logits tensor nor its
softmax is held for the whole batch at once (a 50k vocabulary at context 1024 would otherwise cost GBs); the
chunked loss equals the unchunked one (tested).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from model import GPT


def teacher_kl(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """Σ τ²·KL(p_t^τ ‖ p_s^τ) over rows, whose gradient with respect to the student's logits is exactly
    τ·(p_s^τ − p_t^τ). Autograd through log_softmax gives −p_t + p_s·Σp_t instead, and Σp_t is 1 only up to
    rounding: a student equal to its teacher then got a gradient of ~1e-8 that always points the same way, which
    Adam's normalised steps turned into steps of the learning rate's size — distilling a model from itself moved
    it. Here the value is the KL and the gradient flows through g·z with g = τ·(p_s − p_t) held fixed, so it is
    exactly zero at a student equal to its teacher (plain ops: activation checkpointing recomputes it as is)."""
    log_p_teacher = F.log_softmax(teacher / temperature, dim=-1)
    log_p_student = F.log_softmax(student.detach() / temperature, dim=-1)
    p_teacher = log_p_teacher.exp()
    value = (p_teacher * (log_p_teacher - log_p_student)).sum() * temperature ** 2
    pull = (temperature * (log_p_student.exp() - p_teacher) * student).sum()
    return (pull - pull.detach()) + value  # exactly the value: x − x is 0 in floating point


def distillation_terms(student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor,
                       temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ τ²·KL(p_t^τ ‖ p_s^τ), Σ CE) over the positions of one chunk (logits (N, V), targets (N,))."""
    s = student_logits.float()
    kl = teacher_kl(s, teacher_logits.float().detach(), temperature)
    ce = F.cross_entropy(s, targets, ignore_index=-1, reduction="sum")
    return kl, ce


def hidden_state_loss(student_hidden: list[torch.Tensor], teacher_hidden: list[torch.Tensor],
                      T: torch.Tensor | None) -> torch.Tensor:
    """H = mean over blocks l = 1..L and tokens of ‖h_s^l − T·h_t^l‖² / ‖T·h_t^l‖².

    Relative per token, because a real model's residual norms span orders of magnitude (the attention-sink
    positions carry coordinates near 10⁴): an absolute error would be the sinks' alone. The embedding (l = 0) is
    left out: in a tied model it is the head too, which the KL trains. T = None is the identity, applied as no
    product at all, so a student equal to its teacher has H = 0 and a gradient of exactly 0."""
    terms = []
    for h_s, h_t in zip(student_hidden[1:], teacher_hidden[1:], strict=True):
        target = h_t.float() if T is None else h_t.float() @ T.t()
        error = (h_s.float() - target).pow(2).sum(-1)
        terms.append((error / target.pow(2).sum(-1).clamp_min(1e-12)).mean())
    return torch.stack(terms).mean()


def chunked_distillation(student: GPT, teacher: GPT, student_state: torch.Tensor, teacher_state: torch.Tensor,
                         targets: torch.Tensor, temperature: float, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean KL and mean CE over all positions, the heads applied ``chunk`` positions at a time, each chunk
    recomputed in backward instead of stored."""
    hs, ht, y = student_state.flatten(0, -2), teacher_state.flatten(0, -2), targets.flatten()

    def one_chunk(h_student, h_teacher, y_chunk):
        with torch.no_grad():
            teacher_logits = teacher.lm_head(h_teacher)
        return distillation_terms(student.lm_head(h_student), teacher_logits, y_chunk, temperature)

    kl = ce = 0.0
    for start in range(0, len(y), chunk):
        part = slice(start, start + chunk)
        k, c = checkpoint(one_chunk, hs[part], ht[part], y[part], use_reentrant=False)
        kl, ce = kl + k, ce + c
    count = (y != -1).sum().clamp_min(1)
    return kl / len(y), ce / count


def distillation_loss(teacher: GPT, alpha: float, temperature: float, chunk: int, hidden_weight: float = 0.0,
                      target_map: torch.Tensor | None = None) -> Callable:
    """``loss_fn(model, x, y)`` for train(): the micro-batch loss α·KD + (1 − α)·CE + β·H (+ norm_reg) of the student
    (β = ``hidden_weight``; H = ``hidden_state_loss`` through ``target_map``, m×d, None for the identity). ``model``
    is the student as trained (compiled, DDP-wrapped): the forward pass goes through it, so DDP syncs the gradients;
    the heads, the regularizer and the logged terms are the raw student's."""
    teacher.eval().requires_grad_(False)
    on_device: dict[torch.device, torch.Tensor | None] = {}  # T on the run's device (under DDP: this process's GPU)

    def loss_fn(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        student = getattr(model, "module", model)  # inside the DDP wrapper
        student = getattr(student, "_orig_mod", student)  # inside torch.compile's
        if x.device not in on_device:  # the first micro-batch: the teacher and T move to the run's device
            teacher.to(x.device)
            on_device[x.device] = None if target_map is None else target_map.to(x.device, torch.float32)
        T = on_device[x.device]
        state, hidden = model(x, features=True)
        with torch.no_grad():
            teacher_state, teacher_hidden = teacher(x, features=True)
        kl, ce = chunked_distillation(student, teacher, state, teacher_state, y, temperature, chunk)
        loss = alpha * kl + (1 - alpha) * ce
        terms = {"kd": kl.detach(), "lm": ce.detach()}
        if hidden_weight > 0:
            h = hidden_state_loss(hidden, teacher_hidden, T)
            loss = loss + hidden_weight * h
            terms["hidden"] = h.detach()
        if student.config.norm_reg > 0:
            reg = student.norm_regularizer(hidden[1:])
            loss = loss + reg
            terms["norm_reg"] = reg.detach()
        student.last_loss_terms = terms
        return loss

    return loss_fn
