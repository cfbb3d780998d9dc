"""transform.py --calib_bos: calibration windows read BOS first (a model trained with it, Gemma, computes other
states there); a checkpoint with no BOS token is refused before anything is written."""
import os

import pytest
import torch

from lgpt.plumbing.checkpoint import load_checkpoint, save_checkpoint
from lgpt.plumbing.dataset import BatchLoader, BosFirstLoader
from lgpt.plumbing.errors import ConfigError
from transform import TransformConfig, transform_checkpoint


def test_bos_first_windows_are_the_same_text_one_token_later(char_data_dir):
    loader = BatchLoader(char_data_dir, 16, 4)
    x, y = loader.get_batch("train", seed=3)
    bx, by = BosFirstLoader(loader, 7).get_batch("train", seed=3)
    assert (bx[:, 0] == 7).all() and torch.equal(bx[:, 1:], x[:, :-1]) and torch.equal(by, x)
    assert BosFirstLoader(loader, 7).batch_size == 4  # everything else is the loader's


def test_a_checkpoint_without_bos_is_refused_and_nothing_is_written(trained_dir, char_data_dir, tmp_path):
    with pytest.raises(ConfigError, match="calib_bos=True needs a BOS token.*records none.*drop --calib_bos"):
        transform_checkpoint(TransformConfig(in_dir=trained_dir, out_dir=str(tmp_path / "a"), width=24, kind="pca",
                                             data_dir=char_data_dir, eval_iters=0, calib_bos=True))
    assert not os.path.exists(tmp_path / "a")


def test_calibration_reads_the_bos_first_windows(trained_dir, char_data_dir, tmp_path):
    ckpt = load_checkpoint(trained_dir)
    ckpt["meta"] = dict(ckpt["meta"], special_ids={"bos_token_id": 0})
    save_checkpoint(ckpt, str(tmp_path / "src"))
    args = dict(in_dir=str(tmp_path / "src"), width=24, kind="pca", data_dir=char_data_dir, eval_iters=0,
                allow_broken=True)
    plain = transform_checkpoint(TransformConfig(out_dir=str(tmp_path / "a"), **args))
    first = transform_checkpoint(TransformConfig(out_dir=str(tmp_path / "b"), calib_bos=True, **args))
    assert not torch.allclose(plain["T"], first["T"])  # other states calibrated the map
    assert any("calibration windows started with BOS (token 0)" in note for note in first["notes"])
    # and they are exactly the BOS-first windows: the pipeline on BosFirstLoader gives the same T
    from lgpt.method.pipeline import transform_model
    from lgpt.plumbing.checkpoint import model_from_checkpoint
    from transform import spec_from_config
    cfg = TransformConfig(out_dir=str(tmp_path / "c"), calib_bos=True, **args)
    model = model_from_checkpoint(load_checkpoint(str(tmp_path / "src"))).eval()
    _, record = transform_model(model, spec_from_config(cfg), BosFirstLoader(
        BatchLoader(char_data_dir, model.config.block_size, cfg.calib_batch_size), 0))
    assert torch.equal(record["T"], first["T"])
