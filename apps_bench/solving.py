"""Solving one problem (frame -> topology.solve), here or in a forked helper process.

`solve_problem` is the one implementation of the solve step: it builds the problem's
metered model clients and its `python_exec` tool, runs the topology under the time cap,
and returns a `Solved` (attempt, transcript, usage, error) — whichever process it runs in.

Why helper processes: a cell's main process spends most of its CPU inside the agent
frameworks' and SDKs' Python code (request building, response parsing, graph
scheduling; ~20-50 ms per model call), all under one GIL, so at 16+ problems in flight
the second core sits idle while calls queue. `SolverProcesses` forks helpers *after*
the frameworks are imported (the import, ~4 s of CPU, is paid once and shared
copy-on-write) and *before* any event loop, sandbox pool or progress bar exists. A
helper solves the problems it is handed; its `python_exec` calls come back to the main
process's sandbox pool (one pool, one set of limits), and judging and recording stay
in the main process, so the records are the same whichever process solved a problem.
A helper that dies fails only the problems it held (recorded as errors, retried on the
next run); the main process goes on alone. A single-cell command forks its helpers from
the preloader instead (apps_bench/preloader.py: the import overlaps the cell's start);
then all solving is theirs, and the main process solves only once every one is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import queue
import signal
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

# Frameworks whose runners were checked to work in a forked helper (imported before the
# fork, no framework thread needed in the helper); a framework not listed solves in the
# main process only.
FORK_SAFE_FRAMEWORKS = frozenset({"langgraph", "openai", "autogen", "crewai"})


@dataclass
class Solved:
    """The outcome of the solve step for one problem (before judging)."""

    attempt: Any | None
    transcript: list[dict[str, Any]] = field(default_factory=list)
    usage: Any = None
    error: str | None = None
    solve_s: float = 0.0
    solver: str = "main"  # which process solved it: "main" or "helper-<n>"


def time_cap(topology_cfg: Any) -> float:
    """A safety net over the runner's own time limit (`topology.time_limit_s`)."""
    return float(topology_cfg.get("time_limit_s") or 600) * 1.5 + 30


async def solve_problem(
    problem: Any,
    *,
    cfg: Mapping[str, Any],
    topology: Any,
    endpoint: Any,
    pool: Any,
    prompts: Any = None,
    connections: Any = None,
    seed: int | None = None,
    headers: Mapping[str, str] | None = None,
) -> Solved:
    """Run the cell's topology on one problem; any failure becomes `Solved.error` (never raised).

    `connections`: the event loop's `SharedConnections` (one HTTP pool for all problems).
    `seed` defaults to the cell's; `headers` go with every model request (an optimizer's
    rollout tag). The attempt carries the problem's transcript events and usage."""
    from apps_bench.models import ModelClients
    from apps_bench.sandbox.tool import PythonExecTool
    from apps_bench.topologies.context import build_context
    from apps_bench.types import Attempt, Usage

    topo_cfg = cfg["topology"]
    tool_cfg = cfg["tool"]
    usage = Usage()
    attempt: Any = None
    error: str | None = None
    transcript: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    models = None
    try:
        models = ModelClients(endpoint, cfg["model"], usage, shared=connections, headers=dict(headers or {}) or None)
        tool = PythonExecTool(pool, float(tool_cfg["timeout_s"]), int(tool_cfg["output_chars"]), usage)
        ctx = build_context(
            problem, topo_cfg, models=models, tool=tool, seed=int(cfg["seed"] if seed is None else seed), usage=usage,
            prompts=prompts,
        )  # fmt: skip
        try:
            attempt = await asyncio.wait_for(topology.solve(ctx), timeout=time_cap(topo_cfg))
        except asyncio.TimeoutError:
            from apps_bench.topologies.team import unanswered_error

            attempt = Attempt(program=None, transcript=list(ctx.transcript), stop_reason="time_limit",
                              error=unanswered_error(usage, time_cap(topo_cfg)))
        if not attempt.transcript:
            attempt.transcript = list(ctx.transcript)
        attempt.usage = usage
        if attempt.error:
            error = str(attempt.error)
        transcript = [asdict(e) for e in attempt.transcript]
    except Exception as exc:  # noqa: BLE001 - any failure of one problem is recorded, never fatal to the cell
        error = f"{type(exc).__name__}: {exc}"
    finally:
        closer = getattr(models, "aclose", None)
        if closer is not None:
            try:
                await closer()
            except Exception:  # noqa: BLE001 - closing a client must not lose the record
                pass
    return Solved(attempt=attempt, transcript=transcript, usage=usage, error=error, solve_s=time.perf_counter() - t0)


