"""What every command-line entry point of the project shares: a reader that stops reading is not an error.

`python -m ops.capacity … | head` closes the pipe after ten lines; Python then raises BrokenPipeError at
the next write, and again when it flushes stdout at exit, so the user sees a traceback for what is the
normal end of a pipeline. `emit` writes and, once the reader is gone, drops the rest quietly; `run`
wraps a `main` so any write that still meets a closed pipe ends the program the way a shell expects
(status 141, 128 + SIGPIPE), with no traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

EXIT_PIPE = 141


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the flush at exit does not raise again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def emit(text: str) -> bool:
    """Print text to stdout; False (and nothing more is printed) when the reader has closed the pipe."""
    try:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
        return True
    except BrokenPipeError:
        _silence_stdout()
        return False


def run(main: Callable[[], int | None]) -> None:
    """Run a CLI's main and exit with its status; a closed pipe ends it with 141 and no traceback."""
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
        status = EXIT_PIPE
    sys.exit(status or 0)
