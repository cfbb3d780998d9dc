"""Damaged inputs, field by field, through the real commands (in-process, as ``run_cli`` runs them): every
checkpoint field deleted, emptied or given the wrong type or shape, truncated files, and every config value of
every command set to something impossible. Whatever the damage, a command either works or stops with one line
``error: ...`` and exit 1: never a traceback, never a hang, and the inputs are byte-identical afterwards.
Damage that makes a model unusable (its weights, its architecture) must be refused."""
import contextlib
import dataclasses
import hashlib
import importlib
import os
import shutil
import signal

import pytest
import torch

from conftest import TINY_MODEL
from lgpt.plumbing.cli import run_cli

TRAINED_ITERS = 60  # conftest's trained_dir


class Hang(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: int):
    def alarm(*_):
        raise Hang(f"no answer within {seconds} s")
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _sha(path: str) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def run_command(script: str, argv: list[str], capsys, protected: list[str]) -> tuple[int | str, str]:
    """(exit code, stderr) of one command, or ('traceback' | 'hang' | 'changed its input' | 'bad exit', what)."""
    before = {p: _sha(p) for p in protected}
    capsys.readouterr()
    with deadline(120):
        try:
            rc = run_cli(importlib.import_module(script).main, argv)
        except Hang as e:
            return "hang", str(e)
        except BaseException as e:  # noqa: BLE001 - exactly what must never escape a command
            import traceback
            where = traceback.extract_tb(e.__traceback__)[-1]
            return "traceback", f"{e.__class__.__name__}: {str(e)[:150]} at {os.path.basename(where.filename)}:" \
                                f"{where.lineno}"
    err = capsys.readouterr().err.strip()
    if {p: _sha(p) for p in protected} != before:
        return "changed its input", err[-200:]
    if rc not in (0, 1) or (rc == 1 and not err.splitlines()[-1].startswith("error: ")):
        return "bad exit", f"{rc}: {err[-300:]}"
    return rc, err


def _problem(label: str, rc, err: str) -> str | None:
    return f"{label}: {rc} {err}" if isinstance(rc, str) else None


# ----------------------------------------------------------------------------------------------
# Checkpoints


MISSING = object()
WRONG_VALUES = [MISSING, None, "garbage", 7, -1, [1, 2], {"a": 1}, float("nan")]


def _damaged_copies(ckpt: dict):
    """(name, damaged checkpoint or bytes transform, must_refuse) for every field in turn."""
    for key in sorted(ckpt):
        for value in WRONG_VALUES:
            yield f"{key}={value if value is not MISSING else 'deleted'}", ("top", key, value), key in (
                "model", "model_args")
    for field in sorted(ckpt["model_args"]):
        for value in (MISSING, None, "garbage", -1, 0, 10**9, 2.5, float("nan")):
            yield f"model_args.{field}={value if value is not MISSING else 'deleted'}", ("args", field, value), None
    for name in sorted(ckpt["model"]):
        for damage in ("deleted", "row_dropped", "int_dtype", "string", "scalar"):
            yield f"model.{name}:{damage}", ("weight", name, damage), True
    yield "model.unexpected_tensor", ("weight", "transformer.extra.weight", "added"), True
    for field in ("dataset", "data_dir", "block_size", "batch_size", "seed"):
        for value in (None, 7, "garbage", [1]):
            yield f"config.{field}={value}", ("config", field, value), None
    for field in ("tokenizer", "vocab_size", "stoi", "itos"):
        for value in (MISSING, None, "garbage", 3):
            yield f"meta.{field}={value if value is not MISSING else 'deleted'}", ("meta", field, value), None


def _apply(ckpt: dict, damage: tuple) -> dict:
    kind, key, value = damage
    ckpt = dict(ckpt, model=dict(ckpt["model"]), model_args=dict(ckpt["model_args"]), config=dict(ckpt["config"]),
                meta=dict(ckpt["meta"]))
    target = {"top": ckpt, "args": ckpt["model_args"], "config": ckpt["config"], "meta": ckpt["meta"],
              "weight": ckpt["model"]}[kind]
    if kind == "weight":
        tensor = ckpt["model"].get(key)
        value = {"deleted": MISSING, "row_dropped": tensor[:-1] if tensor is not None else None,
                 "int_dtype": tensor.long() if tensor is not None else None, "string": "garbage",
                 "scalar": torch.tensor(1.0), "added": torch.zeros(3, 3)}[value]
    if value is MISSING:
        target.pop(key, None)
    else:
        target[key] = value
    return ckpt


TRUNCATIONS = [0, 1, 100, 0.25, 0.5, 0.9, 0.999]


@pytest.fixture(scope="module")
def damaged_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


