"""
The one command-line wrapper of every entry point: ``run_cli(main)`` runs ``main(sys.argv[1:])`` and turns

- ``-h`` / ``--help`` into the generated help on stdout, exit 0, nothing run or written;
- a ``ProjectError`` (bad config, data, checkpoint, transform, ...) into one line ``error: ...`` on
  stderr and exit 1, instead of a traceback;
- a write that found the disk full (or a quota or file-size limit) into one line too;
- an interrupted run (Ctrl-C, SIGTERM or SIGHUP; the training loop saved a checkpoint marked incomplete) into
  exit 130, as shells expect, so scripts and the experiment harness never take it for a finished run; SIGTERM and
  SIGHUP raise an exception like Ctrl-C does, so a command stopped by them cleans up what it was writing;
- ``--threads=N`` (any command) into torch's CPU thread count; without it the command takes the cores that are
  idle when it starts (``devices.use_threads``), so a busy machine slows it down gracefully.
"""
from __future__ import annotations

import errno
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from lgpt.plumbing.configurator import HelpRequested
from lgpt.plumbing.devices import use_threads
from lgpt.plumbing.errors import ConfigError, ProjectError

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # no space, over quota, over the file-size limit


class Interrupted(Exception):  # noqa: N818 - a control-flow signal
    """A run stopped early on SIGINT/SIGTERM/SIGHUP after saving; the caller must not treat it as complete."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the command is, as Ctrl-C raises KeyboardInterrupt: every ``finally`` and
    staged write (checkpoint.staged_dir, hold_run_dir) cleans up instead of the process vanishing mid-write."""


def raise_terminated(signum: int, _frame) -> None:
    raise Terminated(signal.Signals(signum).name)


@contextmanager
def termination_as_exception() -> Iterator[None]:
    """SIGTERM and SIGHUP raise ``Terminated`` while the command runs (the training loop installs its own handler,
    which saves first); the previous handlers come back afterwards. Only the main thread can set handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with signal_handlers((signal.SIGTERM, signal.SIGHUP), raise_terminated):
        yield


@contextmanager
def signal_handlers(signals: tuple[signal.Signals, ...], handler) -> Iterator[None]:
    """``handler`` for ``signals`` inside the block, the previous handlers back afterwards."""
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


THREADS_HELP = ("\ncommon to every command:\n  --threads=N  CPU threads for torch (default: OMP_NUM_THREADS if set, "
                "else the cores idle when the command starts)\n")


MAX_THREADS = 1024  # torch takes a C int and OpenMP allocates per thread: a huge count crashes natively


def split_threads(argv: list[str]) -> tuple[int | None, list[str]]:
    """(the --threads value or None, argv without it); a value that is not a positive integer is a ConfigError."""
    value, rest = None, []
    for arg in argv:
        if arg.startswith("--threads="):
            text = arg.split("=", 1)[1]
            if not text.isdigit() or not 1 <= int(text) <= MAX_THREADS:
                raise ConfigError(f"--threads={text!r} must be an integer from 1 to {MAX_THREADS} (CPU threads for "
                                  f"torch; this machine has {os.cpu_count()} cores)")
            value = int(text)
        else:
            rest.append(arg)
    return value, rest


def one_line_warning(message, category, filename, lineno, line=None) -> str:
    """A warning as a command shows it: ``warning: ...`` in one line, without Python's path and source line."""
    return f"warning: {' '.join(str(message).split())}\n"


def run_cli(main: Callable[[list[str]], object], argv: list[str] | None = None) -> int:
    """Run ``main`` as a command; returns the exit code (the scripts pass it to ``sys.exit``)."""
    warnings.formatwarning = one_line_warning
    try:
        threads, args = split_threads(sys.argv[1:] if argv is None else argv)
        use_threads(threads)
        with termination_as_exception():
            main(args)
    except HelpRequested as h:
        print(h.text + THREADS_HELP, end="")
        return 0
    except Interrupted as e:
        print(f"interrupted: {e}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt as e:
        print(f"interrupted ({e}): nothing half-written was left" if isinstance(e, Terminated) else "interrupted",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except ProjectError as e:
        message = " ".join(str(e).split("\n"))
        print(f"error: {message}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as e:
        if e.errno not in DISK_FULL:
            raise
        where = f"'{e.filename}'" if e.filename else "an output file"
        print(f"error: could not write {where} ({os.strerror(e.errno)}): free disk space or choose another "
              "--out_dir; files written completely before this one are intact", file=sys.stderr)
        return EXIT_ERROR
    return 0
