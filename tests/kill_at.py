"""Kill a child process at an event it reaches, not after a number of seconds.

A test runs its child through `python -c "import kill_at; ..."` (`kill_at.wrap(...)`) with
`APPS_TEST_KILL_AT` set; the child SIGKILLs its own process group (the test starts it with
`start_new_session=True`) at that event, so the same kill lands in the same state however busy
the machine is:

- `sql:N` — just before the Nth SQL statement any SQLAlchemy engine of the process executes
  (MLflow's migrations, its run and param inserts);
- `sql:N:TEXT` — just before the Nth statement whose text contains TEXT (e.g. `INSERT INTO params`);
- `record:N` — just after the Nth record a cell appends to its records.jsonl (RecordStore.append);
- `record:N:run` — the same, once the cell's MLflow run is also open: the run opens on a thread of
  its own while the first problems are solved, so `record:N` alone may land before the run exists;
- `record:N:sigint` — a Ctrl-C instead of the kill: SIGINT to the whole process group (as a terminal
  sends it) just after the Nth record, and the child goes on to handle it.

With `APPS_TEST_KILL_COUNT=PATH` and no kill, the child writes at exit how many statements it ran
(`{"sql": [first words of each statement, ...], "records": n}`), so a test can spread its kill
points over the whole of a run it has counted.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading

KILL_AT = "APPS_TEST_KILL_AT"
KILL_COUNT = "APPS_TEST_KILL_COUNT"
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def wrap(code: str) -> list[str]:
    """argv running `code` in a child that has installed this module's hooks first."""
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {TESTS_DIR!r}); import kill_at; kill_at.install()\n{code}"]


def cli(module: str = "apps_bench") -> list[str]:
    """argv prefix for `python -m MODULE ARGS...` with the hooks installed (append ARGS)."""
    return wrap(f"import runpy; sys.argv[0] = {module!r}; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")


def _die() -> None:
    sys.stdout.flush()
    os.killpg(os.getpgrp(), signal.SIGKILL)


def install() -> None:
    """Install the hooks `APPS_TEST_KILL_AT` / `APPS_TEST_KILL_COUNT` ask for (nothing otherwise)."""
    spec, count_path = os.environ.get(KILL_AT, ""), os.environ.get(KILL_COUNT, "")
    kind, _, rest = spec.partition(":")
    n_text, _, text = rest.partition(":")
    target = int(n_text) if n_text else 0
    seen = {"sql": [], "records": 0}
    if kind == "sql" or count_path:
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        matched = [0]

        def before(conn, cursor, statement, parameters, context, executemany) -> None:
            seen["sql"].append(" ".join(statement.split()[:3]))
            if kind == "sql" and text in statement:
                matched[0] += 1
                if matched[0] == target:
                    _die()

        event.listen(Engine, "before_cursor_execute", before)
    if kind == "record" or count_path:
        from apps_bench.tracking.records import RecordStore

        original = RecordStore.append
        run_open = _watch_run_open() if kind == "record" and text == "run" else None
        one_at_a_time = threading.Lock()  # records are appended from worker threads: no other lands while the Nth waits

        def append(self, *args, **kwargs) -> None:
            with one_at_a_time:
                original(self, *args, **kwargs)
                seen["records"] += 1
                if kind == "record" and seen["records"] == target:
                    if run_open is not None:
                        run_open.wait(timeout=600)
                    if text == "sigint":
                        os.killpg(os.getpgrp(), signal.SIGINT)
                    else:
                        _die()

        RecordStore.append = append  # type: ignore[method-assign]
    if count_path:
        atexit.register(lambda: open(count_path, "w").write(json.dumps(seen)))


def _watch_run_open() -> threading.Event:
    """An event set once a cell's MLflow run has been created or found again (CellRun.open returned)."""
    from apps_bench.tracking.mlflow import CellRun

    opened = threading.Event()
    original = CellRun.open.__func__

    def open_(cls, *args, **kwargs):
        run = original(cls, *args, **kwargs)
        opened.set()
        return run

    CellRun.open = classmethod(open_)  # type: ignore[method-assign]
    return opened
