"""DDP with 2 gloo processes started as torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR/PORT): a stop signal
on any rank saves one checkpoint marked incomplete and every rank exits 130; a rank whose loss is not finite
stops every rank with one error, none left waiting in a collective."""
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT, TINY_MODEL
from lgpt.plumbing.checkpoint import load_checkpoint
from test_train import read_until

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv: list[str], world: int = 2) -> list[subprocess.Popen]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                      cwd=ROOT))
    return procs


def finish(procs: list[subprocess.Popen], timeout: float = 90) -> list[tuple[int, str]]:
    out = []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a DDP process hung")
        out.append((p.returncode, text))
    return out


@pytest.mark.parametrize("who", ["every rank", "rank 1 only"])
def test_a_stop_signal_on_any_rank_saves_one_checkpoint_and_every_rank_exits_130(char_data_dir, tmp_path, who):
    procs = launch([sys.executable, "train.py", *TINY_MODEL, f"--data_dir={char_data_dir}", f"--out_dir={tmp_path}",
                    "--device=cpu", "--max_iters=100000", "--eval_interval=100000"])
    read_until(procs[0], "iter 5:")
    for p in procs if who == "every rank" else procs[1:]:  # torchrun forwards a SIGTERM to every worker
        p.send_signal(signal.SIGTERM)
    results = finish(procs)
    assert [code for code, _ in results] == [130, 130], results
    assert all("Traceback" not in text for _, text in results), results
    ckpt = load_checkpoint(str(tmp_path))
    assert ckpt["complete"] is False and ckpt["interrupted"] == "SIGTERM" and ckpt["iter_num"] >= 5


def test_a_rank_whose_loss_is_not_finite_stops_every_rank_with_one_error(char_data_dir, tmp_path):
    driver = tmp_path / "diverge_on_rank_1.py"
    driver.write_text(textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {ROOT!r})
        import torch, train
        from lgpt.plumbing.cli import run_cli
        if os.environ["RANK"] == "1":  # this rank alone sees a non-finite loss from iteration 3 on
            forward = train.GPT.forward
            def poisoned(self, *a, **k):
                out = forward(self, *a, **k)
                if self.training and poisoned.calls >= 3 and out[1] is not None:
                    out = (out[0], out[1] * float("nan"))
                poisoned.calls += self.training
                return out
            poisoned.calls = 0
            train.GPT.forward = poisoned
        raise SystemExit(run_cli(train.main))
    """))
    procs = launch([sys.executable, str(driver), *TINY_MODEL, f"--data_dir={char_data_dir}", f"--out_dir={tmp_path}/o",
                    "--device=cpu", "--max_iters=50", "--eval_interval=100"])
    results = finish(procs)
    assert [code for code, _ in results] == [1, 1], results
    for _, text in results:
        assert "error: training loss is not finite (nan or inf) at iter 3" in text and "Traceback" not in text, text
