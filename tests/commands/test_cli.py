"""Every entry point answers -h/--help from its config dataclass, and every command the README documents parses
(its keys, types and config files) — the torchrun line even trains, CPU-shrunk, with 2 gloo processes."""
import dataclasses
import glob
import importlib
import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT, TINY_MODEL
from lgpt.plumbing.cli import run_cli, split_threads
from lgpt.plumbing.configurator import help_text, load_config
from lgpt.plumbing.logger import read_metrics

CONFIG_SCRIPTS = {"train": "TrainConfig", "finetune": "FinetuneConfig", "transform": "TransformConfig",
                  "eval_geometry": "GeometryConfig", "sample": "SampleConfig", "convert": "ConvertConfig",
                  "prepare": "PrepareConfig"}
OTHER_ENTRY_POINTS = ["data/shakespeare_char/prepare.py", "data/shakespeare/prepare.py", "data/openwebtext/prepare.py",
                      "scripts/report.py", "scripts/experiments.py", "bench/train_throughput.py",
                      "bench/transform_speed.py", "bench/geometry_speed.py", "-m lgpt.plumbing.checkpoint",
                      "scripts/all.sh", "scripts/worked_example.sh", "scripts/heads.sh", "scripts/shrink_quality.sh",
                      "scripts/recovery.sh", "scripts/scale.sh", "bench/distill_speed.py"]


def _listing(path) -> list[str]:
    return sorted(os.listdir(path))


