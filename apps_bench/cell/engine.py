"""The cell's engine: what solves and judges problems, opened once per cell.

One engine serves everything a cell solves: its own problems (cell/pipeline.py) and, in an optimizer
cell, the optimizer's rollouts (optimizers/runner.py) before them, so a candidate prompt set is
scored by the same endpoint, sandbox pool, judge and solver processes as the final prompts. A
`Job` says what differs per problem (the prompt set, the request seed, the request headers, the
route to the model); everything else is the cell's.

Process model: the cell's process judges and records; problems are solved in it (`processes=1`) or
in worker processes forked from a forkserver started before the cell starts any thread
(cell/solver_pool.py). `Engine.run(main)` runs `main` on an event loop with the solvers attached;
an optimizer calls it once per batch of rollouts, a cell once for all its problems.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from multiprocessing.context import ForkServerContext
from typing import AsyncIterator, Awaitable, Callable, Iterable, Iterator, TypeVar

from apps_bench.cell import event_loop
from apps_bench.cell.cpus import usable_cpus
from apps_bench.cell.key import CellSetupError
from apps_bench.cell.solver_pool import SolverPool, solver_count, start_forkserver
from apps_bench.cell.solving import CELL_JOB, Job, LocalSolver, Solver, solver_threads, time_cap
from apps_bench.cell.step import Judged, solve_and_judge
from apps_bench.config.schema import Config, problems_in_flight, typed_config
from apps_bench.judge import Judge
from apps_bench.models import ModelEndpointError, open_endpoint
from apps_bench.models.clients import MissingFrameworkError
from apps_bench.models.endpoint import Endpoint
from apps_bench.sandbox import SandboxPool
from apps_bench.sandbox.api import Sandbox
from apps_bench.topologies.registry import check_framework, get_topology
from apps_bench.types import JsonObject, Problem

T = TypeVar("T")
__all__ = ["Engine", "Forked", "fork_solvers"]


@dataclass(frozen=True)
class Forked:
    """The solver processes a cell will fork (`workers` from `ctx`), decided before it starts any thread."""

    ctx: ForkServerContext
    workers: int


def fork_solvers(config: Config, n_problems: int) -> Forked | None:
    """The forkserver for `config`'s topology, started now (before the cell starts any thread: its
    workers inherit none), when `processes` asks for more than one; None: solve in this process."""
    try:
        n = solver_count(config.processes, concurrency=problems_in_flight(config), n_problems=n_problems)
    except ValueError as exc:
        raise CellSetupError(str(exc)) from exc
    if not n:
        return None
    topology = config.topology
    try:
        check_framework(topology.framework, topology.name)  # a missing one fails here, with the pip command
    except MissingFrameworkError as exc:
        raise CellSetupError(str(exc)) from exc
    return Forked(ctx=start_forkserver(topology), workers=n)


def sandbox_workers(config: Config, left: int | None) -> int:
    """The sandbox pool's workers: `judge.workers` (0 = one per usable CPU), but no more than the
    `left` problems to solve can keep busy at once (one sandbox job at a time per agent of each
    problem in flight: a tool call, or the problem's judging). None: as configured."""
    configured = config.judge.workers or usable_cpus()
    if left is None:
        return configured
    busy = min(left, problems_in_flight(config)) * max(1, int(config.topology.team_size or 1))
    return max(1, min(configured, busy))


class Engine:
    """The endpoint, sandbox pool, judge and solver(s) of a cell; see the module doc."""

    def __init__(
        self, config: Config, *, endpoint: Endpoint, pool: Sandbox, solver: Solver, solvers: int, concurrency: int
    ) -> None:
        """Built by `open`, which types the config and computes `concurrency` (problems_in_flight) once."""
        self.config = config
        self.endpoint = endpoint
        self.pool = pool
        self.judge = Judge.from_config(pool, config.judge)
        self.solver = solver
        self.solvers = solvers  # how many processes solve
        self.concurrency = concurrency
        self._slots: asyncio.Semaphore | None = None

    @classmethod
    @contextlib.contextmanager
    def open(
        cls,
        config: Config,
        problems: Iterable[Problem] = (),
        *,
        forked: Forked | None = None,
        endpoint: Endpoint | None = None,
        pool: Sandbox | None = None,
        left: int | None = None,
    ) -> Iterator[Engine]:
        """The engine for `config` (a composed node from tests and scripts, or the typed config):
        `endpoint` and `pool` when given (the caller's to close), else the model's endpoint (a
        built-in server gets `problems`' rows) and a new sandbox pool, of no more workers than
        `left` problems to solve need (`sandbox_workers`); `forked` workers, else this process solves."""
        config = typed_config(config)
        concurrency = problems_in_flight(config)
        with ExitStack() as stack:
            if endpoint is None:
                try:
                    endpoint = stack.enter_context(open_endpoint(config.model, list(problems)))
                except ModelEndpointError as exc:
                    raise CellSetupError(str(exc)) from exc
            if pool is None:
                pool = stack.enter_context(SandboxPool.from_config(config.judge, workers=sandbox_workers(config, left)))
            if forked is not None:
                workers = SolverPool.start(
                    forked.ctx,
                    forked.workers,
                    cfg=config,
                    threads=solver_threads(concurrency),
                    timeout_s=time_cap(config.topology) + 60,
                )
                stack.callback(workers.close)
                solver: Solver = workers
            else:
                try:
                    topology = get_topology(config.topology)  # a missing framework fails now, with the pip command
                except ImportError as exc:
                    raise CellSetupError(str(exc)) from exc
                solver = LocalSolver(config, topology)
            yield cls(
                config,
                endpoint=endpoint,
                pool=pool,
                solver=solver,
                solvers=forked.workers if forked else 1,
                concurrency=concurrency,
            )

    @property
    def features(self) -> JsonObject:
        """What the sandbox enforces (provenance)."""
        return self.pool.features

    def run(self, main: Callable[[], Awaitable[T]]) -> T:
        """`main()` on a new event loop, the solvers serving it (Ctrl-C: event_loop.run)."""
        return event_loop.run(self._serve(main))

    async def _serve(self, main: Callable[[], Awaitable[T]]) -> T:
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=solver_threads(self.concurrency), thread_name_prefix="apps-bench")
        loop.set_default_executor(executor)  # tool calls and judging
        self._slots = asyncio.Semaphore(self.concurrency)
        async with self.solver.serving(self.pool, self.endpoint):
            return await main()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """One of the `problems_in_flight` places: hold it while a problem is solved and judged."""
        assert self._slots is not None, "Engine.slot() outside Engine.run()"
        async with self._slots:
            yield

    async def step(self, problem: Problem, job: Job = CELL_JOB) -> Judged:
        """Solve `problem` as `job` says, then judge it (cell/step.py)."""
        return await solve_and_judge(problem, functools.partial(self.solver, job=job), self.judge)