def _commands(path: str, out: str, data: str) -> dict[str, tuple[str, list[str]]]:
    """Every command that reads a model, each asked for the least work."""
    return {
        "sample": ("sample", [f"--out_dir={path}", "--max_new_tokens=3", "--num_samples=1"]),
        "transform": ("transform", [f"--in_dir={path}", f"--out_dir={out}", "--width=24", "--eval_iters=0"]),
        "eval_geometry": ("eval_geometry", [f"--ref_dir={path}", f"--out_dir={out}", "--n_probes=64",
                                            "--probe_batches=1", "--eval_iters=1", "--heatmap_probes=8",
                                            "--wandb_log=False", f"--data_dir={data}"]),
        "finetune": ("finetune", [f"--in_dir={path}", f"--out_dir={out}", "--max_iters=1", "--eval_iters=1",
                                  "--batch_size=2", f"--data_dir={data}"]),
        "convert": ("convert", [f"--in_dir={path}", f"--to_hf={out}"]),
    }


def _all_damages(trained_dir: str) -> list:
    ckpt = torch.load(os.path.join(trained_dir, "ckpt.pt"), weights_only=False)
    return list(_damaged_copies(ckpt)) + [(f"truncated@{t}", ("truncate", t, None), True) for t in TRUNCATIONS]


# which damages go through which commands: with NANOLGPT_FUZZ_ALL=1 every damage through all five; by default every
# other damage through one command, rotating, so every command still meets every kind of damage
COMMANDS = ["sample", "transform", "eval_geometry", "finetune", "convert"]


def _write(damage: tuple, ckpt: dict, src: str, dst: str) -> None:
    os.makedirs(dst, exist_ok=True)
    path = os.path.join(dst, "ckpt.pt")
    if damage[0] == "truncate":
        data = open(os.path.join(src, "ckpt.pt"), "rb").read()
        cut = damage[1] if isinstance(damage[1], int) else int(len(data) * damage[1])
        open(path, "wb").write(data[:cut])
    else:
        torch.save(_apply(ckpt, damage), path)


def _run_damage(index: int, full: bool, trained_dir: str, char_data_dir: str, damaged_dir, capsys) -> list[str]:
    ckpt = torch.load(os.path.join(trained_dir, "ckpt.pt"), weights_only=False)
    damages = _all_damages(trained_dir)
    failures = []
    for k, (name, damage, must_refuse) in enumerate(damages):
        if not full and k % 2:
            continue  # by default every other damage (each field keeps four of its eight): the suite's time
        if (k if full else k // 2) % FUZZ_SHARDS != index:
            continue
        src = str(damaged_dir / f"d{k}")
        _write(damage, ckpt, trained_dir, src)
        chosen = COMMANDS if full else [COMMANDS[k % len(COMMANDS)]]
        for command in chosen:
            out = str(damaged_dir / f"out{k}-{command}")
            script, argv = _commands(src, out, char_data_dir)[command]
            rc, err = run_command(script, argv, capsys, [os.path.join(src, "ckpt.pt")])
            if _problem(f"{name} through {command}", rc, err):
                failures.append(_problem(f"{name} through {command}", rc, err))
            elif must_refuse and rc != 1:
                failures.append(f"{name} through {command}: accepted")
            if rc == 1 and os.path.exists(out) and os.listdir(out):
                failures.append(f"{name} through {command}: failed but wrote {os.listdir(out)}")
            shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(src)
    return failures


FUZZ_SHARDS = 4


@pytest.mark.parametrize("shard", range(FUZZ_SHARDS))
def test_every_damaged_checkpoint_field_is_refused_in_one_line_or_harmless(shard, trained_dir, char_data_dir,
                                                                           damaged_dir, capsys):
    failures = _run_damage(shard, False, trained_dir, char_data_dir, damaged_dir, capsys)
    assert not failures, "\n".join(["FAIL"] + failures)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("NANOLGPT_FUZZ_ALL"), reason="~5 min: NANOLGPT_FUZZ_ALL=1 runs every damage "
                                                                   "through every command")
@pytest.mark.parametrize("shard", range(FUZZ_SHARDS))
def test_every_damaged_checkpoint_field_through_every_command(shard, trained_dir, char_data_dir, damaged_dir,
                                                              capsys):
    failures = _run_damage(shard, True, trained_dir, char_data_dir, damaged_dir, capsys)
    assert not failures, "\n".join(["FAIL"] + failures)


# ----------------------------------------------------------------------------------------------
# Config values


IMPOSSIBLE = ["'garbage'", "None", "[1, 2]", "float('nan')", "float('inf')", "-1", "0", "10**30"]


def _config_cases():
    """(command, its config class, the argv that makes the rest of its work tiny)."""
    from eval_geometry import GeometryConfig
    from finetune import FinetuneConfig
    from sample import SampleConfig
    from train import TrainConfig
    from transform import TransformConfig
    return [("train", TrainConfig), ("finetune", FinetuneConfig), ("transform", TransformConfig),
            ("eval_geometry", GeometryConfig), ("sample", SampleConfig)]


