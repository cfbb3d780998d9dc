"""
The one command-line wrapper of every entry point: ``run_cli(main)`` runs ``main(sys.argv[1:])`` and turns

- ``-h`` / ``--help`` into the generated help on stdout, exit 0, nothing run or written;
- a ``ProjectError`` (bad config, data, checkpoint, transform, ...) into one line ``error: ...`` on
  stderr and exit 1, instead of a traceback;
- a write that found the disk full (or a quota or file-size limit) into one line too;
- an interrupted run (Ctrl-C or SIGTERM; the training loop saved a checkpoint marked incomplete) into
  exit 130, as shells expect, so scripts and the experiment harness never take it for a finished run.
"""
from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable

from configurator import HelpRequested
from errors import ProjectError

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # no space, over quota, over the file-size limit


class Interrupted(Exception):  # noqa: N818 - a control-flow signal
    """A run stopped early on SIGINT/SIGTERM after saving; the caller must not treat it as complete."""


def run_cli(main: Callable[[list[str]], object], argv: list[str] | None = None) -> int:
    """Run ``main`` as a command; returns the exit code (the scripts pass it to ``sys.exit``)."""
    try:
        main(sys.argv[1:] if argv is None else argv)
    except HelpRequested as h:
        print(h.text, end="")
        return 0
    except Interrupted as e:
        print(f"interrupted: {e}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
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
