"""
Recovery by distillation (``finetune.py --distill=True``): the student learns from the original model.

    loss = α·τ²·KL(p_teacher^τ ‖ p_student^τ) + (1 − α)·CE(student, next token)     (+ the student's norm_reg)

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


def distillation_loss(teacher: GPT, alpha: float, temperature: float, chunk: int) -> Callable:
    """``make_loss`` for train(): the micro-batch loss α·KD + (1 − α)·CE (+ norm_reg) of the student in ``run``."""
    teacher.eval().requires_grad_(False)

    def make(run) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        student = run.model
        teacher.to(run.rt.device)  # this process's device (under DDP: its own GPU)

        def loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            state, hidden = run.train_model(x, features=True)  # through the DDP wrapper when there is one
            with torch.no_grad():
                teacher_state, _ = teacher(x, features=True)
            kl, ce = chunked_distillation(student, teacher, state, teacher_state, y, temperature, chunk)
            loss = alpha * kl + (1 - alpha) * ce
            terms = {"kd": kl.detach(), "lm": ce.detach()}
            if student.config.norm_reg > 0:
                reg = student.norm_regularizer(hidden[1:])
                loss = loss + reg
                terms["norm_reg"] = reg.detach()
            student.last_loss_terms = terms
            return loss

        return loss_fn

    return make
