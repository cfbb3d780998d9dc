"""scripts/real_distill_gpu.py: the −50% recovery run for one call of a lent GPU (issue #40). Its planning, its
tokenizer step, its deadline, and the whole run end to end on the CPU with a small Llama exported to GGUF."""
import json
import os
import subprocess
import sys
import time

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))

import real_distill_gpu as gpu  # noqa: E402

from lgpt.plumbing.checkpoint import load_checkpoint, load_model, save_checkpoint  # noqa: E402
from lgpt.plumbing.dataset import tokenizer_fingerprint  # noqa: E402


def test_the_steps_fit_the_time_left_and_never_pass_the_token_bound():
    per_step = gpu.BATCH * gpu.BLOCK
    assert gpu.planned_iters(100_000, 300) == 300 * 100_000 // per_step  # the time binds
    assert gpu.planned_iters(1e9, 300) == gpu.MAX_TOKENS // per_step  # the 50 M tokens bind
    assert gpu.planned_iters(100_000, -5) == 1  # no time left: one step, not zero or negative
    assert gpu.planned_iters(1_000, 10, batch=1, max_tokens=10 * gpu.BLOCK) == 10  # 10 steps of tokens, 39 of time


def test_the_recipe_is_the_cpu_recipes_loss_and_schedule_on_the_gpu():
    args = dict(a.lstrip("-").split("=", 1) for a in gpu.recipe(1e-4, 1000, "cuda"))
    assert (args["distill"], args["distill_alpha"], args["distill_temperature"]) == ("True", "1.0", "1.0")
    assert (args["learning_rate"], args["min_lr"], args["max_iters"], args["lr_decay_iters"]) == (
        "0.0001", "1e-05", "1000", "1000")
    assert args["warmup_iters"] == str(round(1000 * gpu.WARMUP_SHARE)) and args["eval_seed"] == "0"
    assert args["dtype"] == "bfloat16" and args["compile"] == "False"  # compile off: the control stays exact
    assert int(args["batch_size"]) * int(args["block_size"]) == int(args["distill_chunk"])
    assert dict(a.lstrip("-").split("=", 1) for a in gpu.recipe(1e-4, 3, "cpu", batch=1))["dtype"] == "float32"
    assert "--compile=True" in gpu.recipe(1e-4, 3, "cuda", compile=True)


@pytest.mark.parametrize("moved", [False, True])
def test_a_control_that_moves_stops_the_run_before_any_arm(moved, tmp_path, monkeypatch):
    """The control's check runs the arms' recipe (compiled when they are); a control that moves is not the original,
    so no gap to it may be reported: the run stops with the fix."""
    commands = []
    monkeypatch.setattr(gpu, "WORK", str(tmp_path))
    monkeypatch.setattr(gpu, "run", lambda args, log, name: commands.append(args) or 1.5)
    monkeypatch.setattr(gpu, "unchanged", lambda a, b: not moved)
    check = lambda: gpu.check_control("orig", "data", 3e-4, "cuda", 64, True, gpu.Log())  # noqa: E731
    if moved:
        with pytest.raises(SystemExit, match="moved in 8 steps with --compile: the control is not the original; run "
                                             "without --compile"):
            check()
    else:
        assert check() == {"check_iters": gpu.CONTROL_CHECK_ITERS, "unchanged": True, "seconds": 1.5}
    assert "--teacher_dir=orig" in commands[0] and "--compile=True" in commands[0]
    assert "--learning_rate=0.0003" in commands[0]


@pytest.mark.parametrize("lrs, says", [("3e-4,x", "is not a comma-separated list"), ("0", "must be > 0")])
def test_bad_rates_are_one_line_before_anything_is_written(lrs, says, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["real_distill_gpu.py", "--gguf=g", "--data=d", f"--out={tmp_path / 'out'}",
                                      f"--work={tmp_path / 'work'}", f"--lrs={lrs}"])
    with pytest.raises(SystemExit, match=says):
        gpu.main()
    assert not os.listdir(tmp_path)


def hf_meta(vocab: dict, decoder: str = "ByteLevel") -> dict:
    spec = {"model": {"type": "BPE", "vocab": vocab, "merges": ["a b"]}, "decoder": {"type": decoder}}
    return {"tokenizer": "hf", "vocab_size": len(vocab), "files": {"tokenizer.json": json.dumps(spec)},
            "special_ids": {"bos_token_id": 0}}


