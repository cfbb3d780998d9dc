"""Distillation (distill.py, finetune.py --distill): the formula against a naive version, chunking, the teacher's
checks, exact resume and DDP."""
import json
import os
import pickle
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import ROOT, TINY_MODEL
from finetune import FinetuneConfig, finetune
from lgpt.method.distill import chunked_distillation, distillation_terms, hidden_state_loss, teacher_kl
from lgpt.plumbing.checkpoint import load_model
from lgpt.plumbing.configurator import load_config
from lgpt.plumbing.errors import ConfigError
from lgpt.plumbing.logger import read_metrics
from transform import TransformConfig, transform_checkpoint

FT = [a for a in TINY_MODEL if a.split("=")[0] in ("--batch_size", "--eval_iters", "--progress_bar", "--log_interval")]


def test_distillation_terms_match_the_formula():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(6, 9, generator=g), torch.randn(6, 9, generator=g)
    y = torch.randint(0, 9, (6,), generator=g)
    for tau in (1.0, 2.0, 0.5):
        kl, ce = distillation_terms(s, t, y, tau)
        p = torch.softmax(t / tau, -1)
        naive = sum((p[i] * (p[i].log() - torch.log_softmax(s[i] / tau, -1))).sum() for i in range(6)) * tau ** 2
        assert kl.item() == pytest.approx(naive.item(), rel=1e-5)
        assert ce.item() == pytest.approx(F.cross_entropy(s, y, reduction="sum").item(), rel=1e-6)


def test_student_equal_to_teacher_has_zero_kl_and_zero_kl_gradient(trained_dir):
    student, _ = load_model(trained_dir)
    teacher, _ = load_model(trained_dir)
    x = torch.randint(0, student.config.vocab_size, (2, 16))
    h_s, _ = student(x, features=True)
    with torch.no_grad():
        h_t, _ = teacher(x, features=True)
    kl, _ = chunked_distillation(student, teacher, h_s, h_t, x, 1.0, chunk=7)
    kl.backward()
    assert kl.item() == 0
    assert all(p.grad is None or not p.grad.any() for p in student.parameters())  # exactly: see teacher_kl


def test_the_kl_gradient_is_the_naive_formulas_and_exactly_zero_at_the_teacher():
    """teacher_kl's gradient τ·(p_s − p_t) against autograd through the naive formula (float64); autograd
    through log_softmax leaves a ~1e-8 gradient at s = t in float32 (Σp_t ≠ 1 in rounding), teacher_kl none."""
    g = torch.Generator().manual_seed(2)
    for tau in (1.0, 2.0, 0.5):
        s = torch.randn(5, 11, generator=g, dtype=torch.float64, requires_grad=True)
        t = torch.randn(5, 11, generator=g, dtype=torch.float64)
        (ours,) = torch.autograd.grad(teacher_kl(s, t, tau) * 1.7, s)
        p = torch.softmax(t / tau, -1)
        naive = (p * (p.log() - torch.log_softmax(s / tau, -1))).sum() * tau ** 2 * 1.7
        (reference,) = torch.autograd.grad(naive, s)
        torch.testing.assert_close(ours, reference, rtol=1e-10, atol=1e-12)
    s = torch.randn(64, 50_000, generator=g) * 3
    student = s.clone().requires_grad_(True)
    (exact,) = torch.autograd.grad(teacher_kl(student, s, 1.0), student)
    assert not exact.any()
    student = s.clone().requires_grad_(True)
    p = torch.softmax(s, -1)
    (rounded,) = torch.autograd.grad((p * (p.log() - torch.log_softmax(student, -1))).sum(), student)
    assert rounded.any()  # what the autograd formula did: not zero


def test_a_model_distilled_from_itself_is_left_exactly_as_it_was(trained_dir, tmp_path):
    """The control of a distilled run is the untransformed model distilled from its own teacher: with a zero
    gradient AdamW (no weight decay) takes no step, so it stays the original bit for bit, at any learning rate."""
    out = tmp_path / "self"
    finetune(load_config(FinetuneConfig, FT + [f"--in_dir={trained_dir}", f"--out_dir={out}", "--max_iters=10",
                                               "--eval_interval=5", "--distill=True", f"--teacher_dir={trained_dir}",
                                               "--learning_rate=1e-2", "--always_save_checkpoint=True"]))
    before, _ = load_model(trained_dir)
    after, _ = load_model(str(out))
    assert all(torch.equal(a, b) for a, b in zip(before.state_dict().values(), after.state_dict().values()))


