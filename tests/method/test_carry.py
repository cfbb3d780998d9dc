"""Carrying AdamW's state across growth (carry.py, transform.py --carry_optimizer, finetune.py --init_state):
the first moment maps exactly as the gradient does, the second moment is exact for coordinate embeddings, the
carried state resumes training, and the schedule continues (or re-warms) from the checkpoint's iteration."""
import importlib
import json
import os

import pytest
import torch

from conftest import TINY_MODEL, spec
from finetune import FinetuneConfig, finetune
from lgpt.method.carry import carry_moments
from lgpt.method.pipeline import transform_model
from lgpt.plumbing.checkpoint import load_checkpoint
from lgpt.plumbing.configurator import load_config
from lgpt.plumbing.errors import ConfigError, TransformError
from test_transform import random_model
from train import TrainConfig, get_lr
from transform import TransformConfig, transform_checkpoint

VARIANTS = [{"norm_type": "rmsnorm"},  # per-dimension gains (folded), learned positions
            {"norm_type": "rmsnorm", "norm_gain": "scalar", "mlp": "swiglu", "pos": "rope", "bias": True},
            {"norm_type": "rmsnorm", "mlp": "swiglu", "pos": "rope", "bias": False, "qkv_bias": True,
             "n_kv_head": 1}]  # Qwen2-like multi-query: cloned heads keep 2 query heads per key/value head


def gradients(model, idx) -> dict[str, torch.Tensor]:
    model.zero_grad()
    model.train()
    _, loss = model(idx, idx)
    loss.backward()
    model.eval()
    return {n: p.grad.detach().double().clone() for n, p in model.named_parameters()}


def adam_state_from(model, grads: dict[str, torch.Tensor]) -> dict:
    """A torch AdamW state_dict whose moments are exactly g and g² (as after a step with β = 0)."""
    decay, no_decay = model.optimizer_groups()
    names = decay + no_decay
    state = {i: {"step": torch.tensor(7.0), "exp_avg": grads[n].float(), "exp_avg_sq": grads[n].float() ** 2}
             for i, n in enumerate(names)}
    return {"state": state, "param_groups": [{"params": list(range(len(decay)))},
                                             {"params": list(range(len(decay), len(names)))}]}


def fresh_parameters(model, grown, n_head: int, mlp_hidden: int, mode: str) -> set[str]:
    """Parameters (or parts) without an image of the old model's gradient: new scalar gains, zero-mode units."""
    out = {n for n in dict(grown.named_parameters()) if "ln_" in n and model.config.norm_gain != "scalar"}
    if mode == "zero" and (n_head or mlp_hidden):
        out |= {n for n in dict(grown.named_parameters()) if "c_attn" in n or "c_fc" in n or "c_proj" in n}
    return out


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("grow", [{}, {"n_head": 4, "mlp_hidden": 128, "grow_mode": "clone"}])
def test_the_carried_first_moment_is_the_grown_models_gradient(variant, grow):
    model = random_model(3, **variant)
    idx = torch.randint(0, 11, (3, 8))
    grads = gradients(model, idx)
    grown, record = transform_model(model, spec(32, kind="orthogonal", seed=2, **grow))
    carried = carry_moments(model, adam_state_from(model, grads), record["T"], grown, grow.get("n_head", 0),
                            grow.get("mlp_hidden", 0), grow.get("grow_mode", "zero"))
    assert carried["step"] == 7
    expected = gradients(grown, idx)
    skip = fresh_parameters(model, grown, 0, 0, "clone")
    checked = 0
    for name, g in expected.items():
        got = carried["moments"][name]["exp_avg"].double()
        assert got.shape == g.shape
        if name in skip:
            assert got.abs().max() == 0  # no history
            continue
        torch.testing.assert_close(got, g, atol=1e-6 * (1 + g.abs().max().item()), rtol=1e-4)
        checked += 1
    assert checked >= 10


def test_the_second_moment_is_exact_for_a_coordinate_embedding_and_never_negative():
    model = random_model(4, norm_type="rmsnorm")
    idx = torch.randint(0, 11, (3, 8))
    grads = gradients(model, idx)
    grown, record = transform_model(model, spec(24, kind="truncate"))
    carried = carry_moments(model, adam_state_from(model, grads), record["T"], grown)
    expected = gradients(grown, idx)
    for name, g in expected.items():
        if "ln_" in name:
            continue
        torch.testing.assert_close(carried["moments"][name]["exp_avg_sq"].double(), g ** 2,
                                   atol=1e-9 + 1e-5 * g.pow(2).max().item(), rtol=1e-4)
    dense, record = transform_model(model, spec(32, kind="orthogonal", seed=5))
    carried = carry_moments(model, adam_state_from(model, grads), record["T"], dense)
    assert all(v["exp_avg_sq"].min() >= 0 for v in carried["moments"].values())


def test_zero_mode_units_start_without_history_and_clones_split_their_inputs():
    model = random_model(1, norm_type="rmsnorm", norm_gain="scalar")
    grads = gradients(model, torch.randint(0, 11, (2, 8)))
    state = adam_state_from(model, grads)
    for mode in ("zero", "clone"):
        grown, record = transform_model(model, spec(16, kind="orthogonal", n_head=4, grow_mode=mode))
        moments = carry_moments(model, state, record["T"], grown, 4, 0, mode)["moments"]
        qkv = moments["transformer.h.0.attn.c_attn.weight"]["exp_avg_sq"]
        old = qkv[:16]  # Q rows of the model's two heads (head_dim 8)
        if mode == "zero":
            assert qkv[16:32].abs().max() == 0 and moments["transformer.h.0.attn.c_proj.weight"]["exp_avg"][:, 16:] \
                .abs().max() == 0
        else:  # two copies of each head: gradient/2 on each copy's inputs, so exp_avg_sq / 4
            torch.testing.assert_close(qkv[16:32], old)
            ported = carry_moments(model, state, record["T"], transform_model(model, spec(16, kind="orthogonal"))[0])
            plain = ported["moments"]["transformer.h.0.attn.c_attn.weight"]["exp_avg_sq"]
            torch.testing.assert_close(4 * old, plain[:16])


