"""Width growth that uses the new directions (issue 28): fresh readers of them (--grow_reader_std), MSG's masked
new parts (--grow_mask_iters; Yao et al. 2024) and SPARKLING's RMS-keeping stream scale (--rms_preserve). Each is
exact at the switch; the masks open over training and leave a plain checkpoint behind."""
import math
import os

import pytest
import torch
from test_carry import adam_state_from, gradients

from conftest import TINY_MODEL, spec
from finetune import FinetuneConfig, finetune
from lgpt.method.carry import carry_moments
from lgpt.method.pipeline import transform_model
from lgpt.plumbing.checkpoint import load_checkpoint, load_model, model_from_checkpoint
from lgpt.plumbing.configurator import load_config
from lgpt.plumbing.errors import TransformError
from model import advance_ramp, ramp_of, raw_state_dict
from test_transform import random_model
from transform import TransformConfig, transform_checkpoint

GROWTHS = [{"grow_reader_std": 0.02}, {"grow_mask_iters": 4}, {"rms_preserve": True},
           {"grow_reader_std": 0.02, "grow_mask_iters": 4, "rms_preserve": True, "n_head": 4, "mlp_hidden": 128}]


def logits(model, idx):
    with torch.no_grad():
        return model(idx)[0]


@pytest.mark.parametrize("growth", GROWTHS)
@pytest.mark.parametrize("variant", [{"norm_type": "rmsnorm", "norm_gain": "scalar"},
                                     {"norm_type": "layernorm", "bias": True},  # folded and centred first
                                     {"norm_type": "rmsnorm", "mlp": "swiglu", "pos": "rope", "bias": False}])
def test_each_growth_of_the_new_directions_is_exact_at_the_switch(growth, variant):
    model = random_model(1, **variant)
    idx = torch.randint(0, 11, (2, 8))
    grown, record = transform_model(model, spec(32, kind="orthogonal", seed=3, **growth))
    assert record["exact"]
    torch.testing.assert_close(logits(grown, idx), logits(model, idx), atol=2e-5, rtol=1e-5)
    ramp = record["growth_ramp"]
    assert (ramp is not None) == bool(growth.get("grow_mask_iters"))
    if ramp is not None:  # the masks hold real new weights: opened, they change the function
        for _ in range(ramp.iters):
            advance_ramp(grown)
        assert ramp_of(grown) is None
        assert (logits(grown, idx) - logits(model, idx)).abs().max() > 1e-4  # 5× the exactness tolerance


def test_fresh_readers_read_only_the_new_directions_at_the_scratch_scale():
    model = random_model(2, norm_type="rmsnorm", norm_gain="scalar")
    plain, record = transform_model(model, spec(48, kind="orthogonal", seed=1))
    fresh, _ = transform_model(model, spec(48, kind="orthogonal", seed=1, grow_reader_std=0.02))
    T = record["T"].double()
    for name in ("transformer.h.0.attn.c_attn.weight", "transformer.h.1.mlp.c_fc.weight", "lm_head.weight"):
        extra = dict(fresh.named_parameters())[name].double() - dict(plain.named_parameters())[name].double()
        assert (extra @ T).abs().max() < 1e-6  # nothing on range(T), where the ported stream lives
        assert extra.std().item() == pytest.approx(0.02 * math.sqrt(32 / 48), rel=0.15)  # N(0, .02²) on 32 of 48


def test_rms_preserve_keeps_the_streams_rms_and_the_carried_moments_are_the_gradients():
    model = random_model(3, norm_type="rmsnorm", norm_gain="scalar")
    idx = torch.randint(0, 11, (3, 8))

    def stream_rms(m):
        with torch.no_grad():
            hidden = m(idx, return_hidden=True)[2]
        return torch.stack([h.pow(2).mean().sqrt() for h in hidden])

    plain, _ = transform_model(model, spec(64, kind="orthogonal", seed=2))
    kept, record = transform_model(model, spec(64, kind="orthogonal", seed=2, rms_preserve=True))
    torch.testing.assert_close(stream_rms(kept), stream_rms(model), rtol=1e-5, atol=0)
    torch.testing.assert_close(stream_rms(plain), stream_rms(model) / 2, rtol=1e-5, atol=0)  # √(d/m) = 1/2
    grads = gradients(model, idx)
    carried = carry_moments(model, adam_state_from(model, grads), record["T"], kept, stream_scale=2.0)
    for name, g in gradients(kept, idx).items():
        torch.testing.assert_close(carried["moments"][name]["exp_avg"].double(), g,
                                   atol=1e-6 * (1 + g.abs().max().item()), rtol=1e-4)