def solver_threads(concurrency: int) -> int:
    """Threads for a solving process's default executor (tool calls, judging): two per problem in flight."""
    return concurrency * 2 + 8


def requested_processes(setting: Any) -> int | None:
    """`processes=<setting>` -> a count of solving processes, or None for `auto`."""
    if str(setting).strip().lower() == "auto":
        return None
    try:
        total = int(setting)
    except (TypeError, ValueError):
        raise ValueError(f"processes must be 'auto' or a positive integer, got {setting!r}") from None
    if total < 1:
        raise ValueError(f"processes must be 'auto' or a positive integer, got {setting!r}")
    return total


def helper_count(setting: Any, *, concurrency: int, n_problems: int, framework: str) -> int:
    """How many helper processes to fork for `processes=<setting>` (total solving processes).

    `auto` = one solving process per CPU core this process may use, never more than
    problems in flight or problems to run; frameworks not checked to be fork-safe, and
    platforms without fork, solve in the main process only.
    """
    total = requested_processes(setting)
    if total is None:
        try:
            total = len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - not Linux
            total = os.cpu_count() or 1
    if framework not in FORK_SAFE_FRAMEWORKS or not hasattr(os, "fork") or not sys.platform.startswith("linux"):
        return 0
    return max(0, min(total, concurrency, n_problems) - 1)


# ----------------------------------------------------------------------------- wire


class _Wire:
    """One end of a helper's socket pair: a thread that receives (messages -> `on_message`)
    and a thread that sends (so neither side's event loop ever blocks on a full socket)."""

    def __init__(self, conn: Any, on_message: Callable[[Any], None], on_close: Callable[[], None], name: str) -> None:
        self.conn = conn
        self._outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._on_message = on_message
        self._on_close = on_close
        self._reader = threading.Thread(target=self._read, name=f"{name}-recv", daemon=True)
        self._writer = threading.Thread(target=self._write, name=f"{name}-send", daemon=True)

    def start(self) -> None:
        self._reader.start()
        self._writer.start()

    def send(self, msg: Any) -> None:
        self._outbox.put(msg)

    def close(self) -> None:
        self._outbox.put(None)

    def _read(self) -> None:
        try:
            while True:
                self._on_message(self.conn.recv())
        except (EOFError, OSError):
            pass
        finally:
            self._on_close()

    def _write(self) -> None:
        try:
            while (msg := self._outbox.get()) is not None:
                try:
                    self.conn.send(msg)
                except (OSError, ValueError):
                    raise
                except Exception as exc:  # noqa: BLE001 - unpicklable: nothing was written; say so instead
                    if msg[0] != "solved":
                        raise
                    self.conn.send(("solved", msg[1], Solved(attempt=None, usage=msg[2].usage, error=f"solver process: cannot send the result back ({type(exc).__name__}: {exc})")))
        except (OSError, ValueError):  # the other end is gone; the reader reports it
            pass


# ----------------------------------------------------------------------------- helper side


class _ExecProxy:
    """The helper's stand-in for the sandbox pool: `python_exec` runs in the main process's pool."""

    def __init__(self) -> None:
        self.wire: _Wire | None = None
        self._ids = itertools.count()
        self._pending: dict[int, Future[Any]] = {}
        self._lock = threading.Lock()

    def python_exec(self, code: str, stdin: str = "", timeout_s: float = 10.0, output_chars: int = 4000) -> Any:
        fut: Future[Any] = Future()
        with self._lock:
            rid = next(self._ids)
            self._pending[rid] = fut
        assert self.wire is not None
        self.wire.send(("exec", rid, code, stdin, float(timeout_s), int(output_chars)))
        return fut.result()

    def answer(self, rid: int, ok: bool, value: Any) -> None:
        with self._lock:
            fut = self._pending.pop(rid, None)
        if fut is not None:
            fut.set_result(value) if ok else fut.set_exception(RuntimeError(f"sandbox (main process): {value}"))

    def fail_all(self, why: str) -> None:
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
        for fut in pending:
            fut.set_exception(RuntimeError(why))


