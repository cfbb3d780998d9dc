"""The GPU path without a GPU: every entry point run with device='cuda' under ``fake_cuda`` (tests/fake_cuda.py),
which raises wherever an operation mixes a CUDA tensor with a CPU one, as CUDA does. What it cannot see is in
fake_cuda's docstring; the README's "GPU" section says what ran on a real GPU."""
import json
import os

import pytest
import torch

from conftest import TINY_MODEL, spec
from fake_cuda import DeviceMixError, fake_cuda
from lgpt.plumbing.configurator import load_config

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
    ["--kind=pca", "--width=24", "--learn_steps=2", "--pca_keep=3", "--pca_exclude=5"],  # held coordinates
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
    record = transform(tmp_path / "a", tmp_path / "t", f"--kind={kind}", "--width=24", "--porting=paper_code",
                       "--allow_broken=True")  # 2 training steps: the paper's rule can end just above log V
    assert torch.isfinite(torch.tensor(record["val_loss_after"]))


def test_transform_on_cuda_gives_the_cpu_result(trained_dir, tmp_path):
    from lgpt.plumbing.checkpoint import load_checkpoint
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


# ----------------------------------------------------------------------------------------------
# compile and autocast on the CPU; the compile cache across models; streamed logits; devices


def test_bfloat16_autocast_and_compile_train_on_the_cpu(char_data_dir, tmp_path):
    from lgpt.plumbing.checkpoint import load_checkpoint
    from train import TrainConfig, setup_runtime, train
    args = TINY_MODEL + [f"--data_dir={char_data_dir}", "--max_iters=3", "--eval_interval=3", "--device=cpu"]
    cfg = load_config(TrainConfig, args + [f"--out_dir={tmp_path / 'bf16'}", "--dtype=bfloat16"])
    with setup_runtime(cfg.device, cfg.dtype, cfg.peak_tflops).autocast():
        assert torch.nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.bfloat16  # autocast is really on
    summary = train(cfg)
    assert summary["val_loss"] < 4 and load_checkpoint(str(tmp_path / "bf16"))["model"]["lm_head.weight"].dtype \
        == torch.float32  # weights stay float32 under autocast
    compiled = train(load_config(TrainConfig, [a for a in args if a != "--compile=False"] + [
        f"--out_dir={tmp_path / 'compiled'}", "--compile=True", "--compile_backend=aot_eager"]))
    eager = train(load_config(TrainConfig, args + [f"--out_dir={tmp_path / 'eager'}"]))
    assert abs(compiled["val_loss"] - eager["val_loss"]) < 1e-4