def test_masked_parts_get_the_masked_gradient():
    model = random_model(4, norm_type="rmsnorm", norm_gain="scalar")
    grown, record = transform_model(model, spec(32, kind="orthogonal", seed=0, n_head=4, mlp_hidden=128,
                                                grow_mask_iters=4))
    ramp, null = record["growth_ramp"], record["growth_ramp"].null.float()
    idx = torch.randint(0, 11, (2, 8))
    params = grown.plain_named_parameters()
    writer = params["transformer.h.0.mlp.c_proj.weight"]
    grown.train()
    grown(idx, idx)[1].backward()
    assert writer.grad[:, 64:].abs().max() == 0  # the new neurons' columns: masked shut, no gradient
    assert (null @ writer.grad).abs().max() < 1e-6  # nor the new directions
    assert params["transformer.wte.weight"].grad.abs().max() > 0  # the old parts train
    grown.zero_grad()
    advance_ramp(grown)  # c = 1/4
    grown(idx, idx)[1].backward()
    assert writer.grad[:, 64:].abs().max() > 0 and ramp.level == 0.25


def test_bad_requests_name_what_the_new_directions_need():
    model = random_model(5, norm_type="rmsnorm", norm_gain="scalar")
    with pytest.raises(TransformError, match=r"grow_reader_std need width > d=16"):
        transform_model(model, spec(16, kind="orthogonal", grow_reader_std=0.02))
    with pytest.raises(TransformError, match=r"rms_preserve need .*a linear head"):
        transform_model(random_model(5, head="tied"), spec(32, kind="orthogonal", rms_preserve=True))
    with pytest.raises(TransformError, match=r"grow_mask_iters need .*porting='residual'"):
        transform_model(model, spec(32, kind="orthogonal", porting="sandwich", grow_mask_iters=3))
    for kind, option in (("gaussian", {"grow_mask_iters": 3}), ("rademacher", {"grow_reader_std": 0.02})):
        # once accepted: the closed masks / fresh readers then showed through and the model changed at the switch
        with pytest.raises(TransformError, match=rf"need a map with orthonormal columns .*kind='{kind}'"):
            transform_model(model, spec(32, kind=kind, **option))
    given = torch.randn(32, 16, dtype=torch.float64)
    with pytest.raises(TransformError, match="kind='file'"):
        transform_model(model, spec(32, given_map=given, grow_mask_iters=3))
    transform_model(model, spec(32, given_map=torch.linalg.qr(given).Q, grow_mask_iters=3))  # orthonormal columns: fine


# ----------------------------------------------------------------------------------------------
# The command-line path: transform writes the masks, training opens them, resume keeps them


@pytest.fixture(scope="module")
def stage1(tmp_path_factory, char_data_dir):
    from train import TrainConfig, train
    out = tmp_path_factory.mktemp("stage1") / "s1"
    train(load_config(TrainConfig, TINY_MODEL + [f"--data_dir={char_data_dir}", f"--out_dir={out}",
                                                 "--max_iters=10", "--lr_decay_iters=30", "--eval_interval=10",
                                                 "--norm_type=rmsnorm", "--norm_gain=scalar"]))
    return str(out)


def continued(src: str, out: str, *args: str) -> dict:
    settings = [a for a in TINY_MODEL if not a.startswith(("--n_head", "--n_embd", "--n_layer"))]
    return finetune(load_config(FinetuneConfig, settings + [
        f"--in_dir={src}", f"--out_dir={out}", "--lr_decay_iters=30", "--learning_rate=1e-3", "--min_lr=1e-4",
        "--warmup_iters=2", "--eval_interval=5", "--init_state=True", *args]))


def test_training_opens_the_masks_saves_them_mid_ramp_and_resumes_exactly(stage1, tmp_path):
    src = str(tmp_path / "grown")
    record = transform_checkpoint(TransformConfig(in_dir=stage1, out_dir=src, width=64, kind="orthogonal",
                                                  n_head=4, mlp_hidden=256, carry_optimizer=True, eval_iters=2,
                                                  grow_mask_iters=8, grow_reader_std=0.02, rms_preserve=True))
    assert record["val_loss_after"] == pytest.approx(record["val_loss_before"], abs=1e-5)
    ckpt = load_checkpoint(src)
    assert ckpt["growth_ramp"]["done"] == 0 and "growth_ramp" not in ckpt["transform"]
    assert not any("parametrizations" in k for k in ckpt["model"])
    straight = continued(src, str(tmp_path / "straight"), "--max_iters=25")
    energy = dict(straight["energy_outside_range_T"])  # the new directions: empty at the switch, then used
    assert energy[10] < 1e-6 and energy[25] > 1e-4  # float32 rounding at the switch
    done = load_checkpoint(str(tmp_path / "straight"))
    assert "growth_ramp" not in done  # opened at iter 18 and removed: a plain model
    assert not any("parametrizations" in k for k in done["model"])
    half = continued(src, str(tmp_path / "resumed"), "--max_iters=15", "--always_save_checkpoint=True")
    mid = load_checkpoint(str(tmp_path / "resumed"))
    assert mid["growth_ramp"]["done"] == 5 and half["iter_num"] == 15  # 5 of 8 steps taken
    masked = model_from_checkpoint(mid, growth_masks=True)  # what training goes on with
    assert ramp_of(masked).level == pytest.approx(5 / 8)
    model, _ = load_model(str(tmp_path / "resumed"))  # what every other command reads: the same function, plain
    assert ramp_of(model) is None and not any("parametrizations" in k for k in model.state_dict())
    idx = torch.randint(0, model.config.vocab_size, (2, 16))
    torch.testing.assert_close(logits(model, idx), logits(masked.eval(), idx))
    with pytest.raises(TransformError, match="saved while its growth masks were still opening"):
        transform_checkpoint(TransformConfig(in_dir=str(tmp_path / "resumed"), out_dir=str(tmp_path / "again"),
                                             width=96, carry_optimizer=True, eval_iters=0))
    assert not os.path.exists(tmp_path / "again")
    resumed = continued(src, str(tmp_path / "resumed"), "--max_iters=25", "--init_from=resume")
    assert resumed["curve"][-1][1] == pytest.approx(straight["curve"][-1][1], abs=1e-6)
    a, b = (model_from_checkpoint(load_checkpoint(str(tmp_path / d))) for d in ("straight", "resumed"))
    for (name, p), q in zip(raw_state_dict(a).items(), raw_state_dict(b).values()):
        torch.testing.assert_close(p, q, msg=name)
    assert os.path.exists(tmp_path / "resumed" / "finetune.json")