# ----------------------------------------------------------------------------------------------
# The command-line path: train → transform --carry_optimizer → finetune --init_state


@pytest.fixture(scope="module")
def stage1(tmp_path_factory, char_data_dir):
    out = tmp_path_factory.mktemp("stage1")
    cfg = load_config(TrainConfig, TINY_MODEL + [f"--data_dir={char_data_dir}", f"--out_dir={out}", "--max_iters=20",
                                                 "--lr_decay_iters=40", "--eval_interval=10", "--norm_type=rmsnorm",
                                                 "--norm_gain=scalar"])
    from train import train
    train(cfg)
    return str(out)


def grown_dir(stage1: str, tmp, carry: bool = True, **kw) -> str:
    out = os.path.join(str(tmp), "grown-carry" if carry else "grown")
    transform_checkpoint(TransformConfig(in_dir=stage1, out_dir=out, width=64, kind="orthogonal", n_head=4,
                                         mlp_hidden=256, carry_optimizer=carry, eval_iters=0, **kw))
    return out


def continued(src: str, out: str, *args: str) -> dict:
    settings = [a for a in TINY_MODEL if not a.startswith(("--n_head", "--n_embd", "--n_layer"))]
    cfg = load_config(FinetuneConfig, settings + [f"--in_dir={src}", f"--out_dir={out}", "--max_iters=30",
                                                    "--lr_decay_iters=40", "--learning_rate=1e-3", "--min_lr=1e-4",
                                                    "--warmup_iters=2", "--eval_interval=5", "--init_state=True",
                                                    *args])
    return finetune(cfg)


def test_a_grown_checkpoint_carries_the_state_and_training_continues_the_schedule(stage1, tmp_path):
    source = load_checkpoint(stage1)
    src = grown_dir(stage1, tmp_path)
    ckpt = load_checkpoint(src)
    assert ckpt["source_iter_num"] == source["iter_num"] == 20 and ckpt["transform"]["optimizer"]["step"] == 20
    grown_params = {n: p.shape for n, p in
                    importlib.import_module("lgpt.plumbing.checkpoint").model_from_checkpoint(ckpt).named_parameters()}
    assert {n: v["exp_avg"].shape for n, v in ckpt["optimizer_moments"]["moments"].items()} == grown_params
    summary = continued(src, str(tmp_path / "ft"))
    assert summary["iter_num"] == 30 and [step for step, _ in summary["curve"]] == [20, 25, 30]
    steps = {float(v["step"]) for v in load_checkpoint(str(tmp_path / "ft"))["optimizer"]["state"].values()}
    assert steps == {30.0}  # AdamW went on from the carried step 20, not from 0
    with open(tmp_path / "ft" / "metrics.jsonl") as f:
        lrs = {r["iter"]: r["lr"] for r in map(json.loads, f) if "lr" in r}
    cfg = load_config(FinetuneConfig, TINY_MODEL + ["--in_dir=x", "--out_dir=y", "--lr_decay_iters=40",
                                                    "--learning_rate=1e-3", "--min_lr=1e-4", "--warmup_iters=2"])
    assert lrs[25] == pytest.approx(get_lr(25, cfg))  # the stage-1 cosine, where it left off
    rewarm = continued(src, str(tmp_path / "ft-rewarm"), "--rewarm_iters=8")
    with open(tmp_path / "ft-rewarm" / "metrics.jsonl") as f:
        lrs = {r["iter"]: r["lr"] for r in map(json.loads, f) if "lr" in r}
    assert lrs[20] == pytest.approx(get_lr(20, cfg) / 9) and lrs[30] == pytest.approx(get_lr(30, cfg))
    assert rewarm["val_loss"] > 0


def test_bad_carry_and_continuation_requests_fail_with_one_clear_error(stage1, tmp_path):
    with pytest.raises(TransformError, match="carry_optimizer needs .*width ≥ d=32"):
        transform_checkpoint(TransformConfig(in_dir=stage1, out_dir=str(tmp_path / "s"), width=16,
                                             carry_optimizer=True, eval_iters=0))
    assert not os.path.exists(tmp_path / "s")
    plain = grown_dir(stage1, tmp_path, carry=False)
    assert load_checkpoint(plain)["source_iter_num"] == 20  # the schedule's position is kept without moments too
    fresh = continued(plain, str(tmp_path / "fresh"))
    assert [step for step, _ in fresh["curve"]] == [20, 25, 30]
    with pytest.raises(TransformError, match="holds no optimizer state"):
        transform_checkpoint(TransformConfig(in_dir=plain, out_dir=str(tmp_path / "again"), width=64,
                                             carry_optimizer=True, eval_iters=0))
    with pytest.raises(ConfigError, match="rewarm_iters re-warms the LR after a continued state"):
        load_config(FinetuneConfig, [f"--in_dir={plain}", "--out_dir=x", "--rewarm_iters=5"])
    with pytest.raises(ConfigError, match="max_iters=10 is not beyond the checkpoint's iter_num=20"):
        continued(grown_dir(stage1, tmp_path / "c"), str(tmp_path / "ft"), "--max_iters=10")
    assert not os.path.exists(tmp_path / "ft" / "ckpt.pt")
