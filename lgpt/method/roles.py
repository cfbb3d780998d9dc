"""
The role table: where each tensor of a GPT sits relative to the residual stream — which modules read it (and
through which norm), which write it, which tensors are embeddings and which norms carry gains. Every weight rule
(porting.py, paper_rules.py, carry.py, refit.py's readers) asks this one table instead of matching names.
"""
from __future__ import annotations

from dataclasses import dataclass

from model import GPTConfig


@dataclass(frozen=True)
class ResidualRoles:
    """Built once from a config: which modules read the residual (through which norm), which write it, which
    tensors are embeddings and which norms carry gains. Names are module names (``transformer.h.0.attn.c_attn``)."""
    embeddings: tuple[str, ...]  # parameters whose rows live in the residual: E → E·Tᵀ
    norm_readers: tuple[tuple[str, tuple[str, ...]], ...]  # (input norm, the readers that consume its output)
    output_norms: tuple[str, ...]  # peri-LN's norms on each sublayer's output, added to the residual
    writers: tuple[str, ...]  # modules whose output is added to the residual: W → T·W, b → T·b
    attention: tuple[str, ...]  # attention modules (the sandwich rule's T·W·T⁺)
    shortcuts: tuple[str, ...] = ()  # residual-path matrices S of a per-block transform's output: S → T·S·T⁺

    @property
    def readers(self) -> tuple[str, ...]:
        return tuple(r for _, readers in self.norm_readers for r in readers)

    @property
    def norms(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.norm_readers) + self.output_norms


def residual_roles(cfg: GPTConfig) -> ResidualRoles:
    """The role table of a GPT of config ``cfg`` (see ``ResidualRoles``)."""
    blocks = [f"transformer.h.{i}" for i in range(cfg.n_layer)]
    norm_readers = [pair for b in blocks for pair in ((f"{b}.ln_1", (f"{b}.attn.c_attn",)),
                                                      (f"{b}.ln_2", (f"{b}.mlp.c_fc",)))]
    norm_readers.append(("transformer.ln_f", ("lm_head",)))
    peri = cfg.norm_placement == "peri"
    return ResidualRoles(
        embeddings=("transformer.wte.weight",) + (("transformer.wpe.weight",) if cfg.pos == "learned" else ()),
        norm_readers=tuple(norm_readers),
        output_norms=tuple(f"{b}.{n}" for b in blocks for n in ("ln_1_out", "ln_2_out")) if peri else (),
        writers=tuple(f"{b}.{s}.c_proj" for b in blocks for s in ("attn", "mlp")),
        attention=tuple(f"{b}.attn" for b in blocks),
        shortcuts=tuple(f"{b}.shortcut_{j}" for i, b in enumerate(blocks) for j in (1, 2) if cfg.has_shortcut(i, j)),
    )
