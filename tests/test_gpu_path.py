"""The GPU path without a GPU: every entry point run with device='cuda' under ``fake_cuda`` (tests/fake_cuda.py),
which raises wherever an operation mixes a CUDA tensor with a CPU one, as CUDA does. What it cannot see is in
fake_cuda's docstring; the README's "GPU" section says what ran on a real GPU."""
import json
import os

import pytest
import torch
from fake_cuda import DeviceMixError, fake_cuda

from configurator import load_config
from conftest import TINY_MODEL

FINETUNE = ["--batch_size=4", "--eval_iters=2", "--log_interval=1", "--warmup_iters=2", "--progress_bar=False",
            "--compile=False"]  # TINY_MODEL's run settings: the architecture comes from the checkpoint


def test_the_checker_catches_a_mixed_operation_and_numpy_on_cuda():
    with fake_cuda():
        w = torch.nn.Linear(4, 4).to("cuda")
        assert w.weight.device.type == "cuda" and torch.zeros(2, device=w.weight.device).device.type == "cuda"
        with pytest.raises(DeviceMixError):
            w(torch.randn(2, 4))  # a CPU input meets CUDA weights
        with pytest.raises(TypeError, match="cuda"):
            w.weight.detach().numpy()
        w(torch.randn(2, 4).to("cuda")).sum().backward()  # autograd works on tagged tensors
        assert w.weight.grad.device.type == "cuda" and w.weight.grad.cpu().numpy().shape == (4, 4)


def transform(src, out, *args):
    from transform import TransformConfig, transform_checkpoint
    with fake_cuda() as mode:
        record = transform_checkpoint(load_config(TransformConfig, [f"--in_dir={src}", f"--out_dir={out}",
                                                                    "--device=cuda", "--calib_batches=2",
                                                                    "--eval_iters=2", *args]))
    assert not mode.mixes
    return record


@pytest.mark.parametrize("args", [
    *[[f"--kind={k}", "--width=24"] for k in ("gaussian", "rademacher", "sparse", "srht", "orthogonal", "pca",
                                            "truncate")],
    ["--kind=orthogonal", "--width=48", "--grow_noise=0.1"],
    ["--kind=orthogonal", "--width=48", "--n_head=4", "--mlp_hidden=256", "--grow_mode=clone",
     "--clone_noise=0.01"],
    ["--kind=orthogonal", "--width=48", "--n_head=3", "--grow_mode=zero"],
    ["--kind=gaussian", "--width=24", "--porting=sandwich", "--restore_attn_scale=True"],
    ["--kind=pca", "--width=24", "--refit=all"],
    ["--kind=pca", "--width=24", "--refit=gains"],
    ["--kind=pca", "--width=24", "--learn_steps=3", "--refit=readers"],
    ["--kind=orthogonal", "--width=32", "--norms=scalar"],
], ids=lambda a: "_".join(x.split("=")[1] for x in a))
def test_transform_runs_on_cuda(trained_dir, tmp_path, args):
    record = transform(trained_dir, tmp_path / "t", *args)
    assert record["T"].device.type == "cpu"  # records are device-neutral
    assert torch.isfinite(torch.tensor(record["val_loss_after"]))


@pytest.mark.parametrize("kind", ["gaussian", "orthogonal"])
def test_paper_code_transform_runs_on_cuda(char_data_dir, tmp_path, kind):
    from train import TrainConfig, train  # n_embd 40 ≠ the vocabulary (32): the paper's code maps axes by shape
    train(load_config(TrainConfig, TINY_MODEL + [f"--data_dir={char_data_dir}", f"--out_dir={tmp_path / 'a'}",
                                                 "--n_embd=40", "--max_iters=2", "--eval_interval=2"]))
    record = transform(tmp_path / "a", tmp_path / "t", f"--kind={kind}", "--width=24", "--porting=paper_code")
    assert torch.isfinite(torch.tensor(record["val_loss_after"]))


