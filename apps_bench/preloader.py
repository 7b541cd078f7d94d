"""The preloader: a process forked at the command's start that imports the agent framework
while the main process composes the config and sets the cell up; the solver helpers are
then forked from it instead of from the main process.

Why: importing the framework (LangGraph + LangChain + the OpenAI SDK: ~3 s of one core)
was the longest step of a cell's start, and the main process could do nothing else
meanwhile. Forked before Hydra is imported, the preloader holds no thread, pipe or
socket of the main process. It guesses the cell's topology from the command line
(`topology=NAME`, else conf/config.yaml's default) to import early; the composed cell's
own topology is built when the helpers are ordered (a wrong guess costs only time). A
preloader that cannot serve (its import failed, it died) sends the main process back to
importing in-process, which reports any real error the way it always does.

With preloaded helpers the main process never imports the framework: it hands problems
out, runs the helpers' `python_exec` calls in its sandbox pool, judges and records
(solving.SolverProcesses, the same wire and helper body as helpers forked in-process).
Helpers get the problems without their tests: they frame and solve, judging stays in
the main process. Lifetimes chain: helpers die with the preloader, the preloader with
the main process (PR_SET_PDEATHSIG), and the preloader stays until its helpers exit.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import signal
import sys
from pathlib import Path
from typing import Any, Sequence

CONFIG = Path(__file__).resolve().parent / "conf" / "config.yaml"

READY_TIMEOUT_S = 600.0  # for the import and the forks; a preloader slower than this is given up on

_CURRENT: Preloader | None = None


class Preloader:
    """The main process's handle on the preloader: its pid and control connection."""

    def __init__(self, pid: int, conn: Any) -> None:
        self.pid = pid
        self.conn = conn

    def spawn(
        self, n: int, problems: Sequence[Any], *, cfg: dict[str, Any], endpoint: Any, prompts: Any, threads: int
    ) -> list[tuple[int, Any, str]] | None:
        """Have the preloader fork `n` helpers for `problems`: [(pid, connection, name)], or
        None (and the preloader ended) when it cannot."""
        from multiprocessing.connection import Pipe
        from multiprocessing.reduction import send_handle

        pairs = [Pipe(duplex=True) for _ in range(n)]
        order = {
            "cfg": cfg,
            "problems": [_without_tests(p) for p in problems],
            "endpoint": dataclasses.replace(endpoint, server=None) if dataclasses.is_dataclass(endpoint) else endpoint,
            "prompts": prompts,
            "threads": threads,
            "n": n,
        }
        try:
            self.conn.send(order)
            for _, theirs in pairs:
                send_handle(self.conn, theirs.fileno(), self.pid)
            reply = self.conn.recv() if self.conn.poll(READY_TIMEOUT_S) else ("error", "no answer")
        except (OSError, EOFError):
            reply = ("error", "the preloader process is gone")
        except Exception as exc:  # noqa: BLE001 - e.g. an order that does not pickle: solve in-process
            reply = ("error", f"{type(exc).__name__}: {exc}")
        finally:
            for _, theirs in pairs:
                theirs.close()
        if reply[0] != "forked":
            for mine, _ in pairs:
                mine.close()
            self.discard()
            print(f"apps-bench: the preloader could not start the solvers ({reply[1]}); "
                  "importing the framework here instead", file=sys.stderr)  # fmt: skip
            return None
        return [(pid, mine, f"helper-{i + 1}") for i, (pid, (mine, _)) in enumerate(zip(reply[1], pairs, strict=True))]

    def discard(self) -> None:
        """End an unused preloader now (it holds nothing of the cell's)."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.close()

    def close(self, deadline: float | None = None) -> None:
        """Hang up; the preloader exits once its helpers have (SIGKILL at `deadline`, default 2 s from now)."""
        import time

        from apps_bench.solving import end_child

        try:
            self.conn.close()
        except OSError:
            pass
        end_child(self.pid, time.monotonic() + 2.0 if deadline is None else deadline)


def _without_tests(problem: Any) -> Any:
    tests = getattr(problem, "tests", None)
    if tests is None or not dataclasses.is_dataclass(problem):
        return problem
    return dataclasses.replace(problem, tests=dataclasses.replace(tests, inputs=(), outputs=()), solutions=())


def guess_topology(argv: Sequence[str]) -> str:
    """The topology a command line will compose to: its `topology=` override, else the default."""
    for arg in reversed(argv):
        key, _, value = arg.lstrip("+").partition("=")
        if key == "topology" and value:
            return value
    import yaml

    for entry in yaml.safe_load(CONFIG.read_text()).get("defaults", []):
        if isinstance(entry, dict) and "topology" in entry:
            return str(entry["topology"])
    return ""


def start(argv: Sequence[str]) -> None:
    """Fork the preloader (call first thing: no threads, pipes or sockets exist yet)."""
    global _CURRENT
    if _CURRENT is not None or not hasattr(os, "fork") or not sys.platform.startswith("linux"):
        return
    from multiprocessing.connection import Pipe

    mine, theirs = Pipe(duplex=True)
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        mine.close()
        _preloader_main(theirs, list(argv), parent)
    theirs.close()
    _CURRENT = Preloader(pid, mine)


def take() -> Preloader | None:
    """The preloader this command started, once (None if none): the caller spawns from it or closes it."""
    global _CURRENT
    pre, _CURRENT = _CURRENT, None
    return pre


def _preloader_main(conn: Any, argv: list[str], parent: int) -> None:
    from apps_bench.solving import _die_with_parent

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    _die_with_parent()
    if os.getppid() != parent:  # the main process died before prctl took effect
        os._exit(1)
    code = 0
    try:
        _serve(conn, argv)
    except BaseException:  # noqa: BLE001 - nothing of the preloader's may reach the main process's handlers
        code = 1
    finally:
        os._exit(code)


def _serve(conn: Any, argv: list[str]) -> None:
    from multiprocessing.reduction import recv_handle

    _preload(argv)
    try:
        order = conn.recv()
    except EOFError:  # the cell ended without solvers (refused, failed, nothing to run)
        return
    fds = [recv_handle(conn) for _ in range(int(order["n"]))]
    try:
        solve = _solver(order)
    except Exception as exc:  # noqa: BLE001 - reported; the main process then solves in-process
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    gc.freeze()  # the imports' objects: shared with the helpers, never rescanned
    gc.enable()
    from multiprocessing.connection import Connection

    from apps_bench.solving import _helper_main

    me, pids = os.getpid(), []
    for i, fd in enumerate(fds):
        pid = os.fork()
        if pid == 0:
            for other in fds:
                if other != fd:
                    os.close(other)
            conn.close()
            _helper_main(Connection(fd), order["problems"], solve, int(order["threads"]), me, f"helper-{i + 1}")
        pids.append(pid)
    for fd in fds:
        os.close(fd)
    conn.send(("forked", pids))
    while True:  # the helpers die with this process: stay until they are done
        try:
            os.wait()
        except ChildProcessError:
            return


def _preload(argv: list[str]) -> None:
    """Import what solving the command's topology needs, best effort: the order builds the
    cell's own topology, and a failure that matters is raised then."""
    try:
        import importlib

        from apps_bench.topologies.registry import RUNNERS, require_framework

        topology = guess_topology(argv)
        spec = RUNNERS[topology]
        require_framework(spec.framework, topology)
        importlib.import_module(spec.target.split(":")[0])
        import omegaconf  # noqa: F401

        import apps_bench.models  # noqa: F401
        import apps_bench.sandbox.tool  # noqa: F401
        import apps_bench.topologies.context  # noqa: F401
    except Exception:  # noqa: BLE001 - see the docstring
        pass


def _solver(order: dict[str, Any]) -> Any:
    from functools import partial

    from omegaconf import OmegaConf

    from apps_bench.solving import solve_problem
    from apps_bench.topologies.registry import get_topology

    node = OmegaConf.create(order["cfg"])
    topology = get_topology(node.topology)
    return partial(solve_problem, cfg=node, topology=topology, endpoint=order["endpoint"], prompts=order["prompts"])
