"""Solver processes: problems solved in worker processes started from the stdlib forkserver.

Why more than one process: a cell's solving is mostly the agent frameworks' and SDKs'
Python (request building, response parsing, graph scheduling; ~20-50 ms per model call)
under one GIL, so against a fast server one process keeps one core busy and queues the
rest. Why the forkserver: it is a fresh interpreter, started before the cell opens its
threads (gold server, tracking, sandbox), that imports the cell's framework once; every
worker is forked from it, so each starts in milliseconds with the import shared
copy-on-write, and none inherits the cell process's threads, locks or sockets.

The protocol, over one duplex pipe per worker:
  cell -> worker   ("setup", endpoint)            once, before any problem
                   ("solve", index, problem, job) a tests-free view of the problem, and its solving.Job
                   ("exec_result", id, ok, value) the answer to a python_exec call
  worker -> cell   ("solved", index, Solved)
                   ("exec", id, code, stdin, timeout_s, output_chars)
A worker's `python_exec` calls run in the cell's own sandbox pool (one pool, one set of
limits), and judging and recording stay in the cell's process, so a record is the same
whichever process solved it. A worker that dies fails only the problems it held (recorded
as errors, retried by the next run), and a new one takes its place. Workers end at EOF: when the cell closes them, or
when its process dies (kill -9 included: the kernel closes the pipe).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import queue
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterator

from apps_bench.cell import event_loop
from apps_bench.cell.cpus import requested_processes, usable_cpus
from apps_bench.cell.frameworks import FRAMEWORKS
from apps_bench.cell.solving import Job, LocalSolver, Solved
from apps_bench.errors import AppsBenchError
from apps_bench.topologies.registry import FIRST_PROBLEM, get_topology, runner_module
from apps_bench.types import Problem

if TYPE_CHECKING:
    from apps_bench.config.schema import Config, TopologyConfig
    from apps_bench.models.endpoint import Endpoint
    from apps_bench.sandbox.api import ExecResult, Sandbox

BASE_PRELOAD = (
    "apps_bench.cell.solving",
    "apps_bench.cell.solver_pool",
    "apps_bench.models",
    "apps_bench.sandbox.tool",
    "apps_bench.topologies.context",
    "omegaconf",
)


def preload_modules(topology: TopologyConfig) -> list[str]:
    """What the forkserver imports before forking workers for `topology`: its framework and runner."""
    return [*BASE_PRELOAD, *FRAMEWORKS[topology.framework][0], *FIRST_PROBLEM, runner_module(topology)]


def start_forkserver(topology: TopologyConfig) -> ForkServerContext:
    """The forkserver context, its server started now (it imports `topology`'s framework
    while the cell sets up). A server already running in this process keeps its imports."""
    import multiprocessing
    from multiprocessing import forkserver

    if multiprocessing.get_start_method(allow_none=True) not in multiprocessing.get_all_start_methods():
        # e.g. a cell inside a joblib/loky worker (hydra/launcher=local_parallel), whose default
        # method is 'loky': every child's preparation data names the process's default method,
        # and a child that is not loky's cannot set it ("cannot find context for 'loky'")
        multiprocessing.set_start_method("forkserver", force=True)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(preload_modules(topology))
    with _sigint_ignored():  # inherited through exec: Ctrl-C is the cell's, never a traceback mid-import there
        forkserver.ensure_running()
    return ctx


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored in this process while a child is started (from the main thread; elsewhere
    Python cannot change handlers, and the child keeps the default)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


# ----------------------------------------------------------------------------- wire

# A message on a worker's pipe, a tuple led by its kind: to the worker ("setup", endpoint), ("solve", index,
# problem, job), ("exec_result", request id, ok, ExecResult or why); to the cell ("solved", index, Solved),
# ("exec", request id, code, stdin, timeout_s, output_chars), ("broken", why). Pickled as they are.
Message = tuple[Any, ...]


class Wire:
    """One end of a worker's pipe: a thread that receives (messages -> `on_message`) and a
    thread that sends (so neither side's event loop ever blocks on a full pipe)."""

    def __init__(self, conn: Connection, on_message: Callable[[Message], None], on_close: Callable[[], None], name: str) -> None:
        self.conn = conn
        self._outbox: queue.SimpleQueue[Message | None] = queue.SimpleQueue()
        self._on_message = on_message
        self._on_close = on_close
        self._reader = threading.Thread(target=self._read, name=f"{name}-recv", daemon=True)
        self._writer = threading.Thread(target=self._write, name=f"{name}-send", daemon=True)
        self._threads_left = 2
        self._threads_lock = threading.Lock()

    def start(self) -> None:
        self._reader.start()
        self._writer.start()

    def send(self, msg: Message) -> None:
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
            self._thread_done()

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
                    why = f"solver process: cannot send the result back ({type(exc).__name__}: {exc})"
                    self.conn.send(("solved", msg[1], Solved(attempt=None, usage=msg[2].usage, error=why)))
        except (OSError, ValueError):  # the other end is gone; the reader reports it
            pass
        finally:
            shut_down(self.conn)  # the reader wakes to EOF, and so does the other side
            self._thread_done()

    def _thread_done(self) -> None:
        """Close the pipe once neither thread uses it. Closed under the reader, a recv() between a
        message's length and its body reads from a None handle (a TypeError, traceback on Ctrl-C),
        or from whatever file reuses the descriptor."""
        with self._threads_lock:
            self._threads_left -= 1
            last = self._threads_left == 0
        if last:
            with contextlib.suppress(OSError):
                self.conn.close()


def shut_down(conn: Connection) -> None:
    """Shut the pipe's socket down: a bare close() neither wakes a reader thread blocked in
    recv() nor, while that thread holds it, sends the other side EOF."""
    import socket

    try:
        with socket.socket(fileno=os.dup(conn.fileno())) as dup:
            dup.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def hang_up(conn: Connection) -> None:
    """Shut a pipe no thread reads down and close it."""
    shut_down(conn)
    with contextlib.suppress(OSError):
        conn.close()


# ----------------------------------------------------------------------------- worker side


class ExecProxy:
    """The worker's stand-in for the sandbox pool: `python_exec` runs in the cell's pool."""

    def __init__(self) -> None:
        self.wire: Wire | None = None
        self._ids = itertools.count()
        self._pending: dict[int, Future[ExecResult]] = {}
        self._lock = threading.Lock()

    def python_exec(self, code: str, stdin: str = "", *, timeout_s: float, output_chars: int) -> ExecResult:
        fut: Future[ExecResult] = Future()
        with self._lock:
            rid = next(self._ids)
            self._pending[rid] = fut
        assert self.wire is not None
        self.wire.send(("exec", rid, code, stdin, float(timeout_s), int(output_chars)))
        return fut.result()

    def answer(self, rid: int, ok: bool, value: Any) -> None:  # value: the ExecResult, or why it failed
        with self._lock:
            fut = self._pending.pop(rid, None)
        if fut is not None:
            fut.set_result(value) if ok else fut.set_exception(RuntimeError(f"sandbox (cell process): {value}"))

    def fail_all(self, why: str) -> None:
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
        for fut in pending:
            fut.set_exception(RuntimeError(why))


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs besides the problems: sent once, when it starts."""

    cfg: Config  # the cell's typed config
    threads: int  # its default executor's size (tool calls)
    env: dict[str, str]  # the cell process's environment now (the forkserver's is older)
    cwd: str
    name: str


def worker_main(conn: Connection, spec: WorkerSpec) -> None:
    """Body of a worker: build the topology, then solve the problems the cell hands over, until EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the cell process's to handle
    os.environ.clear()
    os.environ.update(spec.env)
    os.chdir(spec.cwd)

    try:
        topology = get_topology(spec.cfg.topology)
    except Exception as exc:  # noqa: BLE001 - told to the cell, which fails the problems it sends here
        with contextlib.suppress(OSError):
            conn.send(("broken", f"{type(exc).__name__}: {exc}"))
        return
    try:
        msg = conn.recv()
    except (EOFError, OSError):  # the cell stopped (refused, failed or killed) before it set this worker up
        return
    assert msg[0] == "setup", msg
    endpoint = msg[1]
    proxy = ExecProxy()
    solver = LocalSolver(spec.cfg, topology)  # this process solves as a one-process cell does

    async def run() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=spec.threads, thread_name_prefix=spec.name))
        done = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()

        async def one(index: int, problem: Problem, job: Job) -> None:
            solved = await solver(problem, job)
            solved.solver = spec.name
            wire.send(("solved", index, solved))

        def start(index: int, problem: Problem, job: Job) -> None:
            task = loop.create_task(one(index, problem, job))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        def on_message(msg: Message) -> None:
            if msg[0] == "exec_result":  # a tool thread waits on it: answer without the loop
                proxy.answer(msg[1], msg[2], msg[3])
            elif msg[0] == "solve":
                loop.call_soon_threadsafe(start, msg[1], msg[2], msg[3])

        def on_close() -> None:
            proxy.fail_all("the cell process closed the connection")
            loop.call_soon_threadsafe(done.set)

        async with solver.serving(proxy, endpoint):
            wire = Wire(conn, on_message, on_close, spec.name)
            proxy.wire = wire
            wire.start()
            await done.wait()
            if tasks:  # the cell hung up mid-problem: what is still solving is dropped, quietly
                event_loop.cut(mute=True)
            for task in list(tasks):
                task.cancel()

    event_loop.run(run())


