"""Solving one problem (frame -> topology.solve), in whichever process solves it.

`solve_problem` is the one implementation of the solve step: it builds the problem's
metered model clients and its `python_exec` tool, runs the topology under the time cap
on the problem's tests-free view (the runner never sees hidden tests or reference
solutions), and returns a `Solved` (attempt, transcript, usage, error). The cell's own
process calls it when it solves alone (`processes=1`); otherwise the workers of
apps_bench/cell/solver_pool.py do.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, AsyncIterator, Mapping, Protocol

from apps_bench.models import ModelClients
from apps_bench.models.client_stack import SharedConnections
from apps_bench.sandbox.tool import PythonExecTool
from apps_bench.topologies.context import build_context
from apps_bench.topologies.team import unanswered_error
from apps_bench.tracking.capture import TraceLog
from apps_bench.tracking.traces import traces_enabled
from apps_bench.types import Attempt, JsonObject, Problem, Usage

if TYPE_CHECKING:
    from apps_bench.config.schema import Config, TopologyConfig
    from apps_bench.models.endpoint import Endpoint
    from apps_bench.topologies.base import PromptSet, Topology


@dataclass
class Solved:
    """The outcome of the solve step for one problem (before judging)."""

    attempt: Attempt | None
    transcript: list[JsonObject] = field(default_factory=list)  # transcripts.jsonl's events
    usage: Usage | None = None
    error: str | None = None
    solve_s: float = 0.0
    solver: str = "main"  # which process solved it: "main" (the cell's) or "solver-<n>"


@dataclass(frozen=True)
class Job:
    """How one problem is solved, beyond the cell's settings."""

    prompts: PromptSet | None = None  # the PromptSet; None: the topology's configured prompts
    seed: int | None = None  # the request seed; None: the cell's
    headers: Mapping[str, str] | None = None  # sent with every model request (an optimizer's rollout tag)
    base_url: str | None = None  # another route to the same model (the optimizer's replay proxy)
    trace: bool | None = None  # record the problem's trace; None: the cell's tracking setting


CELL_JOB = Job()


def time_cap(topology_cfg: TopologyConfig) -> float:
    """A safety net over the runner's own time limit (`topology.time_limit_s`)."""
    return float(topology_cfg.time_limit_s) * 1.5 + 30


async def solve_problem(
    problem: Problem,
    *,
    cfg: Config,
    topology: Topology,
    endpoint: Endpoint,
    pool: Any,  # the agents' python_exec: the cell's SandboxPool, or a solver worker's proxy to it
    prompts: PromptSet | None = None,
    connections: SharedConnections | None = None,
    seed: int | None = None,
    headers: Mapping[str, str] | None = None,
    trace: bool = False,
) -> Solved:
    """Run the cell's topology on one problem; any failure becomes `Solved.error` (never raised).

    `connections`: the event loop's `SharedConnections` (one HTTP pool for all problems).
    `seed` defaults to the cell's; `headers` go with every model request (an optimizer's
    rollout tag). The attempt carries the problem's transcript events and usage; with `trace`,
    its usage also carries what the problem's trace is built from (tracking/capture.py)."""
    problem = problem.without_tests()
    topo_cfg, tool_cfg = cfg.topology, cfg.tool
    usage = Usage()
    if trace:
        usage.trace = TraceLog()
    attempt: Attempt | None = None
    error: str | None = None
    transcript: list[JsonObject] = []
    t0 = time.perf_counter()
    models = None
    try:
        models = ModelClients(endpoint, cfg.model, usage, shared=connections, headers=dict(headers or {}) or None)
        tool = PythonExecTool(pool, float(tool_cfg.timeout_s), int(tool_cfg.output_chars), usage)
        ctx = build_context(
            problem,
            topo_cfg,
            models=models,
            tool=tool,
            seed=int(cfg.seed if seed is None else seed),
            usage=usage,
            prompts=prompts,
        )
        try:
            attempt = await asyncio.wait_for(topology.solve(ctx), timeout=time_cap(topo_cfg))
        except TimeoutError:
            attempt = Attempt(
                program=None,
                transcript=list(ctx.transcript),
                stop_reason="time_limit",
                error=unanswered_error(usage, time_cap(topo_cfg)),
            )
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


class Solver(Protocol):
    """What the engine solves with: this process (LocalSolver) or its worker processes (solver_pool.SolverPool)."""

    def serving(self, pool: Any, endpoint: Endpoint) -> contextlib.AbstractAsyncContextManager[None]:
        """While one event loop runs problems: `pool` runs the agents' python_exec, `endpoint` is the model."""
        ...

    async def __call__(self, problem: Problem, job: Job) -> Solved: ...


class LocalSolver:
    """Solving in the cell's own process (`processes=1`, or one usable CPU): the same calls as
    solver_pool.SolverPool, so the engine does not know which one it has."""

    def __init__(self, cfg: Config, topology: Topology) -> None:
        self.cfg = cfg
        self.topology = topology

        self.trace = traces_enabled(cfg)
        self._pool: Any = None  # as `solve_problem`'s pool
        self._endpoint: Endpoint | None = None
        self._connections: SharedConnections | None = None

    @contextlib.asynccontextmanager
    async def serving(self, pool: Any, endpoint: Endpoint) -> AsyncIterator[None]:
        self._pool, self._endpoint = pool, endpoint
        self._connections = SharedConnections()  # one HTTP pool for every problem of the cell
        try:
            yield
        finally:
            await self._connections.aclose()

    async def __call__(self, problem: Problem, job: Job) -> Solved:
        assert self._endpoint is not None, "LocalSolver called outside serving()"
        endpoint = replace(self._endpoint, base_url=job.base_url) if job.base_url else self._endpoint
        return await solve_problem(
            problem,
            cfg=self.cfg,
            topology=self.topology,
            endpoint=endpoint,
            pool=self._pool,
            prompts=job.prompts,
            connections=self._connections,
            seed=job.seed,
            headers=job.headers,
            trace=self.trace if job.trace is None else job.trace,
        )
