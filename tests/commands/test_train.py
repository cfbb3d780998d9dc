import glob
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import ROOT, TINY_MODEL
from lgpt.plumbing.checkpoint import load_checkpoint, model_from_checkpoint
from lgpt.plumbing.configurator import load_config
from lgpt.plumbing.logger import read_metrics
from model import GPT, GPTConfig
from train import TrainConfig, TrainingDiverged, get_lr, train


def run(data_dir, out_dir, *extra):
    cfg = load_config(TrainConfig, TINY_MODEL + [f"--data_dir={data_dir}", f"--out_dir={out_dir}", *extra])
    return train(cfg)


def test_checkpoint_contract_and_round_trip(char_data_dir, tmp_path):
    run(char_data_dir, tmp_path, "--max_iters=6", "--eval_interval=3")
    ckpt = load_checkpoint(str(tmp_path))
    for key in ("model", "model_args", "config", "iter_num", "best_val_loss", "optimizer", "rng", "meta"):
        assert key in ckpt
    assert ckpt["iter_num"] == 6 and not any(k.startswith("_orig_mod.") for k in ckpt["model"])
    model = GPT(GPTConfig(**ckpt["model_args"]))  # the documented contract
    model.load_state_dict(ckpt["model"])
    idx = torch.randint(0, ckpt["model_args"]["vocab_size"], (2, 16))
    assert torch.equal(model(idx, all_logits=True)[0], model_from_checkpoint(ckpt)(idx, all_logits=True)[0])
    assert not glob.glob(os.path.join(tmp_path, "*.tmp*"))  # atomic writes leave no temp file
    records = read_metrics(os.path.join(tmp_path, "metrics.jsonl"))
    assert any("val/loss" in r for r in records) and any("ms_per_iter" in r for r in records)


def test_resume_is_exact(char_data_dir, tmp_path):
    """Stop at iter 10 and resume: every later loss equals the uninterrupted run's."""
    common = ["--eval_interval=5", "--dropout=0.1", "--lr_decay_iters=20", "--gradient_accumulation_steps=2"]
    run(char_data_dir, tmp_path / "a", "--max_iters=20", *common)
    run(char_data_dir, tmp_path / "b", "--max_iters=10", *common)
    run(char_data_dir, tmp_path / "b", "--max_iters=20", "--init_from=resume", *common)

    def losses(d):
        return {r["iter"]: r["train/lm_loss"] for r in read_metrics(os.path.join(d, "metrics.jsonl"))
                if "train/lm_loss" in r}

    a, b = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert sorted(b) == list(range(20))
    evals = [r["iter"] for r in read_metrics(os.path.join(tmp_path / "b", "metrics.jsonl")) if "val/loss" in r]
    assert evals == [0, 5, 10, 15, 20]  # the step the checkpoint evaluated is not evaluated again
    assert all(a[i] == b[i] for i in range(20)), [(i, a[i], b[i]) for i in range(20) if a[i] != b[i]]
    assert load_checkpoint(str(tmp_path / "b"))["iter_num"] == 20


