"""A command run as a terminal's foreground job: a process group of its own, so a Ctrl-C (SIGINT to the group)
reaches every process of it, as it does from a shell."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def own_group(args: list[str], cwd: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """`args` started in a new session, stdin closed, its output piped; whatever is left of its group is
    SIGKILLed on the way out (a test that failed midway leaves nothing running)."""
    proc = subprocess.Popen(
        args,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.wait()