def test_chunked_loss_and_gradients_equal_the_unchunked_ones(trained_dir):
    results = []
    for chunk in (5, 10_000):
        student, _ = load_model(trained_dir)
        teacher, _ = load_model(trained_dir)
        with torch.no_grad():
            teacher.lm_head.weight.mul_(1.5)  # a teacher that differs
        x = torch.randint(0, student.config.vocab_size, (3, 16), generator=torch.Generator().manual_seed(1))
        h_s, _ = student(x, features=True)
        with torch.no_grad():
            h_t, _ = teacher(x, features=True)
        kl, ce = chunked_distillation(student, teacher, h_s, h_t, x, 2.0, chunk=chunk)
        (0.3 * kl + 0.7 * ce).backward()
        results.append((kl.item(), ce.item(), student.transformer.h[0].mlp.c_fc.weight.grad.clone()))
    (kl_a, ce_a, g_a), (kl_b, ce_b, g_b) = results
    assert kl_a == pytest.approx(kl_b, rel=1e-5) and ce_a == pytest.approx(ce_b, rel=1e-5)
    torch.testing.assert_close(g_a, g_b, atol=1e-6, rtol=1e-4)


@pytest.fixture
def shrunk(trained_dir, char_data_dir, tmp_path):
    transform_checkpoint(TransformConfig(in_dir=trained_dir, out_dir=str(tmp_path / "t"), width=24, kind="pca",
                                         data_dir=char_data_dir, eval_iters=0))
    return str(tmp_path / "t")


def test_distillation_finetunes_from_the_recorded_source_and_logs_both_terms(shrunk, trained_dir, tmp_path):
    summary = finetune(load_config(FinetuneConfig, FT + [f"--in_dir={shrunk}", f"--out_dir={tmp_path / 'kd'}",
                                                         "--max_iters=20", "--eval_interval=10", "--distill=True",
                                                         "--distill_alpha=0.5", "--learning_rate=1e-3"]))
    assert summary["curve"][-1][1] < summary["curve"][0][1]
    saved = json.load(open(tmp_path / "kd" / "finetune.json"))
    assert saved["config"]["distill"] is True
    records = read_metrics(os.path.join(tmp_path, "kd", "metrics.jsonl"))
    assert any("train/kd_loss" in r and "train/lm_loss" in r for r in records)


def test_distillation_resumes_exactly(shrunk, tmp_path):
    common = FT + [f"--in_dir={shrunk}", "--eval_interval=5", "--lr_decay_iters=12", "--distill=True",
                   "--distill_alpha=0.7", "--distill_temperature=2.0", "--log_interval=1"]
    finetune(load_config(FinetuneConfig, common + [f"--out_dir={tmp_path / 'a'}", "--max_iters=12"]))
    finetune(load_config(FinetuneConfig, common + [f"--out_dir={tmp_path / 'b'}", "--max_iters=5"]))
    finetune(load_config(FinetuneConfig, common + [f"--out_dir={tmp_path / 'b'}", "--max_iters=12",
                                                   "--init_from=resume"]))

    def losses(d):
        return {r["iter"]: r["train/kd_loss"] for r in read_metrics(os.path.join(tmp_path, d, "metrics.jsonl"))
                if "train/kd_loss" in r}

    assert losses("a") == losses("b") and sorted(losses("a")) == list(range(12))