@pytest.mark.parametrize("case", ["same", "other files, same ids", "other ids"])
def test_the_import_takes_the_datas_tokenizer_only_when_the_ids_are_the_same(case, trained_dir, tmp_path):
    """Another transformers version writes other tokenizer files from the same GGUF (seen: transformers 5.17 against
    5.24 on SmolLM2: other decoder and model flags, the same vocabulary and merges). The run takes the data's record
    then, and refuses (nothing written) when the ids would differ."""
    vocab = {"a": 0, "b": 1, "ab": 2}
    ckpt = load_checkpoint(trained_dir)
    ckpt["meta"] = hf_meta(vocab)
    model_dir, data_dir = str(tmp_path / "model"), tmp_path / "data"
    save_checkpoint(ckpt, model_dir)
    data_meta = {"same": hf_meta(vocab), "other files, same ids": hf_meta(vocab, "Metaspace"),
                 "other ids": hf_meta({"a": 0, "b": 2, "ab": 1}, "Metaspace")}[case]
    data_dir.mkdir()
    with open(data_dir / "meta.pkl", "wb") as f:
        import pickle
        pickle.dump(dict(data_meta, tokens=["train", "val"]), f)
    before = os.path.getmtime(os.path.join(model_dir, "ckpt.pt"))
    if case == "other ids":
        with pytest.raises(SystemExit, match="gives other ids than the data's"):
            gpu.adopt_data_tokenizer(model_dir, str(data_dir))
        assert os.path.getmtime(os.path.join(model_dir, "ckpt.pt")) == before
        return
    said = gpu.adopt_data_tokenizer(model_dir, str(data_dir))
    after = load_checkpoint(model_dir)
    assert tokenizer_fingerprint(after["meta"]) == tokenizer_fingerprint(data_meta) and "tokens" not in after["meta"]
    assert all(torch.equal(after["model"][k], ckpt["model"][k]) for k in ckpt["model"])  # the weights stay
    assert said == "as imported" if case == "same" else said.startswith("the data's")


def test_a_step_past_the_deadline_is_stopped_and_a_failed_one_ends_the_run_with_its_log(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu, "WORK", str(tmp_path))
    log = gpu.Log()
    slow = gpu.command(["-c", "import time; time.sleep(60)"], log, "slow")
    started = time.time()
    seconds = gpu.finish({"slow": slow}, log, deadline=time.time() + 1)
    assert time.time() - started < 30 and slow.returncode != 0 and seconds["slow"] >= 1
    assert any("past the deadline" in line for line in log.lines)
    failing = gpu.command(["-c", "print('the reason'); raise SystemExit(3)"], log, "failing")
    with pytest.raises(SystemExit, match="failing failed \\(3\\):\nthe reason"):
        gpu.finish({"failing": failing}, log)


def test_the_probe_speed_skips_the_warm_up_and_the_curve_counts_tokens(tmp_path):
    lines = [{"val/loss": 5.0, "iter": 0}, *({"tokens_per_s": 10.0 if i < 4 else 100.0 + i, "iter": i}
                                             for i in range(8)), {"val/loss": 4.0, "iter": 8}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    assert gpu.probe_speed(str(tmp_path)) == 105.5  # the median of steps 4…7, not the slow first ones
    assert gpu.curve(str(tmp_path), batch=2) == [[0, 5.0], [8 * 2 * gpu.BLOCK, 4.0]]
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"tokens_per_s": 1.0, "iter": 0}) + "\n")
    with pytest.raises(SystemExit, match="no step after the warm-up"):
        gpu.probe_speed(str(tmp_path))


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory):
    """A small tied Llama exported to GGUF and three texts prepared with its tokenizer as imported: built once for
    the whole runs below (their own outputs go to each test's tmp_path)."""
    pytest.importorskip("gguf")
    from convert import ConvertConfig, convert
    from hf_models import llama, save, shakespeare_text, train_tokenizer
    root_dir = tmp_path_factory.mktemp("small_gguf")
    hf = save(llama(tied=True), root_dir / "hf", train_tokenizer())
    convert(ConvertConfig(from_hf=hf, out_dir=str(root_dir / "ours")))
    convert(ConvertConfig(to_gguf=str(root_dir / "model.gguf"), in_dir=str(root_dir / "ours")))
    convert(ConvertConfig(from_gguf=str(root_dir / "model.gguf"), out_dir=str(root_dir / "imported")))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for name, (first, last) in (("shakespeare", (0, 120_000)), ("novel", (0, 120_000)), ("mix", (120_000, 200_000))):
        corpus = root_dir / f"{name}.txt"  # tokenized as on the CPU machine: with the GGUF's tokenizer as imported
        corpus.write_text(shakespeare_text()[first:last])
        subprocess.run([sys.executable, "prepare.py", f"--tokenizer_from={root_dir / 'imported'}", f"--input={corpus}",
                        f"--out_dir={root_dir / 'data' / name}"], cwd=root, check=True, capture_output=True)
    return root_dir


@pytest.mark.slow
@pytest.mark.parametrize("start, teacher, text, lrs", [("pca", 0, "shakespeare", [3e-4]),
                                                       ("learned", 100, "mix", [1e-4, 3e-4])])
