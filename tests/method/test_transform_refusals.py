"""A transform that does not know it broke the model: the command refuses a result worse than a uniform guess, and
an approximate one where the options ask for the same function; a learned map that diverges ends at its start;
"exact" is recorded only when it is."""
import math
import os

import pytest
import torch

from conftest import spec
from lgpt.method.pipeline import transform_model
from lgpt.plumbing.checkpoint import load_checkpoint, save_checkpoint
from lgpt.plumbing.dataset import BatchLoader
from lgpt.plumbing.errors import TransformError
from test_transform import random_model
from transform import TransformConfig, transform_checkpoint


def saved(model, like: str, out) -> str:
    """``model`` as a checkpoint in ``out`` with the tokenizer of the checkpoint in ``like``."""
    meta = load_checkpoint(like)["meta"]
    save_checkpoint({"model": model.state_dict(), "model_args": model.config.to_dict(), "config": {},
                     "iter_num": 0, "best_val_loss": float("inf"), "optimizer": None, "meta": meta}, str(out))
    return str(out)


def test_a_result_worse_than_a_uniform_guess_is_refused_unless_allowed(trained_dir, char_data_dir, tmp_path,
                                                                       monkeypatch):
    """A transformed model whose val loss is above log V is refused with nothing written, unless
    --allow_broken=True. (The tiny char model's ports stay near uniform, so the evaluation of the result is made
    to report a broken model: what is tested is the command's rule, on its real path.)"""
    import transform
    uniform = math.log(load_checkpoint(trained_dir)["model_args"]["vocab_size"])
    real = transform.evaluate_loss
    monkeypatch.setattr(transform, "evaluate_loss",
                        lambda model, *a, **k: real(model, *a, **k) + (uniform if model.config.n_embd == 24 else 0))
    args = dict(in_dir=trained_dir, width=24, kind="pca", data_dir=char_data_dir, eval_iters=2)
    with pytest.raises(TransformError, match="above a uniform guess's log V.*nothing was written.*--allow_broken"):
        transform_checkpoint(TransformConfig(out_dir=str(tmp_path / "a"), **args))
    assert not os.path.exists(tmp_path / "a" / "ckpt.pt")
    record = transform_checkpoint(TransformConfig(out_dir=str(tmp_path / "b"), allow_broken=True, **args))
    assert record["val_loss_after"] > uniform and os.path.exists(tmp_path / "b" / "ckpt.pt")
    monkeypatch.setattr(transform, "evaluate_loss", lambda model, *a, **k: real(model, *a, **k) + uniform)
    record = transform_checkpoint(TransformConfig(out_dir=str(tmp_path / "c"), **args))  # the input was there too
    assert any("was already above log V" in note for note in record["notes"]) and (tmp_path / "c" / "ckpt.pt").exists()


def test_an_approximate_result_where_exact_was_asked_is_refused(char_data_dir, trained_dir, tmp_path):
    """Growing a peri-LN model with per-dimension output gains by an orthogonal map averages those gains (a real
    Gemma 3 went 6.0 → 294.6 with exit 0); zero padding (truncate) keeps them and stays exact."""
    model = random_model(0, norm_placement="peri", norm_type="rmsnorm", vocab_size=65, block_size=16)
    src = saved(model, trained_dir, tmp_path / "peri")
    with pytest.raises(TransformError, match="ask for the same function.*APPROXIMATE.*--allow_broken=True"):
        transform_checkpoint(TransformConfig(in_dir=src, out_dir=str(tmp_path / "a"), width=24, kind="orthogonal",
                                             data_dir=char_data_dir, eval_iters=0))
    assert not os.path.exists(tmp_path / "a" / "ckpt.pt")
    record = transform_checkpoint(TransformConfig(in_dir=src, out_dir=str(tmp_path / "b"), width=24, kind="truncate",
                                                  data_dir=char_data_dir, eval_iters=0))
    assert record["exact"]