def test_the_fifth_architecture_in_one_process_is_still_compiled(char_data_dir, tmp_path, monkeypatch):
    """train() resets dynamo's caches before it compiles, so the recompile limit never turns a later model eager."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from train import TrainConfig, train
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 2)  # reached by the 2nd model without the reset
    base = [a for a in TINY_MODEL if a not in ("--compile=False", "--n_embd=32")]
    for i, width in enumerate((16, 24, 32, 40, 48)):
        before = counters["stats"]["unique_graphs"]
        train(load_config(TrainConfig, base + [f"--data_dir={char_data_dir}", f"--out_dir={tmp_path / str(i)}",
                                               f"--n_embd={width}", "--max_iters=2", "--eval_interval=2",
                                               "--compile=True", "--compile_backend=aot_eager", "--device=cpu"]))
        assert counters["stats"]["unique_graphs"] > before, f"model {i + 1} (n_embd={width}) ran uncompiled"


def test_streamed_logits_give_the_unstreamed_numbers(trained_dir, tmp_path):
    import eval_geometry as eg
    from lgpt.plumbing.checkpoint import load_model
    from lgpt.plumbing.dataset import BatchLoader, data_dir_for_checkpoint, eval_batches, evaluate_loss
    model, ckpt = load_model(trained_dir)
    loader = BatchLoader(data_dir_for_checkpoint(ckpt), model.config.block_size, 4)
    x, _ = loader.get_batch("val", seed=3)
    hidden = model(x, features=True)[1]
    small = 5 * model.config.vocab_size  # 5 positions of logits at a time
    whole, streamed = eg.logit_lens(model, hidden, x), eg.logit_lens(model, hidden, x, budget=small)
    for key in whole:
        torch.testing.assert_close(torch.tensor(streamed[key]), torch.tensor(whole[key]), rtol=1e-6, atol=0)
    batches = list(eval_batches(loader, "val", 3, 0))
    torch.testing.assert_close(torch.tensor(list(eg.kl_and_agreement(model, model, batches, budget=small).values())),
                               torch.tensor([0.0, 1.0]), atol=1e-6, rtol=0)
    from lgpt.plumbing import dataset
    reference = evaluate_loss(model, loader, "val", 3)
    original = dataset.LOGITS_BUDGET
    try:
        dataset.LOGITS_BUDGET = small
        assert evaluate_loss(model, loader, "val", 3) == pytest.approx(reference, rel=1e-6)
    finally:
        dataset.LOGITS_BUDGET = original


def test_peak_flops_come_from_the_device_table(monkeypatch):
    from lgpt.plumbing.devices import peak_flops
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    assert peak_flops("cuda", torch.bfloat16) == 989e12 and peak_flops("cuda", torch.float32) == 494.5e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 PCIe")
    assert peak_flops("cuda:0", torch.bfloat16) == 756e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100-SXM4-80GB")
    assert peak_flops("cuda", torch.bfloat16) == 312e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Some Future GPU")
    assert peak_flops("cuda", torch.bfloat16) is None and peak_flops("cuda", torch.bfloat16, 100.0) == 100e12
    assert peak_flops("cpu", torch.float32) is None


def test_a_cuda_index_beyond_the_machine_is_one_clear_error(monkeypatch):
    from lgpt.plumbing.devices import resolve_device
    from lgpt.plumbing.errors import ConfigError
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda:0") == "cuda:0" and resolve_device("auto") == "cuda"
    with pytest.raises(ConfigError, match=r"has 1 CUDA device\(s\)"):
        resolve_device("cuda:1")


@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_the_runtime_accepts_cuda_with_and_without_an_index(char_data_dir, tmp_path, device):
    from train import TrainConfig, setup_runtime
    with fake_cuda():
        cfg = load_config(TrainConfig, TINY_MODEL + [f"--data_dir={char_data_dir}", f"--out_dir={tmp_path}",
                                                      f"--device={device}"])
        rt = setup_runtime(cfg.device, cfg.dtype, cfg.peak_tflops)
    assert rt.device == device and rt.ptdtype == torch.bfloat16


def test_an_explicit_compile_on_the_cpu_says_it_does_not_apply(char_data_dir, tmp_path, capsys):
    from train import TrainConfig, train
    args = [a for a in TINY_MODEL if a != "--compile=False"] + [f"--data_dir={char_data_dir}", "--max_iters=1",
                                                                "--eval_interval=1", "--device=cpu"]
    train(load_config(TrainConfig, args + [f"--out_dir={tmp_path / 'default'}"]))
    assert "compile applies on CUDA" not in capsys.readouterr().out  # the default stays quiet
    train(load_config(TrainConfig, args + [f"--out_dir={tmp_path / 'asked'}", "--compile=True"]))
    assert "compile applies on CUDA" in capsys.readouterr().out


@pytest.mark.parametrize("target", ["head", "original"])
def test_a_tied_head_is_tied_back_on_cuda(char_data_dir, target):
    """--tie_head with --tie_keep, a refit and each --retie_target, on a tied model that lives on the GPU."""
    from lgpt.method.pipeline import transform_model
    from lgpt.plumbing.dataset import BatchLoader
    from test_transform import random_model
    model = random_model(5, head="tied", norm_type="rmsnorm", vocab_size=65, block_size=16, n_embd=24, n_head=4)
    with fake_cuda() as mode:
        model = model.to("cuda")
        loader = BatchLoader(char_data_dir, 16, 4, "cuda")
        tied, record = transform_model(model, spec(16, kind="pca", calib_batches=2, tie_head=True, tie_keep=2,
                                                   refit="readers", retie_target=target), loader)
        assert tied.lm_head.weight is tied.transformer.wte.weight and tied.lm_head.weight.device.type == "cuda"
    assert not mode.mixes
    assert record["corrections"]["tied_head"]["relative_logit_residual"] < 1