def test_val_only_evaluation_changes_nothing_but_the_train_split_records(char_data_dir, tmp_path):
    """--eval_train=False (what the experiment harness uses) skips the train-split evaluations: the val losses, the
    kept checkpoint and every training loss are the same as with them."""
    common = ["--max_iters=12", "--eval_interval=4", "--dropout=0.1", "--always_save_checkpoint=False"]
    both = run(char_data_dir, tmp_path / "both", *common)
    val_only = run(char_data_dir, tmp_path / "val", *common, "--eval_train=False")
    assert val_only["train_loss"] is None and both["train_loss"] is not None
    assert val_only["val_loss"] == both["val_loss"]
    a, b = (read_metrics(os.path.join(tmp_path / d, "metrics.jsonl")) for d in ("both", "val"))
    assert [(r["iter"], r["val/loss"]) for r in a if "val/loss" in r] == [(r["iter"], r["val/loss"]) for r in b
                                                                        if "val/loss" in r]
    assert any("train/loss" in r for r in a) and not any("train/loss" in r for r in b)
    assert [r["train/lm_loss"] for r in a if "train/lm_loss" in r] == [r["train/lm_loss"] for r in b
                                                                        if "train/lm_loss" in r]
    wa, wb = (load_checkpoint(str(tmp_path / d))["model"] for d in ("both", "val"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(char_data_dir, tmp_path, monkeypatch):
    original = GPT.forward
    calls = {"n": 0}

    def poisoned(self, idx, targets=None, **kw):
        logits, loss = original(self, idx, targets, **kw)[:2]
        if targets is not None and self.training:
            calls["n"] += 1
            if calls["n"] > 7:
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(GPT, "forward", poisoned)
    with pytest.raises(TrainingDiverged, match="last good checkpoint"):
        run(char_data_dir, tmp_path, "--max_iters=20", "--eval_interval=5")
    ckpt = load_checkpoint(str(tmp_path))
    assert ckpt["iter_num"] == 5
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())


def test_lr_schedule_warmup_then_cosine():
    cfg = TrainConfig(learning_rate=1.0, min_lr=0.1, warmup_iters=10, lr_decay_iters=110)
    assert get_lr(0, cfg) < get_lr(5, cfg) < get_lr(10, cfg) == pytest.approx(1.0)
    assert get_lr(60, cfg) == pytest.approx(0.55)
    assert get_lr(110, cfg) == get_lr(500, cfg) == 0.1


def _env():
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.pop("RANK", None)
    return env


def read_until(proc: subprocess.Popen, prefix: str, timeout: float = 120.0) -> list[str]:
    """Lines of ``proc``'s stdout up to the first starting with ``prefix``; fails (no hang) after ``timeout`` s."""
    import queue
    import threading
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        seen.append(line)
        if line.startswith(prefix):
            return seen
    proc.kill()
    pytest.fail(f"no line starting with {prefix!r} within {timeout} s:\n" + "".join(seen))


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_saves_a_checkpoint_marked_incomplete_and_exits_130(char_data_dir, tmp_path, sig):
    """SIGHUP too (a closed terminal or ssh session): it used to end the run without a checkpoint."""
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), *TINY_MODEL, f"--data_dir={char_data_dir}",
           f"--out_dir={tmp_path}", "--max_iters=100000", "--eval_interval=100000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
    read_until(proc, "iter 5:")
    proc.send_signal(sig)
    proc.wait(timeout=60)
    assert proc.returncode == 130
    ckpt = load_checkpoint(str(tmp_path))
    assert ckpt["iter_num"] >= 5 and ckpt["complete"] is False and ckpt["interrupted"] == sig.name


@pytest.mark.slow
def test_kill_9_never_corrupts_the_checkpoint_and_resume_continues(char_data_dir, tmp_path):
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), *TINY_MODEL, f"--data_dir={char_data_dir}",
           f"--out_dir={tmp_path}", "--max_iters=100000", "--eval_interval=4"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
    read_until(proc, "iter 13:")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    ckpt = load_checkpoint(str(tmp_path))  # readable: atomic writes
    assert ckpt["iter_num"] >= 12 and ckpt["complete"] is False
    run(char_data_dir, tmp_path, f"--max_iters={ckpt['iter_num'] + 2}", "--eval_interval=4", "--init_from=resume")
    assert load_checkpoint(str(tmp_path))["complete"] and not glob.glob(os.path.join(tmp_path, "*.tmp*"))


@pytest.mark.slow
def test_ddp_with_two_gloo_processes(char_data_dir, tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(ROOT, "train.py"), *TINY_MODEL, f"--data_dir={char_data_dir}", f"--out_dir={tmp_path}",
           "--max_iters=6", "--eval_interval=3", "--gradient_accumulation_steps=2", "--device=cpu"]
    result = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ckpt = load_checkpoint(str(tmp_path))
    assert ckpt["iter_num"] == 6
    records = read_metrics(os.path.join(tmp_path, "metrics.jsonl"))
    assert records[-1]["val/loss"] < records[0]["val/loss"]


