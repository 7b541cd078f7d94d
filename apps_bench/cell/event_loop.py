"""`run(main)`: asyncio.run for the cell's loops, with a quiet teardown once the work is cut.

A cut (Ctrl-C in the cell process; the cell closing a solver worker) cancels problems in the
middle of a framework's graph. The frameworks' async generators then complain while they are torn
down ("Task exception was never retrieved", "coroutine ignored GeneratorExit", "aclose(): asynchronous
generator is already running"): dozens of tracebacks that say nothing about the cell, printed before
the one line that does (`__main__`'s "interrupted … rerun"). From the cut on, those reports go to
the `apps_bench.cell.event_loop` logger at DEBUG (shown with `hydra.verbose=apps_bench`); everything
before it is reported as asyncio always does. A `main` that fails (a full disk: every problem's
write fails, and the caller says so in one line) leaves its loop's teardown as quiet as a cut does.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
from collections.abc import Coroutine
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)
_cut = threading.Event()


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`. The first Ctrl-C cuts: `main` is cancelled, its teardown is quiet, and
    KeyboardInterrupt is raised once it has unwound; a second Ctrl-C raises at once."""
    with asyncio.Runner() as runner:
        loop = runner.get_loop()
        loop.set_exception_handler(_on_exception)
        task: list[asyncio.Task[T]] = []

        async def tracked() -> T:
            task.append(asyncio.current_task())  # type: ignore[arg-type]
            return await main

        def on_sigint(signum: int, frame: FrameType | None) -> None:
            if _cut.is_set() or not task:
                raise KeyboardInterrupt
            cut()
            loop.call_soon_threadsafe(task[0].cancel)

        own_signal = (  # as asyncio.Runner decides: never over a handler of someone else's, nor an ignored SIGINT
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        )
        if own_signal:
            signal.signal(signal.SIGINT, on_sigint)
        try:
            return runner.run(tracked())
        except asyncio.CancelledError:
            if _cut.is_set() and own_signal:
                raise KeyboardInterrupt from None
            raise
        except BaseException:  # `main` failed (a full disk, say): its teardown echoes that failure, quietly
            loop.set_exception_handler(_at_debug)
            sys.unraisablehook = _on_unraisable
            raise
        finally:
            if own_signal:
                signal.signal(signal.SIGINT, signal.default_int_handler)
            # leaving the Runner cancels what is left and closes the async generators: after a cut, quietly


def cut(*, mute: bool = False) -> None:
    """This process stops its work now: what the cut leaves half-run reports at DEBUG from here on.

    `mute`: for a solver worker whose cell hung up: the frameworks' own logs and prints about the
    calls they lose (CrewAI's banners, AutoGen's "Error processing publish message") go nowhere
    too, unless DEBUG is on for this module."""
    _cut.set()
    sys.unraisablehook = _on_unraisable
    if mute and not log.isEnabledFor(logging.DEBUG):
        sys.stdout.flush()
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)


def _on_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    if _cut.is_set():
        _at_debug(loop, context)
    else:
        loop.default_exception_handler(context)


def _at_debug(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    log.debug("after the cut: %s", context.get("message"), exc_info=context.get("exception"))


def _on_unraisable(unraisable: sys.UnraisableHookArgs) -> None:
    value = unraisable.exc_value
    exc_info = (unraisable.exc_type, value, unraisable.exc_traceback) if value is not None else None
    log.debug("after the cut: %s %r", unraisable.err_msg or "exception ignored in", unraisable.object, exc_info=exc_info)