def _die_with_parent() -> None:
    """Linux: the helper gets SIGKILL when the main process dies (kill -9 included)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort; EOF on the socket also ends the helper
        pass


def _drop_inherited_channels(keep: int) -> None:
    """Close every pipe and socket the fork copied from the main process, except `keep` and stdio.

    Other threads of the main process may hold pipes at the moment of the fork: a
    subprocess being started (its exec-status pipe: the main process's Popen waits for EOF
    on it, which never comes while a copy lives here), the MLflow helper's stdin, the gold
    server's listening socket. The helper uses none of them, and must not keep them open.
    """
    import stat

    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd <= 2 or fd == keep:
            continue
        try:
            mode = os.fstat(fd).st_mode
        except OSError:  # the directory listing's own descriptor, already closed
            continue
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            try:
                os.close(fd)
            except OSError:
                pass


def _helper_main(
    conn: Any, problems: Sequence[Any], solve: Callable[..., Any], threads: int, parent: int, name: str
) -> None:
    """Body of a forked helper: solve the problems the main process hands over, until EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    _die_with_parent()
    _drop_inherited_channels(keep=conn.fileno())
    if os.getppid() != parent:  # the main process died before prctl took effect
        os._exit(1)
    proxy = _ExecProxy()

    async def run() -> None:
        from apps_bench.models.metering import SharedConnections

        connections = SharedConnections()
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=threads, thread_name_prefix="apps-bench-helper"))
        done = asyncio.Event()
        tasks: set[asyncio.Task[Any]] = set()

        async def one(index: int) -> None:
            solved = await solve(problems[index], pool=proxy, connections=connections)
            solved.solver = name
            wire.send(("solved", index, solved))

        def start(index: int) -> None:
            task = loop.create_task(one(index))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        def on_message(msg: Any) -> None:
            if msg[0] == "exec_result":  # a tool thread waits on it: answer without the loop
                proxy.answer(msg[1], msg[2], msg[3])
            elif msg[0] == "solve":
                loop.call_soon_threadsafe(start, msg[1])

        def on_close() -> None:
            proxy.fail_all("the main process closed the connection")
            loop.call_soon_threadsafe(done.set)

        wire = _Wire(conn, on_message, on_close, "apps-bench-helper")
        proxy.wire = wire
        wire.start()
        await done.wait()
        await connections.aclose()

    code = 0
    try:
        asyncio.run(run())
    except BaseException:  # noqa: BLE001 - nothing of a helper's may reach the parent's handlers
        code = 1
    finally:
        os._exit(code)  # no atexit/finalizers of the main process's objects run twice


# ----------------------------------------------------------------------------- main side


class HelperDied(RuntimeError):
    pass


@dataclass
class _Helper:
    pid: int
    conn: Any
    name: str
    wire: _Wire | None = None
    in_flight: dict[int, asyncio.Future[Solved]] = field(default_factory=dict)
    alive: bool = True


