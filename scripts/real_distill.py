"""
Recovery by distillation against its own control (issue #40): SmolLM2-135M shrunk to −25% parameters with its head
kept tied (m = 432, ``--tie_keep=32``: results/real_model_tied's model), distilled from the original.

    python scripts/real_distill.py [--part=arms|later|all] [--reverse]       (scripts/real_distill.sh)

The recipe is results/real_model_recovery's (98,304 tinyshakespeare train tokens: 48 steps × 8 × 256, AdamW without
weight decay, 4 warmup steps, cosine decay to a tenth of the rate, the same data order and eval batches) with the loss
replaced by pure distillation (α = 1, τ = 1: the KL from the original's next-token distribution), at each
learning rate in ``LRS`` (the tuning effort: those values, nothing else). The control is the original distilled from
itself with the identical recipe — not results/real_model_recovery's control, which finetunes on the LM loss, another
recipe. A model equal to its teacher has a zero KL gradient (exactly: distill.teacher_kl), so AdamW without weight
decay takes no step and the control is the original bit for bit at every rate and data order
(tests/method/test_distill.py); it is run once, at the chosen rate, and its weights are compared with the original's.

At the rate whose distilled model ends lowest on the whole val split, two more data orders (``DATA_SEEDS``: n = 3),
and the same tied map with the least-squares readers refit (``--refit=readers``, results/real_model_tied's best
−25% row) distilled with that recipe. Then more optimizer steps on the same tokens: the chosen rate in smaller
batches (``BATCHES``; every step count of the schedule scaled, so the tokens and the schedule in tokens stay); if
one ends lower than the recipe's batch, its own control (the original distilled from itself in that batch) and two
more data orders. Last, the general case: the tied map calibrated on English news (results/real_model_tied's row),
distilled on the news train split (68 k tokens: the 98,304 distilled tokens pass over it about 1.4 times) in the
best batch, evaluated on the novel (neither text), against the original distilled from itself on the news; and
the tied −50% model (m = 288) distilled with the best recipe, against that recipe's control; and, where a smaller
batch won, the other rates in that batch (one factor: the rates were tried in the recipe's batch), two more data
orders for the one that ends lowest if it is not the chosen rate. Losses over the whole val splits of
tinyshakespeare and Botchan (256-token windows), one thread per process; n = 1 (one data order) except the draws.
``--part=arms`` builds the rates' distilled models only; ``--part=all`` (the default) builds everything and writes
results/real_model_distill/results.json as it goes (two processes, one with --reverse, share the cache:
scripts/real_distill.sh); ``--part=later`` builds only the general case, the −50% model and the rates in the best
batch, at the rate and batch that results/real_model_distill/results.json already chose, and adds them to it
(its other parts kept as they are). ``--part=features`` adds the hidden-state term (``finetune.py
--distill_hidden=β``: every block's output against T·(the original's), T the transform's own map) to the best
recipe, one factor: β in ``HIDDEN`` (the tuning effort: those values), data order 0; the control distilled from
itself with the lowest β's loss; and, if that β ends below the KL alone, two more data orders (n = 3).
``--part=temperature`` runs the best recipe with both softmaxes at τ in ``TEMPERATURES`` (the KL scaled by τ²), one
factor against τ = 1, the same way: data order 0, its control, two more data orders where it ends lower.
``--part=mix`` runs the general case again from its best zero-shot start: the tied map learned with its norm gains on
the calibration mix (real_model.MIX: Shakespeare, the news and the model's own samples), distilled on the mix with
the best recipe, against the original distilled from itself on the mix, evaluated on the novel (which neither reads);
``--part=mix_draws`` adds two more data orders to it (n = 3: the general case's distilled row, read on the novel).
``--part=learned`` distils the tied maps learned on the calibration KL (results/real_model_tied's ``--learn_steps``
rows, m = 432 and m = 288, m = 432 learned with its norm gains, ``--learn_gain_lr``, and with the calibration text's
next tokens in its objective too, ``--learn_label_weight=0.5``) with the best recipe: another start, the same recipe
and control. ``--part=learned_draws`` adds two more data orders (n = 3) to the learned −25% start that ends lowest;
``--part=learned_rates`` distils that start at the rates of ``LRS`` below the chosen one (and, where one ends lower,
two more data orders at it). ``--part=to_zero`` distils that start with the rate decayed to 0 instead of a tenth of it
(``FLOOR``, one factor), over the same three data orders, against its own control. ``--part=labels`` distils that
start on ½·KL + ½·CE of the text's next token (``ALPHA``, one factor: what a token teaches) against its own control,
the original distilled from itself with that loss; two more data orders where it ends lower.
"""
from __future__ import annotations

