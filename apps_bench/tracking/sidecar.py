"""A cell's MLflow run, driven from a helper process.

Why: importing mlflow and talking to its store costs seconds of Python CPU. In the cell's
own process that time competes for the interpreter lock with the problems in flight; in
a helper process it runs on another core while the problems run. The helper speaks JSON
lines over its stdin/stdout (one request, one reply) and exits when its stdin closes, so
a killed cell never leaves it behind.

    python -m apps_bench.tracking.sidecar      (started by `CellRunProxy`, never by hand)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Mapping


class TrackingError(RuntimeError):
    """The MLflow store refused or failed a request; the message is the store's."""


class CellRunProxy:
    """Same calls as `tracking.mlflow.CellRun` (open, log_metrics, finish, fail), served by a helper process."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "apps_bench.tracking.sidecar"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,  # the store's warnings reach the user's terminal
            env=env,
            text=True,
            bufsize=1,
        )
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


def open_cell_run(**kwargs: Any) -> CellRunProxy:
    """Start a helper and open (or find again) the cell's run. Blocks on I/O only."""
    proxy = CellRunProxy()
    try:
        return proxy.open(**kwargs)
    except BaseException:
        proxy.close()
        raise


def serve() -> None:
    from apps_bench.tracking import mlflow as mlf

    run: mlf.CellRun | None = None
    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints of libraries must not corrupt the reply channel
    for line in sys.stdin:
        if not line.strip():
            continue
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
        if op == "open" and reply["ok"]:
            import pandas  # noqa: F401 - finish needs it (the per-problem table); load it while the cell runs


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
