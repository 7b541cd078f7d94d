"""tracking/faults.py: which failures are the surroundings', and the line each becomes."""

from __future__ import annotations

import errno

from apps_bench.tracking.faults import EXIT_FAILED, EXIT_INTERRUPTED, fault_of
from apps_bench.tracking.sqlite_store import StoreError

URI = "http://127.0.0.1:5000"


def test_an_interrupt_is_exit_130():
    fault = fault_of(KeyboardInterrupt())
    assert fault is not None and fault.code == EXIT_INTERRUPTED and fault.line("X is kept.").startswith("interrupted.")


def test_a_full_disk_is_found_under_the_errors_that_wrap_it():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/data/cell")
        except OSError as inner:
            raise RuntimeError("the engine stopped") from inner
    except RuntimeError as outer:
        fault = fault_of(outer, URI)
    assert fault is not None and fault.code == EXIT_FAILED
    line = fault.line("Every record is kept.")
    assert line.startswith("no space left on the disk (/data/cell)") and "Every record is kept. Free space" in line


def test_a_read_only_path_and_a_store_error_keep_their_fix():
    ro = fault_of(OSError(errno.EROFS, "Read-only file system", "/ro/cell"))
    assert ro is not None and "cannot write /ro/cell: it is on a read-only file system" in ro.what and "out_dir=" in ro.fix
    said = "the MLflow server at http://x does not answer; nothing was created. Start it"
    store = fault_of(StoreError(said))
    assert store is not None and store.line("") == said + "."


def test_a_missing_file_of_the_command_is_not_the_store_nor_the_surroundings():
    assert fault_of(FileNotFoundError(errno.ENOENT, "No such file or directory", "plots/x.png"), URI) is None
    assert fault_of(ValueError("a bug"), URI) is None


def test_a_refused_connection_to_the_store_is_said_in_one_phrase():
    import requests

    exc = requests.exceptions.ConnectionError(
        "HTTPConnectionPool(host='127.0.0.1', port=5000): Max retries exceeded with url: /api/2.0/mlflow/runs/get "
        "(Caused by NewConnectionError(\"HTTPConnection(host='127.0.0.1', port=5000): Failed to establish a new "
        'connection: [Errno 111] Connection refused"))'
    )
    fault = fault_of(exc, URI)
    assert fault is not None
    assert fault.what == f"the MLflow store at {URI} does not answer any more ([Errno 111] Connection refused)"
