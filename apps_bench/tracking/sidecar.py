"""A cell's MLflow run, driven from a helper process.

Why: importing mlflow and talking to its store costs seconds of Python CPU. In the cell's
own process that time competes for the interpreter lock with the problems in flight; in
a helper process it runs on another core while the problems run. The helper speaks JSON
lines over its stdin/stdout (one request, one reply) and exits when its stdin closes, so
a killed cell never leaves it behind.

A single-cell command starts the helper first thing (`prestart`), so mlflow is imported
while the cell's process composes its config and imports the agent framework, not while
the first problems run; the cell's run then takes that helper over.

    python -m apps_bench.tracking.sidecar      (started by `prestart`/`CellRunProxy`, never by hand)
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Mapping

_PRESTARTED: subprocess.Popen[str] | None = None


class TrackingError(RuntimeError):
    """The MLflow store refused or failed a request; the message is the store's."""


class CellRunProxy:
    """Same calls as `tracking.mlflow.CellRun` (open, log_metrics, finish, fail), served by a helper process."""

    def __init__(self) -> None:
        global _PRESTARTED
        proc, _PRESTARTED = _PRESTARTED, None
        self._proc = proc if proc is not None and proc.poll() is None else _spawn()
        self._lock = threading.Lock()
        self.run_id = ""
        self.uri = ""
        self.resumed = False

    def _call(self, op: str, **args: Any) -> Any:
        with self._lock:
            assert self._proc.stdin is not None and self._proc.stdout is not None
            try:
                self._proc.stdin.write(json.dumps({"op": op, **args}, default=str) + "\n")
                self._proc.stdin.flush()
                line = self._proc.stdout.readline()
            except (BrokenPipeError, OSError) as exc:
                raise TrackingError(f"the MLflow helper process died ({exc})") from None
            if not line:
                raise TrackingError(f"the MLflow helper process exited (code {self._proc.poll()}) during {op}")
            reply = json.loads(line)
            if not reply.get("ok"):
                raise TrackingError(reply.get("error", "unknown error"))
            return reply.get("result")

    def open(self, **kwargs: Any) -> CellRunProxy:
        from apps_bench.tracking.mlflow import PARENT_RUN_ENV

        # the sweep's parent run is read here, not in the helper: a prestarted helper's
        # environment predates the sweep callback that sets it
        kwargs.setdefault("parent_run_id", os.environ.get(PARENT_RUN_ENV, "").strip() or None)
        res = self._call("open", **kwargs)
        self.run_id, self.uri, self.resumed = res["run_id"], res["uri"], res["resumed"]
        return self

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        self._call("log_metrics", metrics=dict(metrics), step=int(step))

    def finish(self, *, metrics, rows, files, complete, tags=None, dirs=None) -> None:  # type: ignore[no-untyped-def]
        self._call(
            "finish",
            metrics=dict(metrics),
            rows=list(rows),
            files=[str(f) for f in files],
            complete=bool(complete),
            tags=dict(tags or {}),
            dirs={k: str(v) for k, v in (dirs or {}).items()},
        )
        self.close()

    def fail(self, message: str) -> None:
        try:
            self._call("fail", message=message)
        finally:
            self.close()

    def close(self, wait: bool = False) -> None:
        """Close the helper's stdin; it exits on its own. Every request was answered before
        this returns, so the run is complete in the store: no need to wait for MLflow's own
        shutdown (seconds) unless asked."""
        if self._proc.poll() is None:
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.close()
                if wait:
                    self._proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()


def _spawn() -> subprocess.Popen[str]:
    env = dict(os.environ)
    env.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    return subprocess.Popen(
        [sys.executable, "-m", "apps_bench.tracking.sidecar"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=None,  # the store's warnings reach the user's terminal
        env=env,
        text=True,
        bufsize=1,
    )


def prestart() -> None:
    """Start the helper now; the next `CellRunProxy` of this process takes it over. Unused,
    it exits as soon as this process does (its stdin closes)."""
    global _PRESTARTED
    if _PRESTARTED is None or _PRESTARTED.poll() is not None:
        _PRESTARTED = _spawn()


def open_cell_run(**kwargs: Any) -> CellRunProxy:
    """Start a helper and open (or find again) the cell's run. Blocks on I/O only."""
    proxy = CellRunProxy()
    try:
        return proxy.open(**kwargs)
    except BaseException:
        proxy.close()
        raise


def _requests() -> queue.SimpleQueue[str | None]:
    """Read stdin on a thread, so the imports below can run before the first request.
    Closed before any request (the cell never opened its run: refused, failed, finished
    without one), there is nothing to finish: exit at once, even mid-import."""
    lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()

    def read() -> None:
        got = False
        for line in sys.stdin:
            if line.strip():
                got = True
                lines.put(line)
        if not got:
            os._exit(0)
        lines.put(None)

    threading.Thread(target=read, daemon=True, name="requests").start()
    return lines


def _warm_up() -> None:
    """The imports every cell's run needs (no store is touched: an unused helper may be cut off).
    The collector stays off while they run: they make only long-lived objects, and its passes
    over them cost ~0.7 s of this process's start (pipeline._settle_heap does the same)."""
    import gc

    gc.disable()
    from apps_bench.tracking import mlflow as mlf

    mlf._mlflow()
    from mlflow.tracking import MlflowClient  # noqa: F401

    if mlf.tracking_uri().split(":", 1)[0] in ("sqlite", "postgresql", "mysql", "mssql"):
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
    gc.freeze()
    gc.enable()


def serve() -> None:
    try:  # background work: mlflow's import and the store's I/O take the CPU the cell leaves
        os.nice(10)
    except (AttributeError, OSError):
        pass
    lines = _requests()
    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints of libraries must not corrupt the reply channel
    _warm_up()
    from apps_bench.tracking import mlflow as mlf

    run: mlf.CellRun | None = None
    while (line := lines.get()) is not None:
        req = json.loads(line)
        op = req.pop("op")
        try:
            if op == "open":
                run = mlf.CellRun.open(**req)
                result: Any = {"run_id": run.run_id, "uri": run.uri, "resumed": run.resumed}
            elif run is None:
                raise TrackingError(f"{op} before open")
            elif op == "log_metrics":
                run.log_metrics(req["metrics"], step=req["step"])
                result = None
            elif op == "finish":
                run.finish(
                    metrics=req["metrics"],
                    rows=req["rows"],
                    files=[Path(f) for f in req["files"]],
                    complete=req["complete"],
                    tags=req["tags"],
                    dirs={k: Path(v) for k, v in req["dirs"].items()},
                )
                result = None
            elif op == "fail":
                run.fail(req["message"])
                result = None
            else:
                raise TrackingError(f"unknown request {op!r}")
            reply = {"ok": True, "result": result}
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the cell as a message
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(reply, default=str) + "\n")
        out.flush()


if __name__ == "__main__":
    serve()
    # stdin closed: every request was answered, so the run is in the store (MLflow's calls here
    # are synchronous). Skip the interpreter's teardown of mlflow/pandas/SQLAlchemy (~1.5 s):
    # this process shares the cell's stderr, so a caller reading it (a pipe, `| tee`, a
    # benchmark) would wait for it.
    import logging
    import os

    logging.shutdown()
    sys.stderr.flush()
    os._exit(0)