class SolverProcesses:
    """Forked helper processes that solve problems for this process (see the module doc).

    Fork with `fork(n, problems, solve)` before any event loop, thread pool or sandbox
    pool exists; then, inside the event loop, `attach(pool)` and `await solve(index)`.
    """

    def __init__(self, helpers: list[_Helper], preloader: Any = None) -> None:
        self.helpers = helpers
        self.preloader = preloader  # the helpers' parent when not this process (apps_bench.preloader)
        self.main_solves = preloader is None  # preloaded: this process solves only once every helper is gone
        self.local_in_flight = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: Any = None

    @classmethod
    def fork(cls, n: int, problems: Sequence[Any], solve: Callable[..., Any], *, threads: int) -> SolverProcesses:
        from multiprocessing.connection import Pipe

        helpers: list[_Helper] = []
        parent = os.getpid()
        for i in range(n):
            mine, theirs = Pipe(duplex=True)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # the helper
                mine.close()
                for h in helpers:  # its siblings' sockets are the main process's business
                    h.conn.close()
                _helper_main(theirs, problems, solve, threads, parent, f"helper-{i + 1}")
            theirs.close()
            helpers.append(_Helper(pid=pid, conn=mine, name=f"helper-{i + 1}"))
        return cls(helpers)

    @classmethod
    def adopt(cls, spawned: Sequence[tuple[int, Any, str]], preloader: Any) -> SolverProcesses:
        """Helpers the preloader forked ([(pid, connection, name)]); they do all the solving."""
        return cls([_Helper(pid=pid, conn=conn, name=name) for pid, conn, name in spawned], preloader=preloader)

    def attach(self, pool: Any) -> None:
        """Start serving the helpers (call inside the running event loop): `pool` runs their python_exec."""
        self._loop = asyncio.get_running_loop()
        self._pool = pool
        for h in self.helpers:
            h.wire = _Wire(h.conn, lambda msg, h=h: self._on_message(h, msg), lambda h=h: self._on_close(h), f"apps-bench-solver{h.pid}")
            h.wire.start()

    @contextlib.contextmanager
    def solving_here(self) -> Iterator[None]:
        """Count a problem this process solves itself (what `pick` balances against)."""
        self.local_in_flight += 1
        try:
            yield
        finally:
            self.local_in_flight -= 1

    def pick(self) -> _Helper | None:
        """The least busy solver for the next problem: a live helper, or None for this process."""
        live = [h for h in self.helpers if h.alive]
        best = min(live, key=lambda h: len(h.in_flight), default=None)
        if best is None or (self.main_solves and len(best.in_flight) > self.local_in_flight):
            return None
        return best

    async def solve_on(self, helper: _Helper, index: int, timeout_s: float) -> Solved:
        """`timeout_s` is a safety net above the runner's own time cap: a helper that does not
        answer by then is stuck, and is ended (its problems become errors)."""
        assert self._loop is not None and helper.wire is not None
        fut: asyncio.Future[Solved] = self._loop.create_future()
        helper.in_flight[index] = fut
        helper.wire.send(("solve", index))
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except asyncio.TimeoutError:
            helper.alive = False
            try:
                os.kill(helper.pid, signal.SIGKILL)  # its other problems fail when its socket closes
            except ProcessLookupError:
                pass
            raise HelperDied(f"solver process {helper.name} (pid {helper.pid}) did not answer within {timeout_s:g}s") from None
        finally:
            helper.in_flight.pop(index, None)

    def _on_message(self, helper: _Helper, msg: Any) -> None:
        assert self._loop is not None
        if msg[0] == "solved":
            self._loop.call_soon_threadsafe(self._resolve, helper, msg[1], msg[2])
        elif msg[0] == "exec":
            threading.Thread(target=self._exec, args=(helper, msg), daemon=True, name="apps-bench-exec").start()

    def _exec(self, helper: _Helper, msg: Any) -> None:
        _, rid, code, stdin, timeout_s, output_chars = msg
        try:
            result = self._pool.python_exec(code, stdin, timeout_s=timeout_s, output_chars=output_chars)
            reply = ("exec_result", rid, True, result)
        except Exception as exc:  # noqa: BLE001 - the helper's tool call fails like a local one would
            reply = ("exec_result", rid, False, f"{type(exc).__name__}: {exc}")
        assert helper.wire is not None
        helper.wire.send(reply)

    def _resolve(self, helper: _Helper, index: int, solved: Solved) -> None:
        fut = helper.in_flight.get(index)
        if fut is not None and not fut.done():
            fut.set_result(solved)

    def _on_close(self, helper: _Helper) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._died, helper)

    def _died(self, helper: _Helper) -> None:
        helper.alive = False
        code = _reap(helper.pid)
        for fut in list(helper.in_flight.values()):
            if not fut.done():
                fut.set_exception(HelperDied(f"solver process {helper.name} (pid {helper.pid}) exited ({code}) while solving this problem"))

    def close(self) -> None:
        """End the helpers (EOF, then SIGKILL for any that linger) and reap them."""
        for h in self.helpers:
            if h.wire is not None:
                h.wire.close()
            _hang_up(h.conn)
        deadline = time.monotonic() + 2.0
        for h in self.helpers:
            end_child(h.pid, deadline)
        if self.preloader is not None:  # it exits once its helpers have (then they are reaped)
            self.preloader.close(deadline)


def end_child(pid: int, deadline: float) -> None:
    """Wait for child `pid` to exit until `deadline` (time.monotonic), then SIGKILL it; reap it."""
    while time.monotonic() < deadline and _reap(pid, block=False) is None:
        time.sleep(0.01)
    if _reap(pid, block=False) is None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _reap(pid)


def _hang_up(conn: Any) -> None:
    """Shut the socket down, then close it: a bare close() neither wakes our own reader
    thread blocked in recv() nor (while that thread holds the socket) sends the helper EOF."""
    import socket

    try:
        with socket.socket(fileno=os.dup(conn.fileno())) as dup:
            dup.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        conn.close()
    except OSError:
        pass


def _reap(pid: int, block: bool = True) -> str | None:
    """Wait for a helper; its exit as text, or None if still running (block=False)."""
    try:
        got, status = os.waitpid(pid, 0 if block else os.WNOHANG)
    except ChildProcessError:  # reaped already, or not our child (a preloaded helper's is its preloader's)
        return "status unknown"
    if got == 0:
        return None
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"