def test_the_energy_outside_range_is_the_naive_projection_residual():
    from lgpt.method.geometry import energy_outside_range
    torch.manual_seed(0)
    T = torch.linalg.qr(torch.randn(12, 5, dtype=torch.float64))[0]
    H = torch.randn(40, 12, dtype=torch.float64)
    outside = H - H @ T @ T.T
    assert energy_outside_range(H, T) == pytest.approx((outside ** 2).sum().item() / (H ** 2).sum().item())
    assert energy_outside_range(torch.randn(9, 5, dtype=torch.float64) @ T.T, T) == pytest.approx(0, abs=1e-12)


def test_the_energy_outside_the_best_subspace_is_what_pca_leaves():
    from lgpt.method.geometry import energy_outside_range, energy_outside_top
    torch.manual_seed(1)
    H = torch.randn(200, 3, dtype=torch.float64) @ torch.randn(3, 8, dtype=torch.float64)
    H += 0.1 * torch.randn(200, 8, dtype=torch.float64)
    top = torch.linalg.eigh(H.T @ H)[1][:, -3:]
    assert energy_outside_top(H, 3) == pytest.approx(energy_outside_range(H, top))
    other = torch.linalg.qr(torch.randn(8, 3, dtype=torch.float64))[0]
    assert energy_outside_top(H, 3) < energy_outside_range(H, other)  # no other 3-dim subspace keeps more
    assert energy_outside_top(H, 8) == pytest.approx(0, abs=1e-12)


def _damaged(src: str, dst, edit) -> str:
    ckpt = torch.load(os.path.join(src, "ckpt.pt"), weights_only=False)
    edit(ckpt)
    os.makedirs(dst)
    torch.save(ckpt, os.path.join(dst, "ckpt.pt"))
    return str(dst)


def _first_moment(ckpt: dict) -> dict:
    return next(iter(ckpt["optimizer_moments"]["moments"].values()))


STEERING_DAMAGE = {  # a record that steers a run, damaged: the words the one error line must hold
    "negative source_iter_num": (lambda c: c.update(source_iter_num=-5), "'source_iter_num' is -5"),
    "misshapen moment": (lambda c: _first_moment(c).update(exp_avg=torch.zeros(3, 3)),
                         "of shape (3, 3), not the weight's"),
    "negative second moment": (lambda c: _first_moment(c).update(exp_avg_sq=-_first_moment(c)["exp_avg_sq"].abs() - 1),
                               "non-finite or negative"),
    "NaN in the ramp": (lambda c: c["growth_ramp"]["null"].fill_(float("nan")), "'growth_ramp' lacks a finite"),
    "zero ramp length": (lambda c: c["growth_ramp"].update(iters=0), "iters > 0"),
}


@pytest.mark.parametrize("case", sorted(STEERING_DAMAGE))
def test_records_that_steer_training_are_checked_before_use(case, stage1, tmp_path, capsys):
    """Before: a negative position scheduled a negative learning rate (gradient ascent, exit 0), a misshapen moment
    crashed natively, a NaN ramp wrote NaN weights. Now each is one line naming the field, nothing written."""
    import importlib

    from lgpt.plumbing.cli import run_cli
    src = str(tmp_path / "grown")
    transform_checkpoint(TransformConfig(in_dir=stage1, out_dir=src, width=64, kind="orthogonal", n_head=4,
                                         mlp_hidden=256, carry_optimizer=True, eval_iters=0, grow_mask_iters=8,
                                         grow_reader_std=0.02))
    edit, words = STEERING_DAMAGE[case]
    bad = _damaged(src, tmp_path / "bad", edit)
    settings = [a for a in TINY_MODEL if not a.startswith(("--n_head", "--n_embd", "--n_layer"))]
    out = tmp_path / "ft"
    rc = run_cli(importlib.import_module("finetune").main, settings + [
        f"--in_dir={bad}", f"--out_dir={out}", "--max_iters=30", "--init_state=True"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and words in err[0], err
    assert not out.exists()