def _base_argv(command: str, trained: str, transformed: str, data: str, out: str) -> list[str]:
    return {
        "train": [*TINY_MODEL, f"--data_dir={data}", f"--out_dir={out}", "--max_iters=2"],
        "finetune": [f"--in_dir={transformed}", f"--out_dir={out}", "--max_iters=1", "--eval_iters=1",
                     "--batch_size=2"],
        "transform": [f"--in_dir={trained}", f"--out_dir={out}", "--width=24", "--eval_iters=0"],
        "eval_geometry": [f"--ref_dir={trained}", f"--out_dir={out}", "--n_probes=64", "--probe_batches=1",
                          "--eval_iters=1", "--heatmap_probes=8", "--wandb_log=False"],
        "sample": [f"--out_dir={trained}", "--max_new_tokens=3", "--num_samples=1"],
    }[command]


# values that are allowed but would make the command's work long (not damage: a user's choice)
LONG_WORK = {"max_iters", "eval_iters", "max_new_tokens", "num_samples", "n_probes", "probe_batches", "batch_size",
             "learn_steps", "learn_batches", "refit_batches", "refit_tokens", "eval_interval", "lr_decay_iters",
             "gradient_accumulation_steps", "log_interval", "warmup_iters", "block_size", "n_layer", "n_head",
             "n_embd", "width", "mlp_hidden", "head_dim", "vocab_size", "ndcg_k", "n_features", "heatmap_probes",
             "rewarm_iters", "kd_steps", "calibration_batches", "carry_batches", "n_kv_head", "peak_tflops",
             "grow_layers", "n_layer_new"}


@pytest.fixture(scope="module")
def transformed_dir(trained_dir, tmp_path_factory):
    from transform import TransformConfig, transform_checkpoint
    out = str(tmp_path_factory.mktemp("fuzz_t") / "t")
    transform_checkpoint(TransformConfig(in_dir=trained_dir, out_dir=out, width=24, eval_iters=0))
    return out


@pytest.mark.parametrize("command", ["train", "finetune", "transform", "eval_geometry", "sample"])
def test_every_config_value_set_to_something_impossible_is_refused_in_one_line_or_harmless(
        command, trained_dir, transformed_dir, char_data_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative path a value names (sample's save_to = 'garbage') lands here
    config_class = dict(_config_cases())[command]
    protected = [os.path.join(trained_dir, "ckpt.pt"), os.path.join(transformed_dir, "ckpt.pt")]
    failures = []
    for k, field in enumerate(dataclasses.fields(config_class)):
        for j, value in enumerate(IMPOSSIBLE):
            if field.name in LONG_WORK and value in ("10**30", "float('inf')"):
                continue
            if field.name in ("out_dir", "in_dir", "ref_dir"):
                continue  # where the command reads and writes: the base argv gives them
            out = str(tmp_path / f"out{k}-{j}")
            config = tmp_path / f"c{k}-{j}.py"
            config.write_text(f"{field.name} = {value}\n")
            argv = [str(config), *_base_argv(command, trained_dir, transformed_dir, char_data_dir, out)]
            argv = [a for a in argv if not a.startswith(f"--{field.name}=")]
            rc, err = run_command(command, argv, capsys, protected)
            if _problem(f"{field.name} = {value}", rc, err):
                failures.append(_problem(f"{field.name} = {value}", rc, err))
            elif rc == 1 and os.path.exists(out) and os.listdir(out):
                failures.append(f"{field.name} = {value}: failed but wrote {os.listdir(out)}")
            takes_list = "tuple" in str(field.type) and value == "[1, 2]"  # --key=1,2: a tuple field's own form
            if rc == 0 and value in ("'garbage'", "[1, 2]") and field.type not in ("str", "str | None") \
                    and not takes_list:
                failures.append(f"{field.name} = {value}: accepted a {type(eval(value)).__name__} for {field.type}")
            shutil.rmtree(out, ignore_errors=True)
    assert not failures, "\n".join(["FAIL"] + failures)


if __name__ == "__main__":  # python tests/commands/test_fuzz.py TRAINED_DIR DATA_DIR: every failure, one per line
    import sys

    class _Capsys:
        def readouterr(self):
            import io
            out = sys.stderr.getvalue() if isinstance(sys.stderr, io.StringIO) else ""
            sys.stderr.seek(0), sys.stderr.truncate(0)
            return type("R", (), {"err": out, "out": ""})()
    import io
    import pathlib
    import tempfile
    real_err = sys.stderr
    sys.stdout = open(os.devnull, "w")
    sys.stderr = io.StringIO()
    found = []
    for shard in range(FUZZ_SHARDS):
        found += _run_damage(shard, len(sys.argv) > 3, sys.argv[1], sys.argv[2], pathlib.Path(tempfile.mkdtemp()),
                             _Capsys())
    print("\n".join(found), file=real_err)
