"""
sandwich_ablation: where our `sandwich` differs from the paper's Algorithm 1, and what each difference costs
(scripts/sandwich_ablation.sh).
"""
from __future__ import annotations

import time

from base_models import model, shape
from harness import (
    Setting,
    each,
    full_val_loss,
    mean_spread,
    save,
    transformed,
    width,
)

SANDWICH_ARMS = {  # (norms, rescale_gains); one factor at a time from ours, on the same T (gaussian, seeds)
    "ours: fold + rescale": ("fold", True),
    "norm gains averaged, LayerNorm kept (no folding)": ("scalar", True),
    "no gain / ε rescale": ("fold", False),
    "neither (Algorithm 1 as we read it)": ("scalar", False),
}


SANDWICH_RATIOS = (0.25, 0.5, 0.75)  # Algorithm 1's domain: m < d


def sandwich_ablation(s: Setting) -> None:
    """The paper's sandwich rule (Q, K, V, O → T·W·T⁺) with each of our two additions taken away: folding (per-
    dimension gains into the readers, LayerNorm → RMSNorm with centred writers) and the √(d/m) gain / d/m ε
    rescale. Same Gaussian T per seed in every arm; zero-shot on the full val split."""
    t0 = time.time()
    base = model(s, "base")
    d, n_head = shape(base)

    def row(cell: tuple) -> dict:
        arm, ratio = cell
        norms, rescale = SANDWICH_ARMS[arm]
        m = width(ratio, d, n_head)
        losses = each(s.seeds, lambda seed: transformed(s, base, m, "gaussian", "sandwich", norms, seed=seed,
                                                        rescale_gains=rescale)[1]["val_loss_after"])
        return {"arm": arm, "norms": norms, "rescale_gains": rescale, "ratio": ratio, "m": m,
                "zero_shot": mean_spread(losses)}

    rows = each([(arm, ratio) for arm in SANDWICH_ARMS for ratio in SANDWICH_RATIOS], row)
    save("sandwich_ablation", {"d": d, "kind": "gaussian", "seeds": list(s.seeds),
                               "reference_val_loss": full_val_loss(base, s.device), "rows": rows}, t0, s)