def test_the_whole_run_on_the_cpu_with_a_small_llama_from_gguf(start, teacher, text, lrs, small_gguf, tmp_path,
                                                               monkeypatch):
    """Import from GGUF, shrink (from PCA, or the map learned with its gains), the control's check, the probe, the
    rates at once (one arm, or two) and the record, on the CPU: a small tied Llama (d = 64 → m = 48, tie_keep 32) in
    64-token windows."""
    for name in ("model.gguf", "data"):  # the shared inputs, linked where the run reads them
        (tmp_path / name).symlink_to(small_gguf / name)
    for name, value in (("M", 48), ("BLOCK", 64), ("PROBE_ITERS", 6), ("CONTROL_CHECK_ITERS", 2),
                        ("EVAL_RESERVE_S", 0), ("MAX_TOKENS", 4 * 2 * 64), ("TEACHER_PROMPT", 8),
                        ("TEACHER_NEW", 24), ("TEACHER_BATCH", 3), ("LEARNED", {48: gpu.LEARNED[288]})):
        monkeypatch.setattr(gpu, name, value)
    monkeypatch.setattr(gpu, "CALIB", ["--calib_batches=2", "--calib_batch_size=4"])
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["real_distill_gpu.py", f"--gguf={tmp_path / 'model.gguf'}",
                                      f"--data={tmp_path / 'data'}", f"--out={out}", f"--work={tmp_path / 'work'}",
                                      "--device=cpu", "--batch=2", "--budget_s=600",
                                      f"--lrs={','.join(map(str, lrs))}", f"--start={start}",
                                      f"--teacher_tokens={teacher}", f"--text={text}"])
    gpu.main()
    result = json.loads((out / "results.json").read_text())
    assert result["tokenizer"] == "as imported" and result["control"]["unchanged"] is True
    assert result["start_map"] == start and result["options"] == [*gpu.TIE, *(gpu.LEARNED[48] if start == "learned"
                                                                               else ())]
    assert result["text"] == text and result["m"] == 48
    train = tmp_path / "work" / "teacher-data" if teacher else tmp_path / "data" / text
    assert result["train_tokens"] == os.path.getsize(train / "train.bin") // 2
    transformed = load_checkpoint(str(tmp_path / "work" / "m48"))["transform"]
    assert (transformed.get("learn_steps", 0) > 0) == (start == "learned")  # the map learned only where asked
    assert result["iters"] == 4 and result["tokens"] == 4 * 2 * 64  # the token bound binds
    assert [arm["lr"] for arm in result["arms"]] == lrs and result["compile"] is False
    for arm in result["arms"]:
        assert arm["iters_done"] == 4 and not arm["stopped_early"]
        assert arm["losses"]["val"] != result["start"]["val"]  # distillation moved the shrunk model
        assert arm["gap_to_control"]["val"] == pytest.approx(arm["losses"]["val"] / result["original"]["val"] - 1)
        assert arm["curve"][0][0] == 0 and arm["curve"][-1][0] == result["tokens"]
        assert arm["train_curve"] and all(tokens <= result["tokens"] and ce > 0 for tokens, ce, _ in
                                          arm["train_curve"])
    assert result["start"]["parameters"] == sum(p.numel() for p in load_model(str(tmp_path / "work" / "m48"))[0]
                                                .parameters())
    assert "distill" in result["seconds"] and (out / "log.txt").read_text().count("min]") > 8
    assert result["meta"]["command"].endswith(f"--start={start} --teacher_tokens={teacher} --text={text}")
    arms_data = json.loads((tmp_path / "work" / f"distilled-lr{lrs[0]:g}" / "finetune.json").read_text())
    if teacher:  # 100 tokens: 5 continuations of 24 after 8-token prompts, after the train split; val as it was
        assert result["teacher_text"] == {"samples": 5, "prompt_tokens": 8, "new_tokens": 24, "generated": 120,
                                          "train_tokens": 160} and "teacher_text" in result["seconds"]
        own = tmp_path / "data" / text
        assert os.path.getsize(tmp_path / "work" / "teacher-data" / "train.bin") == os.path.getsize(
            own / "train.bin") + 160 * 2
        assert (tmp_path / "work" / "teacher-data" / "val.bin").read_bytes() == (own / "val.bin").read_bytes()
    assert ("teacher-data" in json.dumps(arms_data)) == bool(teacher)  # the arms distilled on it, only when asked
    assert (f"data/{text}" in json.dumps(arms_data)) == (not teacher)  # or on --text's own split
    assert f"--data_dir={tmp_path / 'data' / text} " in (out / "log.txt").read_text()  # the map calibrated on it
    assert result["meta"]["hardware"].startswith("cpu")
    import report
    table = report.real_model_gpu(result)  # a run of the script renders as it stands (no hand-added record)
    assert "SmolLM2-135M-Instruct on one cpu" in table and "| 0.0003 | tied m = 48, distilled, 512 tokens |" in table