def test_every_variant_config_trains(char_data_dir, tmp_path):
    """Each overlay in configs/variants/ takes effect in the trained model and its training lowers the loss."""
    from lgpt.plumbing.configurator import read_config_file
    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "variants", "*.py"))):
        name = os.path.basename(path)[:-3]
        overlay_keys = set(read_config_file(path))
        tiny = [a for a in TINY_MODEL if a[2:].split("=")[0] not in overlay_keys]  # the overlay's own values win
        cfg = load_config(TrainConfig, [os.path.join(ROOT, "configs", "shakespeare_char.py"), path, *tiny,
                                        f"--data_dir={char_data_dir}", f"--out_dir={tmp_path / name}",
                                        "--max_iters=20", "--eval_interval=20", "--learning_rate=3e-3"])
        train(cfg)
        model_args = load_checkpoint(str(tmp_path / name))["model_args"]
        overlay = {k: v for k, v in read_config_file(path).items() if k in model_args}
        assert overlay and all(model_args[k] == v for k, v in overlay.items()), name
        evals = [r["val/loss"] for r in read_metrics(os.path.join(tmp_path, name, "metrics.jsonl")) if "val/loss" in r]
        assert evals[-1] < evals[0] - 0.1, (name, evals)


def test_wandb_offline_logging(char_data_dir, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    os.makedirs(tmp_path / "wandb")
    run(char_data_dir, tmp_path / "o", "--max_iters=2", "--eval_interval=2", "--wandb_log=True")
    assert glob.glob(str(tmp_path / "wandb" / "wandb" / "offline-run-*"))


def test_sample_prints_text(trained_dir):
    from sample import SampleConfig, sample
    texts = sample(SampleConfig(out_dir=trained_dir, start="The", num_samples=2, max_new_tokens=20))
    assert len(texts) == 2 and all(t.startswith("The") and len(t) == 23 for t in texts)


def test_sample_save_to_writes_batched_samples_that_equal_one_at_a_time(trained_dir, tmp_path):
    from sample import SampleConfig, sample, save_samples
    greedy = dict(out_dir=trained_dir, start="The", num_samples=5, max_new_tokens=12, top_k=1)
    one_at_a_time = sample(SampleConfig(**greedy))
    path = tmp_path / "samples.txt"
    assert save_samples(SampleConfig(**greedy, save_to=str(path), batch_size=2)) == 5 * 12  # batches 2, 2, 1
    assert path.read_text() == "".join(text + "\n\n" for text in one_at_a_time)
    assert os.listdir(tmp_path) == ["samples.txt"]  # no temporary file left


def test_sample_save_to_refuses_an_existing_file_and_leaves_it(trained_dir, tmp_path):
    path = tmp_path / "samples.txt"
    path.write_text("mine")
    result = subprocess.run([sys.executable, os.path.join(ROOT, "sample.py"), f"--out_dir={trained_dir}",
                             f"--save_to={path}", "--max_new_tokens=4"], capture_output=True, text=True,
                            env=_env(), timeout=60)
    assert result.returncode != 0 and "--overwrite=True" in result.stderr and "Traceback" not in result.stderr
    assert path.read_text() == "mine"


def test_sample_continue_data_appends_the_models_continuations_of_train_windows(trained_dir, char_data_dir,
                                                                              tmp_path):
    """--continue_data/--data_out: the train split, then each prompt window (a window of the train split, at the
    seeded starts) with the model's continuation — greedy, so each equals generate on that window alone; the val
    split and meta.pkl are the source's, and only the finished folder is left."""
    import numpy as np

    from lgpt.plumbing.checkpoint import load_model
    from lgpt.plumbing.dataset import BatchLoader, load_meta, token_dtype
    from sample import SampleConfig, continuation_prompts, save_continuations
    out = tmp_path / "teacher"
    cfg = SampleConfig(out_dir=trained_dir, continue_data=char_data_dir, data_out=str(out), num_samples=5,
                       batch_size=2, prompt_tokens=6, max_new_tokens=7, top_k=1, seed=3)
    cfg.validate()
    assert save_continuations(cfg) == 5 * 7
    train = np.fromfile(os.path.join(char_data_dir, "train.bin"), dtype=np.uint16)
    written = np.fromfile(out / "train.bin", dtype=token_dtype(None))
    assert len(written) == len(train) + 5 * (6 + 7) and (written[:len(train)] == train).all()
    prompts = continuation_prompts(train, 5, 6, seed=3)
    model = load_model(trained_dir)[0].eval()
    for k, prompt in enumerate(prompts):
        piece = written[len(train) + k * 13:len(train) + (k + 1) * 13]
        assert any((prompt == train[s:s + 6]).all() for s in range(len(train) - 6))  # a window of the split
        expected = model.generate(torch.from_numpy(prompt)[None], 7, top_k=1)[0].numpy()
        assert (piece == expected).all()
    with open(os.path.join(char_data_dir, "val.bin"), "rb") as f:
        assert (out / "val.bin").read_bytes() == f.read()
    source, meta = load_meta(char_data_dir), load_meta(str(out))
    assert {k: v for k, v in meta.items() if k != "tokens"} == {k: v for k, v in source.items() if k != "tokens"}
    # the manifest counts the longer split; no test split is copied (test is read, counted, on the source alone)
    assert "test" in source["tokens"] and not (out / "test.bin").exists()
    assert meta["tokens"] == {"train": len(written), "val": source["tokens"]["val"]}
    BatchLoader(str(out), 8, 2, "cpu").get_batch("train", 0)  # a dataset the loaders accept as it stands
    assert sorted(os.listdir(tmp_path)) == ["teacher"]  # no temporary folder left


def test_sample_autocast_is_entered_around_every_step_of_a_lazy_stream(trained_dir):
    """--dtype: a generator runs its body at each next(), so autocast_each enters the context around every step (a
    with-block around the generator's creation would not); float32 enters none. Sampling in bfloat16 runs."""
    from sample import SampleConfig, autocast_each, sample

    def steps():
        for _ in range(3):
            yield torch.tensor(torch.is_autocast_enabled("cpu"))

    assert all(bool(t) for t in autocast_each(steps(), "cpu", "bfloat16"))
    assert not any(bool(t) for t in autocast_each(steps(), "cpu", "float32"))
    texts = sample(SampleConfig(out_dir=trained_dir, start="The", num_samples=1, max_new_tokens=5, dtype="bfloat16"))
    assert len(texts[0]) == 8


def test_sample_continue_data_refuses_data_in_another_tokenizer(trained_dir, tmp_path):
    """The ids are copied, never re-encoded: a dataset in another tokenizer is refused before anything is written."""
    from lgpt.plumbing.dataset import prepare_text
    from lgpt.plumbing.errors import DataError
    from sample import SampleConfig, save_continuations
    other = tmp_path / "other"
    prepare_text("zzzz yyyy qqqq\n" * 200, str(other), "char")
    cfg = SampleConfig(out_dir=trained_dir, continue_data=str(other), data_out=str(tmp_path / "out"), num_samples=2)
    with pytest.raises(DataError, match="prepare the data with the model's tokenizer"):
        save_continuations(cfg)
    assert not (tmp_path / "out").exists()


def test_cli_reports_config_errors_cleanly():
    result = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--n_layr=2"], capture_output=True,
                            text=True, env=_env(), timeout=60)
    assert result.returncode != 0
    assert "unknown config key 'n_layr'" in result.stderr and "Traceback" not in result.stderr
