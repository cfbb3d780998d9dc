"""Metrics to the console, to ``out_dir/metrics.jsonl`` (one JSON object per line) and to wandb.

wandb runs offline unless WANDB_MODE says otherwise, so logging never needs a login or a network.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time


def _plain(value):
    """JSON-safe scalars: tensors to floats, non-finite floats to strings."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def progress(iterable, desc: str, total: int | None = None, unit: str = "it"):
    """``iterable`` with a progress line and ETA on stderr (tqdm): for every step that can take minutes on a real
    model (calibration, refit, the learned map, evaluation). Shown once the step has run 2 s (10 s in a log file, so
    quick steps and one-line errors stay clean), then redrawn at most every second (every 30 s in a log file);
    NANOLGPT_PROGRESS=0 turns it off."""
    from tqdm import tqdm
    tty = sys.stderr.isatty()
    return tqdm(iterable, desc=desc, total=total, unit=unit, leave=False, dynamic_ncols=tty,
                mininterval=1.0 if tty else 30.0, delay=2.0 if tty else 10.0,  # a step done sooner prints nothing
                disable=os.environ.get("NANOLGPT_PROGRESS") == "0")


class MetricsLogger:
    def __init__(self, out_dir: str, enabled: bool = True, wandb_log: bool = False, project: str = "nanolgpt",
                 run_name: str | None = None, config: dict | None = None, filename: str = "metrics.jsonl"):
        self.enabled = enabled
        self.path = os.path.join(out_dir, filename)
        self.wandb = None
        if not enabled:
            return
        os.makedirs(out_dir, exist_ok=True)
        if wandb_log:
            import wandb
            mode = os.environ.get("WANDB_MODE", "offline")
            try:  # silent: wandb's own ~30 lines of banners would bury the command's output; one line instead
                self.wandb = wandb.init(project=project, name=run_name, config=config, mode=mode,
                                        dir=os.environ.get("WANDB_DIR", out_dir), settings=wandb.Settings(silent=True))
            except Exception as e:  # noqa: BLE001 - online without a network or a key, a bad mode: one line
                from lgpt.plumbing.errors import ConfigError
                raise ConfigError(f"wandb could not start (WANDB_MODE={mode}: {e.__class__.__name__}: "
                                  f"{str(e).splitlines()[0][:200] if str(e) else ''}); set WANDB_MODE=offline, "
                                  "log in with `wandb login`, or pass --wandb_log=False") from None

    def log(self, record: dict, step: int | None = None) -> None:
        if not self.enabled:
            return
        record = {k: _plain(v) for k, v in record.items()}
        line = dict(record, time=round(time.time(), 3))
        if step is not None:
            line["iter"] = step
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in record.items() if isinstance(v, (int, float))}, step=step)

    def log_images(self, images: dict[str, str]) -> None:
        if self.wandb is not None:
            import wandb
            self.wandb.log({name: wandb.Image(path) for name, path in images.items()})

    def summary(self, values: dict) -> None:
        if self.wandb is not None:
            for k, v in values.items():
                self.wandb.summary[k] = _plain(v)

    def finish(self) -> None:
        if self.wandb is not None:
            where, offline = self.wandb.dir, self.wandb.settings.mode == "offline"
            self.wandb.finish()
            self.wandb = None
            run_dir = os.path.dirname(where.rstrip(os.sep))  # .../wandb/offline-run-…/files → the run directory
            print(f"wandb: logged offline to {run_dir} (`wandb sync {run_dir}` uploads it)" if offline
                  else f"wandb: logged to {run_dir}")


def read_metrics(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def drop_rows_after(path: str, iter_num: int) -> int:
    """Resuming at ``iter_num``: drop the rows a run logged past its last checkpoint (it stopped without saving
    them: killed, or its save failed), so the resumed run's rows are not logged twice. Kept: every row before
    ``iter_num`` and the evaluation at ``iter_num`` that the checkpoint was saved with. Returns the rows dropped."""
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    kept = []
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut off by the stop
        step = row.get("iter", -1)
        if step < iter_num or (step == iter_num and "val/loss" in row):
            kept.append(line if line.endswith("\n") else line + "\n")
    if len(kept) < len(lines):
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.writelines(kept)
        os.replace(tmp, path)
    return len(lines) - len(kept)