def test_learning_at_the_same_width_is_not_recorded_exact(trained_dir, char_data_dir):
    from lgpt.plumbing.checkpoint import load_model
    model = load_model(trained_dir)[0]
    loader = BatchLoader(char_data_dir, 16, 4, "cpu")
    _, plain = transform_model(model, spec(32, kind="orthogonal"), loader)
    _, learned = transform_model(model, spec(32, kind="pca", learn_steps=2, learn_label_weight=0.5), loader)
    assert plain["exact"] and not learned["exact"]


def test_a_learned_map_that_diverges_ends_at_its_start(trained_dir, char_data_dir):
    """Adam at an absurd rate turns T into NaN; the map kept is the start (once a linear-algebra traceback)."""
    from lgpt.plumbing.checkpoint import load_model
    model = load_model(trained_dir)[0]
    loader = BatchLoader(char_data_dir, 16, 4, "cpu")
    start, _ = transform_model(model, spec(24, kind="pca", calib_batches=2), loader)
    new, record = transform_model(model, spec(24, kind="pca", calib_batches=2, learn_steps=2, learn_lr=1e300),
                                  loader)
    learned = record["corrections"]["learned_map"]
    assert learned["kept"] == "initial" and learned.get("diverged")
    idx = torch.randint(0, model.config.vocab_size, (2, 12))
    assert torch.allclose(new(idx, all_logits=True)[0], start(idx, all_logits=True)[0], atol=1e-6)


def test_weights_no_loader_takes_are_never_written_and_false_exact_claims_are_gone(trained_dir, char_data_dir,
                                                                                   tmp_path):
    """A huge --grow_noise made NaN weights with exit 0 and "exact: True" even with no evaluation; clone growth
    behind MSG masks halved the old units' outputs and was recorded exact; a tied head kept through growth was
    recorded exact though its final gain is fitted."""
    args = dict(in_dir=trained_dir, data_dir=char_data_dir, eval_iters=0)
    with pytest.raises(TransformError, match="the transformed model' holds .*nothing was written"):
        transform_checkpoint(TransformConfig(out_dir=str(tmp_path / "a"), width=64, grow_noise=1e308,
                                             allow_broken=True, **args))
    assert not os.path.exists(tmp_path / "a" / "ckpt.pt")
    with pytest.raises(TransformError, match="masking the clones halves those outputs"):
        transform_checkpoint(TransformConfig(out_dir=str(tmp_path / "b"), width=64, n_head=8, grow_mode="clone",
                                             grow_mask_iters=5, **args))
    model = random_model(0, head="tied", vocab_size=65, block_size=16)
    src = saved(model, trained_dir, tmp_path / "tied")
    with pytest.raises(TransformError, match="tie_head keeps a tied head tied through a shrink"):
        transform_checkpoint(TransformConfig(in_dir=src, out_dir=str(tmp_path / "c"), width=64, kind="truncate",
                                             tie_head=True, data_dir=char_data_dir, eval_iters=0))
    loader = BatchLoader(char_data_dir, 16, 4)
    _, record = transform_model(model, spec(model.config.n_embd, kind="orthogonal", tie_head=True, calib_batches=2),
                                loader)
    assert not record["exact"]  # the tie is fitted, even with nothing shrunk


@pytest.mark.parametrize("kind", ["truncate", "orthogonal"])
def test_growth_keeps_the_qk_norms_epsilon_so_exact_is_exact(kind):
    """The port rescales norm_eps by d/m for the residual norms; the q/k norms (per head, over head_dim) once shared
    it, so a qk-norm model grown 'exactly' moved by 1e-3 in log-probability. They keep their own ε now."""
    model = random_model(0, norm_type="rmsnorm", pos="rope", qk_norm=True, bias=False, norm_eps=1e-2)
    idx = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(0))
    grown, record = transform_model(model, spec(48, kind=kind))
    assert record["exact"] and grown.config.qk_norm_eps == 1e-2 and grown.config.norm_eps == pytest.approx(1e-2 / 3)
    with torch.no_grad():
        torch.testing.assert_close(torch.log_softmax(grown(idx)[0], -1), torch.log_softmax(model(idx)[0], -1),
                                   rtol=0, atol=1e-5)
