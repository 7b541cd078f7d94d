"""The pipe between the cell and a solver process (solver_pool.Wire): its two threads, and when the
pipe may be closed."""

from __future__ import annotations

import multiprocessing
import threading

from apps_bench.cell.solver_pool import Wire


def test_the_pipe_stays_open_while_its_reader_is_mid_message_and_closes_after_both_threads():
    """Ctrl-C closes the wire while its reader is still busy (here: handling a message). Closing the pipe
    then would hand the reader's next recv() a closed handle (a TypeError traceback on the user's
    terminal, seen on a sequential_crewai Ctrl-C) or a reused descriptor: the pipe is closed only once
    the reader is done with it too."""
    ours, theirs = multiprocessing.Pipe(duplex=True)
    handling, release = threading.Event(), threading.Event()
    got, closed = [], threading.Event()

    def on_message(msg: object) -> None:
        got.append(msg)
        handling.set()
        release.wait(30)

    wire = Wire(ours, on_message, closed.set, "test")
    wire.start()
    theirs.send(("solved", 1))
    assert handling.wait(30)
    wire.close()  # the writer ends and shuts the pipe down...
    wire._writer.join(30)
    assert not wire._writer.is_alive()
    assert theirs.poll(30) and _eof(theirs)  # ...so the other side sees EOF at once
    assert not ours.closed  # ...but the reader still holds the pipe: not closed under it
    release.set()
    wire._reader.join(30)
    assert closed.is_set() and ours.closed and got == [("solved", 1)]


def _eof(conn) -> bool:
    try:
        conn.recv()
    except EOFError:
        return True
    return False