def test_a_missing_or_mismatched_teacher_is_one_clear_error(shrunk, trained_dir, char_data_dir, tmp_path):
    with pytest.raises(ConfigError, match="needs a teacher"):
        finetune(load_config(FinetuneConfig, FT + [f"--in_dir={trained_dir}", f"--out_dir={tmp_path / 'x'}",
                                                   "--distill=True", "--max_iters=2"]))
    other = tmp_path / "other"
    shutil.copytree(trained_dir, other)
    ckpt = torch.load(other / "ckpt.pt", weights_only=False)
    stoi = {k + "_": v for k, v in ckpt["meta"]["stoi"].items()}  # another alphabet, both tables consistent
    meta = dict(ckpt["meta"], stoi=stoi, itos={v: k for k, v in stoi.items()})
    ckpt["meta"] = meta
    torch.save(ckpt, other / "ckpt.pt")
    with open(other / "meta.pkl", "wb") as f:
        pickle.dump(meta, f)
    with pytest.raises(ConfigError, match="another tokenizer or vocabulary"):
        finetune(load_config(FinetuneConfig, FT + [f"--in_dir={shrunk}", f"--out_dir={tmp_path / 'y'}",
                                                   "--distill=True", f"--teacher_dir={other}", "--max_iters=2"]))
    assert not (tmp_path / "y").exists()
    with pytest.raises(ConfigError, match="distill is off"):
        load_config(FinetuneConfig, [f"--in_dir={shrunk}", "--out_dir=z", f"--teacher_dir={trained_dir}"])
    with pytest.raises(ConfigError, match="distill_alpha must lie in"):
        load_config(FinetuneConfig, [f"--in_dir={shrunk}", "--out_dir=z", "--distill_alpha=1.5"])


def test_the_hidden_state_term_matches_the_formula_and_is_exactly_zero_at_the_teacher():
    g = torch.Generator().manual_seed(3)
    L, B, n, d, m = 3, 2, 5, 7, 4
    teacher = [torch.randn(B, n, d, generator=g) for _ in range(L + 1)]
    student = [torch.randn(B, n, m, generator=g) for _ in range(L + 1)]
    T = torch.randn(m, d, generator=g)
    naive = 0.0
    for layer in range(1, L + 1):  # the embedding (layer 0) is not a term
        for b in range(B):
            for i in range(n):
                target = T @ teacher[layer][b, i]
                naive += ((student[layer][b, i] - target).norm() ** 2 / target.norm() ** 2).item() / (B * n * L)
    assert hidden_state_loss(student, teacher, T).item() == pytest.approx(naive, rel=1e-5)
    student[0] = student[0] * 100
    assert hidden_state_loss(student, teacher, T).item() == pytest.approx(naive, rel=1e-5)
    same = [h.clone().requires_grad_(True) for h in teacher]
    value = hidden_state_loss(same, teacher, None)
    value.backward()
    assert value.item() == 0 and all(h.grad is None or not h.grad.any() for h in same)


def test_the_hidden_state_term_is_relative_per_token_so_a_sink_does_not_dominate():
    teacher = [torch.zeros(1, 2, 3), torch.tensor([[[1e4, 0.0, 0.0], [0.0, 1.0, 0.0]]])]
    off_sink = [teacher[0], teacher[1] + torch.tensor([[[0.0, 0.0, 0.0], [0.0, 0.0, 1.0]]])]
    off_sink_by_as_much = [teacher[0], teacher[1] + torch.tensor([[[0.0, 0.0, 1e4], [0.0, 0.0, 0.0]]])]
    assert hidden_state_loss(off_sink, teacher, None).item() == pytest.approx(0.5)
    assert hidden_state_loss(off_sink_by_as_much, teacher, None).item() == pytest.approx(0.5)


def test_hidden_state_distillation_uses_the_transforms_map_and_leaves_a_control_exactly_as_it_was(
        trained_dir, char_data_dir, tmp_path):
    """The term is the shrunk model's error against T·h_teacher (below 1 at the start: the port applies T to every
    state), falls as it trains, and the original distilled from itself with it stays the original bit for bit."""
    rough = tmp_path / "rough"  # a JL map: far from lossless, so there is something to learn
    with pytest.warns(UserWarning, match="JL minimum width"):  # below the JL bound on purpose
        transform_checkpoint(TransformConfig(in_dir=trained_dir, out_dir=str(rough), width=16, kind="gaussian",
                                             data_dir=char_data_dir, eval_iters=0))
    finetune(load_config(FinetuneConfig, FT + [f"--in_dir={rough}", f"--out_dir={tmp_path / 'kd'}",
                                               "--max_iters=30", "--eval_interval=15", "--distill=True",
                                               "--distill_hidden=1.0", "--learning_rate=3e-3", "--log_interval=1"]))
    hidden = [r["train/hidden_loss"] for r in read_metrics(os.path.join(tmp_path, "kd", "metrics.jsonl"))
              if "train/hidden_loss" in r]
    assert len(hidden) == 30 and 0 < hidden[0] < 1
    assert sum(hidden[-5:]) < 0.8 * sum(hidden[:5])
    out = tmp_path / "self"
    finetune(load_config(FinetuneConfig, FT + [f"--in_dir={trained_dir}", f"--out_dir={out}", "--max_iters=6",
                                               "--eval_interval=3", "--distill=True", f"--teacher_dir={trained_dir}",
                                               "--distill_hidden=1.0", "--learning_rate=1e-2",
                                               "--always_save_checkpoint=True"]))
    before, _ = load_model(trained_dir)
    after, _ = load_model(str(out))
    assert all(torch.equal(a, b) for a, b in zip(before.state_dict().values(), after.state_dict().values()))