import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from real_tied_head import GAINS, LABELS, LEARN, MIX_RECIPE, RECOVER, build  # noqa: E402

from lgpt.plumbing.checkpoint import load_model  # noqa: E402
from lgpt.plumbing.dataset import BatchLoader  # noqa: E402
from real_model import BLOCK, FINETUNE, FT_ITERS, RATIOS, finetuned, losses, parameters  # noqa: E402
from real_quantization import save, saved  # noqa: E402
from real_quantization import start as begin  # noqa: E402

LRS = (3e-5, 1e-4, 3e-4)  # the rates tried (3e-5: the LM recipe's)
DATA_SEEDS = (1, 2)  # more data orders at the chosen rate (0: the rates' runs)
BATCHES = (4, 2, 1)  # smaller batches at the chosen rate: the same tokens and schedule in tokens, 2×, 4×, 8× the steps
BATCH = 8  # the recipe's own batch
GENERAL_TEXT = "news"  # the general case: calibrated and distilled on English news, evaluated on the novel
GENERAL = (RECOVER[0], RECOVER[1], RECOVER[2], GENERAL_TEXT)  # results/real_model_tied's news-calibrated row
HALF = (RATIOS[0.5], RECOVER[1], RECOVER[2], "shakespeare")  # results/real_model_tied's tied −50% row
DISTILL = ("--distill=True", "--distill_alpha=1.0", "--distill_temperature=1.0")
HIDDEN = (0.1, 1.0)  # β of the hidden-state term tried (--part=features); its value at the start is ≈ 0.12 per block
TEMPERATURES = (2.0,)  # τ tried against the recipe's 1 (--part=temperature)
FLOOR = 0.0  # the rate's end in --part=to_zero, against the recipe's tenth of the rate
ALPHA = 0.5  # the KL's weight in --part=labels: ½·KL + ½·CE of the text's next token, against the recipe's KL alone
MIX_NAME = "-learned-gains-mix"  # the general case from the mix: its runs' label mark (--part=mix, --part=mix_draws)