def test_transform_on_cuda_gives_the_cpu_result(trained_dir, tmp_path):
    from checkpoint import load_checkpoint
    from transform import TransformConfig, transform_checkpoint
    args = ["--kind=pca", "--width=24", "--refit=all", "--learn_steps=2", "--calib_batches=2", "--eval_iters=0"]
    transform(trained_dir, tmp_path / "gpu", *args)
    transform_checkpoint(load_config(TransformConfig, [f"--in_dir={trained_dir}", f"--out_dir={tmp_path / 'cpu'}",
                                                       *args]))
    gpu, cpu = load_checkpoint(str(tmp_path / "gpu")), load_checkpoint(str(tmp_path / "cpu"))
    for name, value in cpu["model"].items():
        torch.testing.assert_close(gpu["model"][name], value, rtol=0, atol=0)


def test_carried_optimizer_on_cuda_continues_on_cuda(char_data_dir, tmp_path):
    from finetune import FinetuneConfig, finetune
    from train import TrainConfig, train
    train(load_config(TrainConfig, TINY_MODEL + [f"--data_dir={char_data_dir}", f"--out_dir={tmp_path / 'a'}",
                                                 "--max_iters=6", "--eval_interval=6"]))
    transform(tmp_path / "a", tmp_path / "g", "--kind=orthogonal", "--width=48", "--carry_optimizer=True")
    with fake_cuda() as mode:
        finetune(load_config(FinetuneConfig, FINETUNE + [f"--in_dir={tmp_path / 'g'}", f"--out_dir={tmp_path / 'f'}",
                                                           "--device=cuda", "--init_state=True", "--max_iters=9",
                                                           "--eval_interval=3", "--dtype=float32"]))
    assert not mode.mixes


def test_eval_geometry_runs_on_cuda(trained_dir, tmp_path):
    from eval_geometry import GeometryConfig, evaluate_geometry
    transform(trained_dir, tmp_path / "t", "--kind=gaussian", "--width=24")
    with fake_cuda() as mode:
        metrics = evaluate_geometry(load_config(GeometryConfig, [
            f"--ref_dir={trained_dir}", f"--in_dir={tmp_path / 't'}", f"--out_dir={tmp_path / 'geom'}",
            "--device=cuda", "--wandb_log=False", "--n_probes=256", "--eval_iters=2", "--prompt=the king"]))
    assert not mode.mixes
    assert set(metrics["figures"]) >= {"norm_heatmap", "layers", "cosine_heatmaps", "concordance"}


@pytest.mark.parametrize("distill", [False, True])
def test_finetune_runs_on_cuda_with_the_reference_on_cuda(trained_dir, tmp_path, distill):
    from finetune import FinetuneConfig, finetune
    transform(trained_dir, tmp_path / "t", "--kind=pca", "--width=24")
    with fake_cuda() as mode:
        summary = finetune(load_config(FinetuneConfig, FINETUNE + [
            f"--in_dir={tmp_path / 't'}", f"--out_dir={tmp_path / 'ft'}", "--device=cuda", "--max_iters=4",
            "--eval_interval=2", f"--distill={distill}", "--distill_chunk=7"]))
    assert not mode.mixes
    assert summary["reference_val_loss"] is not None
    with open(tmp_path / "ft" / "finetune.json") as f:
        assert json.load(f)["config"]["device"] == "cuda"


def test_sample_runs_on_cuda(trained_dir):
    from sample import SampleConfig, sample
    with fake_cuda() as mode:
        texts = sample(load_config(SampleConfig, [f"--out_dir={trained_dir}", "--device=cuda", "--num_samples=1",
                                                  "--max_new_tokens=5", "--start=the"]))
    assert not mode.mixes and len(texts) == 1


def test_train_and_resume_run_on_cuda(char_data_dir, tmp_path):
    from train import TrainConfig, train
    args = TINY_MODEL + [f"--data_dir={char_data_dir}", f"--out_dir={tmp_path}", "--device=cuda",
                         "--eval_interval=2"]
    with fake_cuda() as mode:
        train(load_config(TrainConfig, args + ["--max_iters=2"]))
        summary = train(load_config(TrainConfig, args + ["--max_iters=4", "--init_from=resume"]))
    assert not mode.mixes and summary["iter_num"] == 4
    assert os.path.exists(tmp_path / "ckpt.pt")