# ----------------------------------------------------------------------------- cell side


class WorkerDied(RuntimeError, AppsBenchError):
    pass


@dataclass
class Worker:
    process: BaseProcess
    conn: Connection
    name: str
    wire: Wire | None = None
    in_flight: dict[int, asyncio.Future[Solved]] = field(default_factory=dict)
    alive: bool = True
    broken: str | None = None  # why it could not build the topology


class SolverPool:
    """`n` worker processes solving the cell's problems (see the module doc).

    `start(...)` forks them from the forkserver (no event loop needed); inside an event loop,
    `serving(pool, endpoint)` then `await pool(problem, job)`; `close()` ends them. The workers
    outlive an event loop: an optimizer serves each batch of rollouts from a loop of its own.
    """

    def __init__(self, ctx: ForkServerContext, spec: WorkerSpec, timeout_s: float) -> None:
        self.ctx = ctx
        self.spec = spec
        self.workers: list[Worker] = []
        self.restarts_left = 0
        self.timeout_s = timeout_s
        self._endpoint: Endpoint | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: Sandbox | None = None
        self._ids = itertools.count()
        self._closing = False

    @classmethod
    def start(cls, ctx: ForkServerContext, n: int, *, cfg: Config, threads: int, timeout_s: float) -> SolverPool:
        """`timeout_s`: a safety net above the runner's own time cap; a worker that does not
        answer a problem by then is stuck, and is ended."""
        pool = cls(ctx, WorkerSpec(cfg=cfg, threads=threads, env=dict(os.environ), cwd=os.getcwd(), name=""), timeout_s)
        for _ in range(n):
            pool._spawn()
        pool.restarts_left = n  # a worker that dies is replaced, at most once per worker on average
        return pool

    def _spawn(self) -> Worker:
        mine, theirs = self.ctx.Pipe(duplex=True)
        name = f"solver-{len(self.workers) + 1}"
        spec = replace(self.spec, name=name)
        proc = self.ctx.Process(target=worker_main, args=(theirs, spec), name=f"apps-bench-{name}", daemon=True)
        proc.start()
        theirs.close()
        worker = Worker(process=proc, conn=mine, name=name)
        self.workers.append(worker)
        if self._endpoint is not None:
            self._serve(worker)
        return worker

    @contextlib.asynccontextmanager
    async def serving(self, pool: Sandbox, endpoint: Endpoint) -> AsyncIterator[None]:
        """While an event loop runs problems (the LocalSolver's twin)."""
        self.attach(pool, endpoint)
        try:
            yield
        finally:
            self._loop = None

    def attach(self, pool: Sandbox, endpoint: Endpoint) -> None:
        """Serve the workers from the running event loop: `pool` runs their python_exec; `endpoint`
        (without its server object, which stays here) is theirs to call, told once per worker."""
        self._loop = asyncio.get_running_loop()
        self._pool = pool
        if self._endpoint is None:
            self._endpoint = replace(endpoint, server=None) if hasattr(endpoint, "server") else endpoint
        for w in list(self.workers):
            if w.wire is None and w.alive:
                self._serve(w)

    def _serve(self, w: Worker) -> None:
        w.wire = Wire(
            w.conn, functools.partial(self._on_message, w), functools.partial(self._on_close, w), f"apps-bench-{w.name}"
        )
        w.wire.start()
        w.wire.send(("setup", self._endpoint))

    def pick(self) -> Worker | None:
        """The least busy live worker, or None when every one is gone."""
        live = [w for w in self.workers if w.alive]
        return min(live, key=lambda w: len(w.in_flight), default=None)

    async def __call__(self, problem: Problem, job: Job) -> Solved:
        """Solve `problem` as `job` (solving.Job) says, on the least busy worker."""
        index, timeout_s = next(self._ids), self.timeout_s
        worker = self.pick()
        if worker is None:
            why = "; ".join(dict.fromkeys(w.broken for w in self.workers if w.broken)) or "every solver process exited"
            return Solved(attempt=None, error=f"no solver process left ({why})", solver="none")
        assert self._loop is not None and worker.wire is not None
        fut: asyncio.Future[Solved] = self._loop.create_future()
        worker.in_flight[index] = fut
        worker.wire.send(("solve", index, problem.without_tests(), job))
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            worker.alive = False
            worker.process.kill()  # its other problems fail when its pipe closes
            return Solved(
                attempt=None, error=f"solver process {worker.name} did not answer within {timeout_s:g}s", solver=worker.name
            )
        except WorkerDied as exc:
            return Solved(attempt=None, error=str(exc), solver=worker.name)
        finally:
            worker.in_flight.pop(index, None)

    def _on_message(self, worker: Worker, msg: Message) -> None:
        if msg[0] == "solved":
            loop = self._loop
            if loop is not None:  # else its problem was given up with the loop that asked for it
                loop.call_soon_threadsafe(self._resolve, worker, msg[1], msg[2])
        elif msg[0] == "exec":
            threading.Thread(target=self._exec, args=(worker, msg), daemon=True, name="apps-bench-exec").start()
        elif msg[0] == "broken":
            worker.broken = msg[1]

    def _exec(self, worker: Worker, msg: Message) -> None:
        _, rid, code, stdin, timeout_s, output_chars = msg
        try:
            assert self._pool is not None, "a worker's tool call outside serving()"
            result = self._pool.python_exec(code, stdin, timeout_s=timeout_s, output_chars=output_chars)
            reply: Message = ("exec_result", rid, True, result)
        except Exception as exc:  # noqa: BLE001 - the worker's tool call fails like a local one would
            reply = ("exec_result", rid, False, f"{type(exc).__name__}: {exc}")
        assert worker.wire is not None
        worker.wire.send(reply)

    def _resolve(self, worker: Worker, index: int, solved: Solved) -> None:
        fut = worker.in_flight.get(index)
        if fut is not None and not fut.done():
            fut.set_result(solved)

    def _on_close(self, worker: Worker) -> None:
        loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._died, worker)
                return
            except RuntimeError:  # that loop has closed
                pass
        self._died(worker)  # between two loops: nothing is in flight

    def _died(self, worker: Worker) -> None:
        worker.alive = False
        worker.process.join(timeout=1.0)
        why = worker.broken or f"exit code {worker.process.exitcode}"
        for fut in list(worker.in_flight.values()):
            if not fut.done():
                fut.set_exception(WorkerDied(f"solver process {worker.name} exited ({why}) while solving this problem"))
        if self.restarts_left > 0 and not worker.broken and not self._closing:
            self.restarts_left -= 1
            self._spawn()  # its problems are recorded as errors; the next ones go to the new worker

    def close(self, grace_s: float = 2.0) -> None:
        """End the workers (EOF, then SIGKILL for any that linger) and reap them."""
        self._closing = True
        for w in self.workers:
            if w.wire is not None:
                w.wire.close()
            else:
                hang_up(w.conn)
        deadline = time.monotonic() + grace_s
        for w in self.workers:
            w.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if w.process.is_alive():
                w.process.kill()
                w.process.join()


def solver_count(setting: str | int, *, concurrency: int, n_problems: int) -> int:
    """Worker processes for `processes=<setting>`: 0 = solve in the cell's own process.

    `auto` = one per CPU this process may use (apps_bench.cell.cpus), never more than problems in
    flight or problems to run; a count of 1 (or one usable CPU) means no extra process."""
    total = requested_processes(setting) or usable_cpus()
    n = min(total, concurrency, n_problems)
    return n if n > 1 else 0