def recipe(lr: float, data_seed: int = 0, batch: int = BATCH, floor: float | None = None) -> list[str]:
    """results/real_model_recovery's recipe at learning rate ``lr`` (decayed to lr / 10, or to ``floor`` where one is
    given: ``--part=to_zero``'s 0), its data order moved by
    ``data_seed`` (the eval batches stay: --eval_seed is fixed), in batches of ``batch`` windows: every step count
    (steps, decay, warmup, eval and log intervals) scales by BATCH / batch, so the tokens and the schedule in tokens
    stay and only the number of optimizer steps changes."""
    if BATCH % batch:
        raise ValueError(f"batch={batch} must divide the recipe's batch {BATCH}")
    seed = int(next(a for a in FINETUNE if a.startswith("--seed=")).split("=")[1]) + data_seed
    end = lr / 10 if floor is None else floor
    changed = {"--learning_rate": f"{lr:g}", "--min_lr": f"{end:g}", "--seed": str(seed)}
    if batch != BATCH:
        steps = {"--max_iters", "--lr_decay_iters", "--warmup_iters", "--eval_interval", "--log_interval"}
        changed |= {a.split("=")[0]: str(int(a.split("=")[1]) * BATCH // batch) for a in FINETUNE
                    if a.split("=")[0] in steps}
        changed["--batch_size"] = str(batch)
    return [a if a.split("=")[0] not in changed else f"{a.split('=')[0]}={changed[a.split('=')[0]]}"
            for a in FINETUNE]


def loss_args(hidden: float, temperature: float = 1.0, alpha: float = 1.0) -> tuple[str, ...]:
    """The distillation loss's options, with the hidden-state term of weight ``hidden`` where it is > 0, both
    softmaxes at ``temperature`` and the KL weighted by ``alpha`` (the rest: the text's labels) where they are not
    DISTILL's 1."""
    changed = {"--distill_temperature": temperature, "--distill_alpha": alpha}
    args = tuple(f"{name}={changed[name]:g}" if changed.get(name, 1.0) != 1.0 else f"{name}={value}"
                 for name, value in (option.split("=") for option in DISTILL))
    return (*args, f"--distill_hidden={hidden:g}") if hidden else args


def arm(data: dict[str, str], start: dict, lr: float, data_seed: int = 0, name: str = "", batch: int = BATCH,
        text: str = "shakespeare", m: int = RECOVER[0], hidden: float = 0.0, temperature: float = 1.0,
        floor: float | None = None, alpha: float = 1.0) -> dict:
    """A shrunk model (width ``m``) distilled from the original (the transform record's source) at ``lr`` on
    ``text`` (with the hidden-state term of weight ``hidden``, at ``temperature``, the rate decayed to ``floor``,
    the KL weighted by ``alpha`` against the text's labels)."""
    label = (f"pca-m{m}-tied-keep{RECOVER[1]}{name}-kd-lr{lr:g}" + variant(hidden, temperature, floor, alpha)
             + (f"-s{data_seed}" if data_seed else "") + (f"-b{batch}" if batch != BATCH else "")
             + (f"-on-{text}" if text != "shakespeare" else ""))
    return dict(finetuned(start["out_dir"], data, label, loss_args(hidden, temperature, alpha),
                          recipe(lr, data_seed, batch, floor), text), lr=lr, batch=batch, text=text, hidden=hidden,
                **recorded(temperature, floor, alpha))


def variant(hidden: float, temperature: float, floor: float | None, alpha: float) -> str:
    """A run label's marks for what differs from the recipe (none for the recipe itself: the cached runs keep
    their labels)."""
    return ((f"-h{hidden:g}" if hidden else "") + (f"-t{temperature:g}" if temperature != 1.0 else "")
            + (f"-min{floor:g}" if floor is not None else "") + (f"-a{alpha:g}" if alpha != 1.0 else ""))


def recorded(temperature: float, floor: float | None, alpha: float) -> dict:
    """What a run's saved record names beside its rate, batch, text and hidden weight, where not the recipe's."""
    return {**({"temperature": temperature} if temperature != 1.0 else {}),
            **({"min_lr": floor} if floor is not None else {}), **({"alpha": alpha} if alpha != 1.0 else {})}


def control(src: str, data: dict[str, str], lr: float, batch: int = BATCH, text: str = "shakespeare",
            hidden: float = 0.0, temperature: float = 1.0, floor: float | None = None, alpha: float = 1.0) -> dict:
    """The original distilled from itself with the arms' recipe at ``lr`` in batches of ``batch`` on ``text``."""
    label = (f"original-kd-self-lr{lr:g}" + variant(hidden, temperature, floor, alpha)
             + (f"-b{batch}" if batch != BATCH else "") + (f"-on-{text}" if text != "shakespeare" else ""))
    return dict(finetuned(src, data, label, (*loss_args(hidden, temperature, alpha), f"--teacher_dir={src}"),
                          recipe(lr, batch=batch, floor=floor), text), lr=lr, batch=batch, text=text, hidden=hidden,
                **recorded(temperature, floor, alpha))


def readers_start(src: str, data: dict[str, str]) -> dict:
    """The same tied map with the least-squares readers refit (results/real_model_tied's best −25% row)."""
    return build(src, data, (RECOVER[0], RECOVER[1], ("--refit=readers",), RECOVER[3]))


def unchanged(a: str, b: str) -> bool:
    """Whether two checkpoints hold the same weights, bit for bit."""
    x, y = load_model(a)[0].state_dict(), load_model(b)[0].state_dict()
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def main() -> None:
    args, started, src, data = begin(__doc__.split("\n\n")[0], ("arms", "later", *ADDED, "all"))
    if args.part in ADDED:  # each adds to the saved results: (src, data, payload, started, reverse)
        ADDED[args.part](src, data, saved_results(), started, args.reverse)
        return
    if args.part == "later":
        payload = saved_results()
        chosen, best = payload["chosen_lr"], payload["batches"]["chosen"]
        if args.reverse:  # build only, from the end: the rates in the best batch, then the −50% model
            if best != BATCH:
                start = build(src, data, RECOVER)
                rates = {lr: arm(data, start, lr, batch=best) for lr in reversed(LRS) if lr != chosen}
                winner = best_rate(payload, rates)
                if winner != chosen:
                    for seed in reversed(DATA_SEEDS):
                        arm(data, start, winner, seed, batch=best)
            arm(data, build(src, data, HALF), chosen, batch=best, m=HALF[0])
            return
        later(src, data, payload, started, chosen, best)
        return
    start = build(src, data, RECOVER)
    arms = {lr: arm(data, start, lr) for lr in (reversed(LRS) if args.reverse else LRS)}
    if args.part == "arms":
        return
    chosen = min(LRS, key=lambda lr: arms[lr]["losses"]["val"])
    if args.reverse:  # build only, the later parts first (the forward process goes on with the control)
        batches = {b: arm(data, start, chosen, batch=b) for b in reversed(BATCHES)}
        best = smallest_batch_loss(arms[chosen], batches)
        if best != BATCH:
            for seed in reversed(DATA_SEEDS):
                arm(data, start, chosen, seed, batch=best)
        arm(data, build(src, data, HALF), chosen, batch=best, m=HALF[0])
        control(src, data, chosen, best, GENERAL_TEXT)
        arm(data, build(src, data, GENERAL), chosen, name="-news", batch=best, text=GENERAL_TEXT)
        arm(data, readers_start(src, data), chosen, name="-readers")
        for seed in reversed(DATA_SEEDS):
            arm(data, start, chosen, seed)
        return
    ctrl = control(src, data, chosen)
    payload = {"model": "SmolLM2-135M-Instruct (GGUF Q4_1, dequantized to float32)",
               "tokens": FT_ITERS * 8 * BLOCK, "recipe": recipe(chosen), "distill": list(DISTILL), "lrs": list(LRS),
               "chosen_lr": chosen, "base": {"parameters": parameters(src)}, "original": losses(src, data),
               "control": dict(ctrl, unchanged=unchanged(src, ctrl["out_dir"])),
               "start": {"m": RECOVER[0], "tie_keep": RECOVER[1], "losses": start["losses"],
                         "parameters": parameters(start["out_dir"])},
               "rows": [{"lr": lr, "arm": arms[lr]} for lr in LRS]}
    save(payload, started, "real_model_distill", "scripts/real_distill.sh")
    payload["draws"] = draws([arms[chosen]] + [arm(data, start, chosen, seed) for seed in DATA_SEEDS], ctrl, chosen)
    save(payload, started, "real_model_distill", "scripts/real_distill.sh")
    refit = readers_start(src, data)
    payload["readers"] = dict(arm(data, refit, chosen, name="-readers"), zero_shot=refit["losses"],
                              start_parameters=parameters(refit["out_dir"]))
    save(payload, started, "real_model_distill", "scripts/real_distill.sh")
    # more optimizer steps on the same tokens: smaller batches at the chosen rate, one factor
    batches = {b: arm(data, start, chosen, batch=b) for b in BATCHES}
    best = smallest_batch_loss(arms[chosen], batches)
    payload["batches"] = {"rows": [{"batch": b, "recipe": recipe(chosen, batch=b), "arm": batches[b]}
                                   for b in BATCHES], "lr": chosen, "chosen": best}
    save(payload, started, "real_model_distill", "scripts/real_distill.sh")
    if best != BATCH:  # its own control (the identical recipe), then two more data orders: n = 3
        own = control(src, data, chosen, best)
        payload["batches"]["control"] = dict(own, unchanged=unchanged(src, own["out_dir"]))
        payload["batches"]["draws"] = draws([batches[best]] + [arm(data, start, chosen, seed, batch=best)
                                                               for seed in DATA_SEEDS], own, chosen)
        save(payload, started, "real_model_distill", "scripts/real_distill.sh")
    later(src, data, payload, started, chosen, best)


def saved_results() -> dict:
    """results/real_model_distill/results.json, which must already hold the rates and the batches (--part=later)."""
    payload = saved("real_model_distill", "scripts/real_distill.sh")
    if "chosen" not in payload.get("batches", {}):
        sys.exit("results/real_model_distill/results.json has no chosen batch: run scripts/real_distill.sh (every "
                 "part) first")
    return payload


def save_part(payload: dict, started: float) -> None:
    """results/real_model_distill/results.json from a part that adds to it, keeping the keys that another part,
    running beside it, saved after this one began (``save``'s merge)."""
    save(payload, started, "real_model_distill", "scripts/real_distill.sh", True)


def later(src: str, data: dict[str, str], payload: dict, started: float, chosen: float, best: int) -> None:
    """The general case and the −50% model at rate ``chosen`` in batches of ``best`` and, where ``best`` is not the
    recipe's batch, the other rates in it; added to ``payload`` and saved after each model."""
    # the general case: calibrated and distilled on English news, evaluated on the novel (neither text)
    general_case(src, data, payload, started, "general_case", GENERAL, "-news")
    # −50% parameters: the tied m = 288 model with the best recipe; its control is the best recipe's (the same run)
    half = build(src, data, HALF)
    payload["half"] = {"m": HALF[0], "batch": best, "start": {"losses": half["losses"],
                                                               "parameters": parameters(half["out_dir"])},
                       "arm": arm(data, half, chosen, batch=best, m=HALF[0])}
    save_part(payload, started)
    if best == BATCH:
        return
    # the rate again at the best batch, one factor: the rates were tried in the recipe's batch, and a step count
    # eight times larger may want another; the winner, if not the chosen rate, gets two more data orders (n = 3)
    start = build(src, data, RECOVER)
    rates = {lr: arm(data, start, lr, batch=best) for lr in LRS if lr != chosen}
    payload["batches"]["rates"] = [{"lr": lr, "arm": rates[lr]} for lr in LRS if lr != chosen]
    save_part(payload, started)
    winner = best_rate(payload, rates)
    if winner != chosen:
        runs = [rates[winner]] + [arm(data, start, winner, seed, batch=best) for seed in DATA_SEEDS]
        payload["batches"]["rate_draws"] = draws(runs, payload["batches"]["control"], winner)
        save_part(payload, started)


def general_case(src: str, data: dict[str, str], payload: dict, started: float, key: str, spec: tuple,
                 name: str) -> None:
    """results/real_model_tied's cell ``spec`` distilled on its own calibration text with the best recipe, and the
    original distilled from itself on that text (its control), evaluated on the novel that neither reads; added to
    ``payload`` under ``key`` and saved after each model."""
    chosen, best, text = payload["chosen_lr"], payload["batches"]["chosen"], spec[3]
    start = build(src, data, spec)
    payload[key] = {"text": text, "batch": best, "recipe": recipe(chosen, batch=best),
                    "train_tokens": len(BatchLoader(data[text], BLOCK, 1, "cpu").tokens("train")),
                    "start": {"losses": start["losses"], "parameters": parameters(start["out_dir"]),
                              "options": list(spec[2])},
                    "arm": arm(data, start, chosen, name=name, batch=best, text=text)}
    save_part(payload, started)
    own = control(src, data, chosen, best, text)
    payload[key]["control"] = dict(own, unchanged=unchanged(src, own["out_dir"]))
    save_part(payload, started)


def mix_case(src: str, data: dict[str, str], payload: dict, started: float, reverse: bool) -> None:
    """The general case from its best zero-shot start: the map learned with its norm gains on the calibration mix
    (real_tied_head.MIX_RECIPE), distilled on the mix, against the original distilled from itself on the mix; saved
    as "mix_case" (``reverse``: the control only, saving nothing)."""
    if reverse:
        control(src, data, payload["chosen_lr"], payload["batches"]["chosen"], MIX_RECIPE[3])
        return
    general_case(src, data, payload, started, "mix_case", MIX_RECIPE, MIX_NAME)


def mix_draws(src: str, data: dict[str, str], payload: dict, started: float, reverse: bool = False) -> None:
    """Two more data orders (``DATA_SEEDS``: n = 3) of the general case's best start distilled ("mix_case": the map
    learned with its norm gains on the mix, distilled on the mix), the same recipe and control, read on the novel.
    Saved as "mix_draws" (``reverse``: build the last data order only, saving nothing)."""
    case = payload.get("mix_case", {})
    if "control" not in case:
        sys.exit("results/real_model_distill/results.json has no general case from the mix with its control: run "
                 "--part=mix first")
    chosen, text = case["arm"]["lr"], MIX_RECIPE[3]
    start = build(src, data, MIX_RECIPE)
    if reverse:
        arm(data, start, chosen, DATA_SEEDS[-1], name=MIX_NAME, batch=case["batch"], text=text)
        return
    runs = [case["arm"]] + [arm(data, start, chosen, seed, name=MIX_NAME, batch=case["batch"], text=text)
                            for seed in DATA_SEEDS]
    payload["mix_draws"] = dict(draws(runs, case["control"], chosen), start="mix_case")
    save_part(payload, started)


def features(src: str, data: dict[str, str], payload: dict, started: float, reverse: bool) -> None:
    """The hidden-state term on the best recipe (the chosen rate in the best batch), one factor: β in HIDDEN on data
    order 0; the control with the lowest β's loss; two more data orders where it ends below the KL alone. Added to
    ``payload`` as "features" and saved after each model (``reverse``: build only, from the end)."""
    loss_variants(src, data, payload, started, reverse, "features", "hidden", HIDDEN, "weights")


def temperatures(src: str, data: dict[str, str], payload: dict, started: float, reverse: bool) -> None:
    """Both softmaxes at τ in TEMPERATURES (the KL scaled by τ², as distill.teacher_kl does) on the best recipe, one
    factor against τ = 1: the teacher's small probabilities weigh more. Added to ``payload`` as "temperature"
    (``loss_variants``)."""
    loss_variants(src, data, payload, started, reverse, "temperature", "temperature", TEMPERATURES, "temperatures")


def loss_variants(src: str, data: dict[str, str], payload: dict, started: float, reverse: bool, key: str,
                  option: str, values: tuple[float, ...], listed: str) -> None:
    """The best recipe (the chosen rate in the best batch) with its loss changed in one ``option`` of ``arm`` (each
    of ``values``) on data order 0; the control (the original distilled from itself) with the best value's loss;
    where that value ends below the recipe's KL alone, two more data orders (n = 3). Saved under ``key`` after each
    model, the values listed as ``listed`` (``reverse``: build only, from the end)."""
    chosen, best = payload["chosen_lr"], payload["batches"]["chosen"]
    start = build(src, data, RECOVER)
    rows = {}
    for value in tuple(reversed(values)) if reverse else values:
        rows[value] = arm(data, start, chosen, batch=best, **{option: value})
        if not reverse:
            payload[key] = {"lr": chosen, "batch": best, listed: list(values),
                            "rows": [{option: v, "arm": rows[v]} for v in values if v in rows]}
            save_part(payload, started)
    winner = min(values, key=lambda v: rows[v]["losses"]["val"])
    wins = rows[winner]["losses"]["val"] < best_recipe_arm(payload)["losses"]["val"]
    if reverse:
        if wins:
            for seed in reversed(DATA_SEEDS):
                arm(data, start, chosen, seed, batch=best, **{option: winner})
        control(src, data, chosen, best, **{option: winner})
        return
    own = control(src, data, chosen, best, **{option: winner})
    payload[key].update(chosen=winner, control=dict(own, unchanged=unchanged(src, own["out_dir"])))
    save_part(payload, started)
    if wins:  # n = 3 where the variant ends below the KL alone
        runs = [rows[winner]] + [arm(data, start, chosen, seed, batch=best, **{option: winner})
                                 for seed in DATA_SEEDS]
        payload[key]["draws"] = draws(runs, own, chosen)
        save_part(payload, started)


LEARNED_STARTS = (("learned", RECOVER, (LEARN,), "-learned"), ("half_learned", HALF, (LEARN,), "-learned"),
                  ("gains_learned", RECOVER, (LEARN, GAINS), "-learned-gains"),
                  ("labels_learned", RECOVER, (LEARN, GAINS, LABELS), "-learned-gains-labels"))
# (results key, the tied cell, its learning options, the run's label): the learned starts --part=learned distils


def learned(src: str, data: dict[str, str], payload: dict, started: float, reverse: bool = False) -> None:
    """A better start, one factor: the tied map learned on the calibration KL (results/real_model_tied's
    ``--learn_steps`` rows) distilled with the best recipe, against that recipe's control; at −25% parameters
    added as "learned", at −50% (m = 288) as "half_learned", the −25% map learned with its norm gains as
    "gains_learned", and with the text's labels too as "labels_learned"; a start ``payload`` holds is kept as it is
    (``reverse``: build the last start's run only, saving nothing)."""
    chosen, best = payload["chosen_lr"], payload["batches"]["chosen"]
    for key, spec, more, name in LEARNED_STARTS[::-1 if reverse else 1]:
        if key in payload and not reverse:  # measured already: the saved run stands (each is half an hour)
            continue
        start = build(src, data, (spec[0], spec[1], more, spec[3]))
        run = arm(data, start, chosen, name=name, batch=best, m=spec[0])
        if reverse:
            return
        payload[key] = dict(run, zero_shot=start["losses"], start_parameters=parameters(start["out_dir"]),
                            option=" ".join(more), m=spec[0])
        save_part(payload, started)


def best_control(payload: dict) -> dict:
    """The best recipe's control: the chosen batch's own where a smaller batch won, else the recipe's."""
    return payload["batches"]["control"] if "control" in payload["batches"] else payload["control"]


def best_learned_start(payload: dict) -> tuple[str, tuple, tuple[str, ...], str]:
    """The entry of LEARNED_STARTS at m = 432 whose distilled model (the best recipe, data order 0) ends lowest on
    the whole val split; exits with one line where ``payload`` has none."""
    measured = [x for x in LEARNED_STARTS if x[0] in payload and x[1][0] == RECOVER[0]]
    if not measured:
        sys.exit("results/real_model_distill/results.json has no learned −25% start: run --part=learned first")
    return min(measured, key=lambda x: payload[x[0]]["losses"]["val"])


def learned_rates(src: str, data: dict[str, str], payload: dict, started: float, reverse: bool = False) -> None:
    """The rates of ``LRS`` below the chosen one on the best learned −25% start (``best_learned_start``), the best
    batch, data order 0: a start near the original may want smaller steps (from the labels' start the chosen rate
    first raises the fixed eval batches' loss, step 0 to mid-run). Where one ends below the chosen rate's run, two
    more data orders at it (n = 3). Saved as "learned_rates" (``reverse``: build the lowest rate's run only)."""
    chosen, best = payload["chosen_lr"], payload["batches"]["chosen"]
    key, spec, more, name = best_learned_start(payload)
    start = build(src, data, (spec[0], spec[1], more, spec[3]))
    lower = [lr for lr in LRS if lr < chosen]
    if reverse:
        arm(data, start, lower[0], name=name, batch=best, m=spec[0])
        return
    rows = []
    for lr in reversed(lower):  # nearest the chosen rate first
        rows.append({"lr": lr, "arm": arm(data, start, lr, name=name, batch=best, m=spec[0])})
        payload["learned_rates"] = {"start": key, "option": " ".join(more), "batch": best, "rows": rows}
        save_part(payload, started)
    winner = min(rows, key=lambda x: x["arm"]["losses"]["val"])
    if winner["arm"]["losses"]["val"] < payload[key]["losses"]["val"]:
        runs = [winner["arm"]] + [arm(data, start, winner["lr"], seed, name=name, batch=best, m=spec[0])
                                  for seed in DATA_SEEDS]
        payload["learned_rates"]["draws"] = draws(runs, best_control(payload), winner["lr"])
        save_part(payload, started)


def learned_draws(src: str, data: dict[str, str], payload: dict, started: float, reverse: bool = False) -> None:
    """Two more data orders (``DATA_SEEDS``: n = 3) for the −25% learned start (``LEARNED_STARTS``, m = 432) whose
    distilled model ends lowest on the whole val split, the best recipe unchanged: its gap to the control is within
    the recipe's data-order spread of the 3% aim, so one order cannot say on which side it lies. Saved as
    "learned_draws" (``reverse``: build the last data order only, saving nothing)."""
    chosen, best = payload["chosen_lr"], payload["batches"]["chosen"]
    key, spec, more, name = best_learned_start(payload)
    start = build(src, data, (spec[0], spec[1], more, spec[3]))
    if reverse:
        arm(data, start, chosen, DATA_SEEDS[-1], name=name, batch=best, m=spec[0])
        return
    runs = [payload[key]] + [arm(data, start, chosen, seed, name=name, batch=best, m=spec[0]) for seed in DATA_SEEDS]
    payload["learned_draws"] = dict(draws(runs, best_control(payload), chosen), start=key, option=" ".join(more))
    save_part(payload, started)


def best_recipe_arm(payload: dict) -> dict:
    """The saved run of the chosen rate in the chosen batch, data order 0: the KL alone in the best recipe."""
    batches = payload["batches"]
    if batches["chosen"] == BATCH:
        return next(x["arm"] for x in payload["rows"] if x["lr"] == payload["chosen_lr"])
    return next(x["arm"] for x in batches["rows"] if x["batch"] == batches["chosen"])


def best_rate(payload: dict, rates: dict[float, dict]) -> float:
    """The rate whose model, distilled in the chosen batch, ends lowest on the whole val split (the chosen rate's
    run, from ``payload``, included)."""
    return min({payload["chosen_lr"]: best_recipe_arm(payload), **rates}.items(),
               key=lambda kv: kv[1]["losses"]["val"])[0]


def smallest_batch_loss(recipe_arm: dict, batches: dict[int, dict]) -> int:
    """The batch whose distilled model ends lowest on the whole val split (the recipe's own BATCH included)."""
    return min({BATCH: recipe_arm, **batches}.items(), key=lambda kv: kv[1]["losses"]["val"])[0]


def draws(runs: list[dict], ctrl: dict, lr: float) -> dict:
    """The data orders' losses and their gaps to ``ctrl`` (mean, sample std, each), run 0 first."""
    gaps = {text: [x["losses"][text] / ctrl["losses"][text] - 1 for x in runs] for text in ("val", "general")}
    return {"seeds": [0, *DATA_SEEDS], "lr": lr, "arm": [x["losses"] for x in runs],
            "gap": {text: {"mean": statistics.fmean(g), "std": statistics.stdev(g), "each": g}
                    for text, g in gaps.items()}}


def to_zero(src: str, data: dict[str, str], payload: dict, started: float, reverse: bool = False) -> None:
    """The best learned −25% start (``best_learned_start``) with the rate decayed to 0 instead of a tenth of it (the
    cosine's floor, ``--min_lr=0``; one factor: rate, batch, tokens and data orders as ``learned_draws``): with one
    256-token window per step the last steps' noise moves the end model (the data orders' spread), and a schedule
    that ends at 0 lets those steps only settle it. Its own control (the original distilled from itself with the
    identical recipe) and the three data orders (n = 3), paired by order with ``learned_draws``. Saved as
    "to_zero" (``reverse``: build the control and the last data order only, saving nothing)."""
    chosen, best = payload["chosen_lr"], payload["batches"]["chosen"]
    key, spec, more, name = best_learned_start(payload)
    start = build(src, data, (spec[0], spec[1], more, spec[3]))
    if reverse:
        control(src, data, chosen, best, floor=FLOOR)
        arm(data, start, chosen, DATA_SEEDS[-1], name=name, batch=best, m=spec[0], floor=FLOOR)
        return
    runs = [arm(data, start, chosen, seed, name=name, batch=best, m=spec[0], floor=FLOOR) for seed in (0, *DATA_SEEDS)]
    own = control(src, data, chosen, best, floor=FLOOR)
    payload["to_zero"] = dict(draws(runs, own, chosen), start=key, option=" ".join(more), min_lr=FLOOR, batch=best,
                              recipe=recipe(chosen, batch=best, floor=FLOOR), parameters=runs[0]["parameters"],
                              seconds=[x["step"]["seconds"] for x in runs],
                              control=dict(own, unchanged=unchanged(src, own["out_dir"])))
    save_part(payload, started)


def with_labels(src: str, data: dict[str, str], payload: dict, started: float, reverse: bool = False) -> None:
    """The best learned −25% start (``best_learned_start``) distilled on ALPHA·KL + (1 − ALPHA)·CE of the text's next
    token instead of the KL alone (one factor, what a token teaches; rate, batch, tokens and data orders as
    ``learned_draws``), against its own control: the original distilled from itself with that loss, which the
    labels move too. Data order 0; where its gap to its control ends below the KL's (order 0 of ``learned_draws``),
    two more data orders (n = 3), paired by order. Saved as "labels" (``reverse``: the control only, saving
    nothing)."""
    chosen, best = payload["chosen_lr"], payload["batches"]["chosen"]
    key, spec, more, name = best_learned_start(payload)
    if reverse:
        control(src, data, chosen, best, alpha=ALPHA)
        return
    start = build(src, data, (spec[0], spec[1], more, spec[3]))
    first = arm(data, start, chosen, name=name, batch=best, m=spec[0], alpha=ALPHA)
    payload["labels"] = {"start": key, "option": " ".join(more), "alpha": ALPHA, "batch": best,
                         "recipe": recipe(chosen, batch=best), "loss": list(loss_args(0.0, alpha=ALPHA)), "arm": first}
    save_part(payload, started)
    own = control(src, data, chosen, best, alpha=ALPHA)
    payload["labels"]["control"] = dict(own, unchanged=unchanged(src, own["out_dir"]))
    save_part(payload, started)
    kl = payload.get("learned_draws", {})
    if kl.get("start") == key and first["losses"]["val"] / own["losses"]["val"] - 1 < kl["gap"]["val"]["each"][0]:
        runs = [first] + [arm(data, start, chosen, seed, name=name, batch=best, m=spec[0], alpha=ALPHA)
                          for seed in DATA_SEEDS]
        payload["labels"]["draws"] = dict(draws(runs, own, chosen), start=key, option=" ".join(more), alpha=ALPHA)
        save_part(payload, started)


ADDED = {"features": features, "temperature": temperatures, "learned": learned, "mix": mix_case,
         "learned_draws": learned_draws, "learned_rates": learned_rates, "to_zero": to_zero, "labels": with_labels,
         "mix_draws": mix_draws}
# the parts that add to results/real_model_distill/results.json once it holds the rates and batches: --part → function


if __name__ == "__main__":
    main()