@pytest.mark.parametrize("script", sorted(CONFIG_SCRIPTS))
def test_help_lists_every_field_and_writes_nothing(script, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(script)
    cls = getattr(module, CONFIG_SCRIPTS[script])
    for flag in ("-h", "--help"):
        assert run_cli(module.main, [flag]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"usage: python {script}.py [config_file.py ...] [--key=value ...]")
        for f in dataclasses.fields(cls):
            if f.name in getattr(cls, "HELP_OMITS", ()):  # documented by the command that uses it (finetune.py)
                continue
            line = next((x for x in out.splitlines() if x.strip().startswith(f"--{f.name}=")), None)
            assert line is not None, f.name
            assert f"default {f.default!r}" in line
    assert _listing(tmp_path) == []


def test_help_shows_the_values_config_files_set_and_the_field_comments(capsys):
    import train
    config = os.path.join(ROOT, "configs", "shakespeare_char.py")
    assert run_cli(train.main, [config, "--max_iters=7", "--help"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"--n_embd=128 +\[int; default 768\] +residual width d", out)
    assert "--max_iters=7 " in out and "\nmodel:\n" in out and "\noptimizer:\n" in out


def test_a_new_field_appears_in_help_without_other_edits(tmp_path, monkeypatch):
    (tmp_path / "newconf.py").write_text(
        "from dataclasses import dataclass\nfrom train import TrainConfig\n\n\n@dataclass\n"
        "class Extended(TrainConfig):\n    # my ablation\n    my_knob: float = 0.5  # what my knob does\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cls = importlib.import_module("newconf").Extended
    text = help_text(cls, prog="x.py")
    assert re.search(r"my ablation:\n  --my_knob=0.5 +\[float; default 0.5\] +what my knob does", text)
    assert "--learning_rate=0.001" in text


def test_a_bad_key_keeps_did_you_mean_and_points_to_help(capsys):
    import transform
    assert run_cli(transform.main, ["--widht=8"]) == 1
    err = capsys.readouterr().err
    assert "unknown config key 'widht'. Did you mean 'width'? See --help" in err


@pytest.mark.slow
@pytest.mark.parametrize("path", OTHER_ENTRY_POINTS)
def test_other_entry_points_answer_help(path, tmp_path):
    if path.startswith("-m "):  # a library module with a command line of its own, run as python -m
        command = [sys.executable, "-m", path[3:], "--help"]
    else:
        command = ["bash" if path.endswith(".sh") else sys.executable, os.path.join(ROOT, path), "--help"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                            env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT))
    assert result.returncode == 0 and result.stdout.strip() and not result.stderr.strip(), result.stderr
    assert _listing(tmp_path) == []


def readme_commands() -> list[list[str]]:
    """Every `python SCRIPT.py ...` command of the documents (code blocks and inline code), continuation lines
    joined."""
    docs = [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]
    text = "\n".join(open(doc).read() for doc in docs).replace("\\\n", " ")
    commands = re.findall(r"(?m)^\s*(python [^\n#`]+)", text) + re.findall(r"`(python [^`]+)`", text)
    out = []
    for command in commands:
        argv = shlex.split(command.split("  #")[0])
        if len(argv) > 1 and argv[1].endswith(".py") and "[" not in command and "…" not in command:
            out.append(argv[1:])
    return out


def test_readme_commands_parse_with_their_scripts(monkeypatch):
    """Each documented command of a config script loads its config (keys, types, files, validation) as written."""
    monkeypatch.chdir(ROOT)
    seen = set()
    for argv in readme_commands():
        script = argv[0][:-3]  # a top-level script; data/*/prepare.py are other entry points
        if script not in CONFIG_SCRIPTS:
            assert os.path.exists(os.path.join(ROOT, argv[0])), argv
            continue
        module = importlib.import_module(script)
        if any(a in ("-h", "--help") for a in argv):
            assert run_cli(module.main, argv[1:]) == 0, argv
        else:
            load_config(getattr(module, CONFIG_SCRIPTS[script]), split_threads(argv[1:])[1])
        seen.add(script)
    assert seen == set(CONFIG_SCRIPTS)


@pytest.mark.slow
def test_readme_torchrun_command_trains_with_two_gloo_processes(char_data_dir, tmp_path):
    """The README's multi-GPU line, CPU-shrunk (same files, gradient_accumulation_steps left at its default 1):
    the global accumulation is rounded up to the 2 processes and training runs."""
    text = open(os.path.join(ROOT, "README.md")).read()
    (line,) = {m for m in re.findall(r"torchrun [^`\n]+", text)}
    argv = shlex.split(line)
    assert argv[:3] == ["torchrun", "--standalone", "--nproc_per_node=8"]
    shrink = [*TINY_MODEL, "--device=cpu", "--compile=False", "--dtype=float32", "--max_iters=6", "--eval_interval=3",
              f"--data_dir={char_data_dir}", f"--out_dir={tmp_path}"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           *[os.path.join(ROOT, a) for a in argv[3:]], *shrink]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("RANK", None)
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "gradient_accumulation_steps=1 rounded up to 2" in result.stdout
    records = read_metrics(os.path.join(tmp_path, "metrics.jsonl"))
    assert records[-1]["val/loss"] < records[0]["val/loss"]



def test_threads_option_is_parsed_once_for_every_command(monkeypatch):
    from lgpt.plumbing import devices
    assert split_threads(["--a=1", "--threads=3", "b.py"]) == (3, ["--a=1", "b.py"])
    assert split_threads(["--a=1"]) == (None, ["--a=1"])
    for bad in ("0", "-1", "two", "", "1025", "100000000000000000000"):  # the last overflowed natively once
        with pytest.raises(Exception, match="must be an integer from 1 to 1024"):
            split_threads([f"--threads={bad}"])
    import torch
    before = torch.get_num_threads()
    try:
        assert devices.use_threads(2) == 2 and torch.get_num_threads() == 2
        assert devices.THREADS_NOTE == "CPU threads: 2 (--threads; --threads=N chooses)"
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert devices.use_threads(None) == 1 and "OMP_NUM_THREADS" in devices.THREADS_NOTE
        monkeypatch.delenv("OMP_NUM_THREADS")
        monkeypatch.setattr(devices, "busy_cores", lambda: (os.cpu_count() or 1) - 0.2)  # all but one core busy
        assert devices.use_threads(None) == 1 and "cores busy when it started" in devices.THREADS_NOTE
        monkeypatch.setattr(devices, "busy_cores", lambda: 0.0)  # an idle machine: torch's default
        assert devices.use_threads(None) == before
    finally:
        torch.set_num_threads(before)


def test_busy_cores_reads_the_machine():
    from lgpt.plumbing import devices
    busy = devices.busy_cores(0.05)
    assert busy is None or 0.0 <= busy <= (os.cpu_count() or 1)


def test_a_command_says_its_threads_in_its_first_line_and_a_bad_value_is_one_error(trained_dir, tmp_path):
    cmd = [sys.executable, os.path.join(ROOT, "transform.py"), f"--in_dir={trained_dir}", "--width=16",
           f"--out_dir={tmp_path / 'out'}", "--eval_iters=1"]
    done = subprocess.run(cmd + ["--threads=1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "CPU threads: 1 (--threads; --threads=N chooses)", done.stdout
    bad = subprocess.run(cmd + ["--threads=0", f"--out_dir={tmp_path / 'bad'}"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 1 and bad.stderr.strip().startswith("error: --threads='0' must be an integer from 1")
    assert bad.stdout == "" and not (tmp_path / "bad").exists()


def test_help_joins_continued_comments_and_keeps_finetune_options_to_finetune(capsys):
    import finetune
    import train
    assert run_cli(train.main, ["--help"]) == 0
    text = capsys.readouterr().out
    assert "--init_state" not in text and "--rewarm_iters" not in text
    dtype = next(line for line in text.splitlines() if line.lstrip().startswith("--dtype="))
    assert dtype.endswith("(bfloat16 autocast works on the CPU too; float16 needs a GPU)")
    assert "\n(bfloat16" not in text and "original run's start) and" not in text.split("--init_state")[0]
    assert run_cli(finetune.main, ["--help"]) == 0
    text = capsys.readouterr().out
    line = next(line for line in text.splitlines() if line.lstrip().startswith("--init_state="))
    assert "max_iters counts from the original run's start) and the AdamW moments" in line