def test_hidden_state_distillation_refuses_what_has_no_single_map(shrunk, trained_dir, char_data_dir, tmp_path):
    with pytest.raises(ConfigError, match="distill_hidden must be >= 0"):
        load_config(FinetuneConfig, [f"--in_dir={shrunk}", "--out_dir=z", "--distill=True", "--distill_hidden=-1"])
    with pytest.raises(ConfigError, match="distill is off"):
        load_config(FinetuneConfig, [f"--in_dir={shrunk}", "--out_dir=z", "--distill_hidden=1"])
    per_block = tmp_path / "pb"
    transform_checkpoint(TransformConfig(in_dir=trained_dir, out_dir=str(per_block), width=24, kind="pca",
                                         porting="per_block", data_dir=char_data_dir, eval_iters=0))
    args = FT + ["--distill=True", "--distill_hidden=1", "--max_iters=2"]
    with pytest.raises(ConfigError, match="map per site"):
        finetune(load_config(FinetuneConfig, args + [f"--in_dir={per_block}", f"--out_dir={tmp_path / 'a'}"]))
    with pytest.raises(ConfigError, match="records no transform T"):
        finetune(load_config(FinetuneConfig, args + [f"--in_dir={trained_dir}", f"--out_dir={tmp_path / 'b'}",
                                                     f"--teacher_dir={shrunk}"]))  # a narrower teacher, no T
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.slow
def test_distillation_runs_under_ddp_with_two_gloo_processes(shrunk, tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(ROOT, "finetune.py"), *FT, "--device=cpu", "--compile=False", "--dtype=float32",
           f"--in_dir={shrunk}", f"--out_dir={tmp_path / 'ddp'}", "--max_iters=6", "--eval_interval=3",
           "--distill=True", "--distill_alpha=0.5"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("RANK", None)
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert json.load(open(tmp_path / "ddp" / "finetune.json"))["iter_num"] == 6


def test_a_teacher_of_shorter_context_or_depth_is_named_before_the_first_step(trained_dir, char_data_dir, tmp_path):
    """A teacher that reads fewer positions than the student trains on, or hidden-state matching between models of
    different depth, once crashed at the first step; each is one ConfigError before anything is written."""
    short = tmp_path / "short"
    shutil.copytree(trained_dir, short)
    ckpt = torch.load(short / "ckpt.pt", weights_only=False)
    ckpt["model_args"]["block_size"] = 8
    ckpt["model"] = {k: (v[:8] if k.endswith("wpe.weight") else v) for k, v in ckpt["model"].items()}
    torch.save(ckpt, short / "ckpt.pt")
    args = FT + ["--distill=True", "--max_iters=2", f"--in_dir={trained_dir}"]
    with pytest.raises(ConfigError, match="reads at most 8 positions.*--block_size=8"):
        finetune(load_config(FinetuneConfig, args + [f"--out_dir={tmp_path / 'a'}", f"--teacher_dir={short}"]))
    deep = tmp_path / "deep"
    transform_checkpoint(TransformConfig(in_dir=trained_dir, out_dir=str(deep), width=32, n_layer=4,
                                         data_dir=char_data_dir, eval_iters=0))
    with pytest.raises(ConfigError, match="student has 4 blocks and the teacher 2"):
        finetune(load_config(FinetuneConfig, FT + ["--distill=True", "--distill_hidden=1", "--max_iters=2",
                                                   f"--in_dir={deep}", f"--out_dir={tmp_path / 'b'}"]))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
