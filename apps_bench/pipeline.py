"""The one loop: load problems -> open the model endpoint -> sandbox pool -> per problem:
frame -> topology.solve -> (program already extracted by the runner) -> judge -> record.

Problems are in flight concurrently (asyncio, bounded by `concurrency`); judging runs in
threads on the shared SandboxPool. Every problem's record is flushed as it completes, so a
killed cell resumes where it stopped. A problem whose model calls still fail after
retries (or whose judging hit a sandbox error) is recorded as an *error*, never as a wrong
answer: it is left out of pass@1, counted apart, marks the cell incomplete, and is retried
by the next run of the same cell.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from apps_bench.cell import Cell, guard
from apps_bench.validate import InvalidSettings, empty_selection
from apps_bench.tracking.records import (
    CELL,
    CONFIG,
    PROMPTS,
    RECORDS,
    SUMMARY,
    TRANSCRIPTS,
    RecordStore,
    record_key,
)


class CellSetupError(Exception):
    """The cell cannot start (bad selection, unreadable data, missing framework...): says what to fix."""


@dataclass
class CellResult:
    cell: Cell
    dir: Path
    summary: dict[str, Any]
    complete: bool
    run_id: str | None = None
    records: list[dict[str, Any]] = field(default_factory=list)


# ----------------------------------------------------------------------------- config


def plain_config(cfg: Any) -> dict[str, Any]:
    """The cell's config as plain data (no `hydra` node)."""
    from omegaconf import OmegaConf

    if not OmegaConf.is_config(cfg):
        return dict(cfg)
    out: dict[str, Any] = {}
    for k in cfg.keys():
        if k == "hydra":
            continue
        v = cfg[k]
        out[str(k)] = OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
    return out


def cell_dir_for(cfg: Mapping[str, Any], cell: Cell, cwd: Path | None = None) -> Path:
    out_dir = cfg.get("out_dir")
    if out_dir:
        return Path(str(out_dir)).expanduser().resolve()
    return (cwd or Path.cwd()).resolve() / "outputs" / "cells" / cell.dir_name


# ----------------------------------------------------------------------------- records


def make_record(
    cell: Cell,
    problem: Any,
    *,
    attempt: Any | None,
    verdict: Any | None,
    usage: Any,
    error: str | None,
    solve_s: float,
    judge_s: float,
    solver: str = "main",
) -> dict[str, Any]:
    from apps_bench.topologies.tool_use import tool_calls_by_role

    program = getattr(attempt, "program", None)
    vote = getattr(attempt, "vote", None)
    return {
        "key": record_key(problem.split, problem.id),
        "id": problem.id,
        "split": problem.split,
        "difficulty": problem.difficulty,
        "mode": problem.tests.mode,
        "cell": cell.key,
        "program": program,
        "extracted": bool(program and program.strip()),
        "passed": bool(verdict.passed) if verdict is not None and not error else False,
        "verdict": verdict.to_json() if verdict is not None else None,
        "usage": usage_record(usage),
        "tool_calls_by_role": tool_calls_by_role(getattr(attempt, "transcript", None) or ()),
        "latency_s": round(solve_s + judge_s, 4),
        "solve_s": round(solve_s, 4),
        "judge_s": round(judge_s, 4),
        "solver": solver,
        "error": error,
        "stop_reason": getattr(attempt, "stop_reason", "error" if error else "done"),
        "rounds": getattr(attempt, "rounds", 0),
        "turns": getattr(attempt, "turns", 0),
        "candidates": [asdict(c) for c in getattr(attempt, "candidates", None) or []],
        "vote": asdict(vote) if vote is not None else None,
        "completed_at": time.time(),
    }


# Per-problem usage counters, summed over a cell in summary.json and logged as MLflow metrics.
USAGE_TOTALS = (
    "prompt_tokens", "completion_tokens", "total_tokens", "model_calls", "tool_calls", "failed_calls",
    "failed_attempts", "retries", "retried_prompt_tokens", "retried_completion_tokens", "cancelled_calls",
    "requests_with_tools", "length_stops",
)  # fmt: skip


def usage_record(usage: Any) -> dict[str, Any]:
    """A problem's usage as recorded: the counters, finish reasons, and one entry per answered call."""
    out: dict[str, Any] = {k: int(getattr(usage, k, 0) or 0) for k in USAGE_TOTALS}
    out["tool_s"] = round(float(getattr(usage, "tool_s", 0.0) or 0.0), 4)
    out["finish_reasons"] = dict(getattr(usage, "finish_reasons", None) or {})
    out["calls"] = list(getattr(usage, "calls", None) or [])
    return out


def summarize_cell(
    records: list[dict[str, Any]],
    *,
    n_selected: int,
    skipped: Mapping[str, int],
    profile: str,
    wall_s: float | None = None,
) -> dict[str, Any]:
    """summary.json: the judge's pass@1 figures over judged problems, plus errors, usage, latency."""
    from apps_bench.judge import summarize

    judged = [r for r in records if not r.get("error")]
    errors = [r for r in records if r.get("error")]
    items = [
        {
            "difficulty": r.get("difficulty", ""),
            "passed": r.get("passed", False),
            "extracted": r.get("extracted", False),
            "results": (r.get("verdict") or {}).get("results") or [],
        }
        for r in judged
    ]
    s = summarize(items, skipped=skipped, profile=profile)
    out = s.to_dict()
    out["metrics"] = s.metrics()
    out["pass_at_1_ci"] = cell_interval([bool(it["passed"]) for it in items])
    tot = {k: 0 for k in USAGE_TOTALS}
    finish: dict[str, int] = {}
    for r in records:
        u = r.get("usage") or {}
        for k in tot:
            tot[k] += int(u.get(k, 0) or 0)
        for reason, n in (u.get("finish_reasons") or {}).items():
            finish[reason] = finish.get(reason, 0) + int(n)
    lat = [float(r.get("latency_s", 0.0)) for r in judged]
    stop: dict[str, int] = {}
    for r in records:
        stop[str(r.get("stop_reason"))] = stop.get(str(r.get("stop_reason")), 0) + 1
    out.update(
        n_selected=n_selected,
        n_recorded=len(records),
        n_errors=len(errors),
        n_missing=max(0, n_selected - len(records)),
        complete=len(records) >= n_selected and not errors,
        error_ids=[r["id"] for r in errors],
        usage=tot,
        latency_s={
            "mean": statistics.fmean(lat) if lat else 0.0,
            "p50": statistics.median(lat) if lat else 0.0,
            "max": max(lat) if lat else 0.0,
        },
        stop_reasons=stop,
        finish_reasons=finish,
        wall_s=wall_s,
    )
    return out


def cell_interval(passed: list[bool]) -> dict[str, Any]:
    """pass@1's 95% bootstrap interval over the judged problems (report.stats; fixed seed)."""
    from apps_bench.report.stats import METHOD_CELL, N_BOOT, bootstrap_interval

    iv = bootstrap_interval({str(i): [float(p)] for i, p in enumerate(passed)})
    return {"low": iv.low, "high": iv.high, "n": iv.n_problems, "method": METHOD_CELL.format(b=N_BOOT)}


def summary_tags(summary: Mapping[str, Any]) -> dict[str, str]:
    """What a cell's MLflow run shows besides metrics: its warnings, finish reasons and tool protocol."""
    proto = summary.get("tool_protocol") or {}
    warnings = list(summary.get("warnings") or ())
    return {
        "warnings": " | ".join(warnings)[:5000] if warnings else "",
        "n_warnings": str(len(warnings)),
        "finish_reasons": json.dumps(summary.get("finish_reasons") or {}, sort_keys=True),
        "tool_protocol": ("api" if proto.get("requests_with_tools") else "prompt_text") if proto.get("model_calls") else "none",
    }


def metrics_of(summary: Mapping[str, Any]) -> dict[str, float]:
    m = dict(summary.get("metrics") or {})
    ci = summary.get("pass_at_1_ci") or {}
    if ci.get("n"):
        m.update(pass_at_1_ci_low=ci["low"], pass_at_1_ci_high=ci["high"])
    m.update(
        n_selected=summary["n_selected"],
        n_recorded=summary["n_recorded"],
        n_errors=summary["n_errors"],
        complete=1.0 if summary["complete"] else 0.0,
        latency_mean_s=summary["latency_s"]["mean"],
        latency_p50_s=summary["latency_s"]["p50"],
        latency_max_s=summary["latency_s"]["max"],
    )
    for k, v in (summary.get("usage") or {}).items():
        m[k] = v
    if summary.get("wall_s") is not None:
        m["wall_s"] = summary["wall_s"]
    return {k: float(v) for k, v in m.items()}


def table_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in records:
        v = r.get("verdict") or {}
        u = r.get("usage") or {}
        rows.append(
            {
                "id": r["id"],
                "split": r.get("split"),
                "difficulty": r.get("difficulty"),
                "passed": bool(r.get("passed")),
                "extracted": bool(r.get("extracted")),
                "error": r.get("error") or "",
                "tests_passed": v.get("tests_passed", 0),
                "tests_run": v.get("tests_run", 0),
                "n_tests": v.get("n_tests", 0),
                "prompt_tokens": u.get("prompt_tokens", 0),
                "completion_tokens": u.get("completion_tokens", 0),
                "model_calls": u.get("model_calls", 0),
                "tool_calls": u.get("tool_calls", 0),
                "latency_s": r.get("latency_s", 0.0),
                "solve_s": r.get("solve_s", 0.0),
                "judge_s": r.get("judge_s", 0.0),
                "tool_s": u.get("tool_s", 0.0),
                "stop_reason": r.get("stop_reason", ""),
            }
        )
    return rows


# ----------------------------------------------------------------------------- printing


def print_problem(rec: Mapping[str, Any], out: Any = None) -> None:
    """A problem's extracted code and per-test results (demo / verbose)."""
    out = out or sys.stdout
    v = rec.get("verdict") or {}
    state = "ERROR" if rec.get("error") else ("PASSED" if rec.get("passed") else "FAILED")
    print(f"\n=== problem {rec['id']} ({rec.get('difficulty') or '?'}, {rec.get('mode', '?')}) : {state}", file=out)
    if rec.get("error"):
        print(f"error: {rec['error']}", file=out)
    prog = rec.get("program")
    if prog:
        print("--- extracted code ---", file=out)
        print(prog.rstrip("\n"), file=out)
        print("--- end of code ---", file=out)
    else:
        print("(no program extracted from the final reply)", file=out)
    results = v.get("results") or []
    if v:
        print(f"tests: {v.get('tests_passed', 0)}/{v.get('n_tests', 0)} passed ({v.get('tests_run', 0)} run)", file=out)
    for t in results:
        detail = f"  {t['detail']}" if t.get("detail") else ""
        print(f"  test {t['index']}: {t['outcome']} ({t.get('seconds', 0):.3f} s){detail}", file=out)


def print_summary(summary: Mapping[str, Any], cell: Cell, cell_dir: Path, run_id: str | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=sys.stdout, width=max(100, Console().width))
    from rich.markup import escape

    ci = summary.get("pass_at_1_ci") or {}
    interval = f"; pass@1 95% CI [{ci['low']:.4f}, {ci['high']:.4f}] (bootstrap over problems)" if ci.get("n") else ""
    t = Table(title=escape(f"{cell.name} [{cell.key}]"), caption=f"judge profile {summary.get('profile') or '?'}{interval}")
    t.add_column("set")
    t.add_column("problems", justify="right")
    t.add_column("passed", justify="right")
    t.add_column("pass@1", justify="right")
    t.add_row("all", str(summary["n_problems"]), str(summary["n_passed"]), f"{summary['pass_at_1']:.4f}")
    t.add_row(
        "extracted",
        str(summary["n_extracted"]),
        str(summary["n_passed_extracted"]),
        f"{summary['pass_at_1_extracted']:.4f}",
    )
    for tier, s in (summary.get("by_difficulty") or {}).items():
        t.add_row(tier or "(none)", str(s["n"]), str(s["passed"]), f"{s['pass_at_1']:.4f}")
    console.print(t)
    u = summary["usage"]
    lat = summary["latency_s"]
    lines = [
        f"errors (infrastructure, not scored): {summary['n_errors']}"
        + (f"  ids: {', '.join(summary['error_ids'][:20])}" if summary["error_ids"] else ""),
        f"tokens: {u['prompt_tokens']} prompt + {u['completion_tokens']} completion = {u['total_tokens']}",
        f"calls: {u['model_calls']} model ({u['failed_calls']} failed after retries; {u.get('retries', 0)} retries, "
        f"{u.get('cancelled_calls', 0)} cut unanswered), {u['tool_calls']} tool; "
        f"{u.get('requests_with_tools', 0)} requests offered tools",
        "finish reasons: " + (", ".join(f"{k}={v}" for k, v in sorted((summary.get("finish_reasons") or {}).items())) or "-")
        + (f"  ({u['length_stops']} replies cut at model.max_tokens)" if u.get("length_stops") else ""),
        f"latency per problem: mean {lat['mean']:.2f} s, p50 {lat['p50']:.2f} s, max {lat['max']:.2f} s"
        + (f"; wall {summary['wall_s']:.2f} s" if summary.get("wall_s") is not None else ""),
        "rows skipped: "
        + (", ".join(f"{k}={v}" for k, v in sorted((summary.get("skipped") or {}).items())) or "0"),
        f"outputs: {cell_dir}" + (f"   MLflow run: {run_id}" if run_id else ""),
    ]
    lines += [f"WARNING: {w}" for w in summary.get("warnings") or ()]
    for line in lines:
        print(line)
    if not summary["complete"]:
        print(
            f"INCOMPLETE: {summary['n_errors']} problem(s) with errors, {summary['n_missing']} not recorded. "
            "Rerun the same command to retry exactly those.",
        )


# ----------------------------------------------------------------------------- running


async def _solve_all(
    cfg: Mapping[str, Any],
    cell: Cell,
    todo: list[Any],
    store: RecordStore,
    *,
    topology: Any,
    endpoint: Any,
    pool: Any,
    progress: Any,
    tracker_future: Any = None,
    prompts: Any = None,
    helpers: Any = None,
) -> None:
    """Solve (here, or on a forked helper), judge and record every problem of `todo`."""
    from apps_bench.judge import Judge, has_sandbox_error
    from apps_bench.models.metering import SharedConnections
    from apps_bench.solving import HelperDied, Solved, solve_problem, solver_threads, time_cap
    from apps_bench.types import Usage

    concurrency = max(1, int(cfg["concurrency"]))
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=solver_threads(concurrency), thread_name_prefix="apps-bench"))
    judge = Judge.from_config(pool, cfg["judge"])
    sem = asyncio.Semaphore(concurrency)
    keep = bool((cfg.get("tracking") or {}).get("log_transcripts", True))
    if helpers is not None:
        helpers.attach(pool)
    connections = SharedConnections()  # one HTTP pool for every problem this process solves

    async def solve_here(problem: Any) -> Solved:
        nonlocal topology
        if topology is None:  # preloaded helpers solved so far, and every one of them is gone
            from apps_bench.topologies.registry import get_topology

            topology = get_topology(cfg.topology)
        return await solve_problem(
            problem, cfg=cfg, topology=topology, endpoint=endpoint, pool=pool, prompts=prompts, connections=connections
        )

    async def solve(index: int, problem: Any) -> Solved:
        if helpers is None:
            return await solve_here(problem)
        helper = helpers.pick()
        if helper is None:
            with helpers.solving_here():
                return await solve_here(problem)
        try:
            return await helpers.solve_on(helper, index, timeout_s=time_cap(cfg["topology"]) + 60)
        except HelperDied as exc:
            return Solved(attempt=None, usage=Usage(), error=str(exc), solver=helper.name)

    async def one(index: int, problem: Any) -> None:
        async with sem:
            solved = await solve(index, problem)
            attempt, error = solved.attempt, solved.error
            verdict = None
            t1 = time.perf_counter()
            if error is None:
                try:
                    verdict = await asyncio.to_thread(judge.score, problem, attempt.program)
                    if has_sandbox_error(verdict):
                        error = "sandbox_error: the sandbox failed while judging (infrastructure, not the program)"
                except Exception as exc:  # noqa: BLE001 - a judge crash is infrastructure for this problem
                    error = f"judge {type(exc).__name__}: {exc}"
            judge_s = time.perf_counter() - t1
            rec = make_record(
                cell, problem, attempt=attempt, verdict=verdict, usage=solved.usage, error=error,
                solve_s=solved.solve_s, judge_s=judge_s, solver=solved.solver,
            )  # fmt: skip
            await asyncio.to_thread(store.append, rec, solved.transcript if keep else None)  # fsync off the event loop
            progress.update(1, rec)
            if tracker_future is not None and tracker_future.done() and tracker_future.exception() is not None:
                raise tracker_future.exception()  # the tracking store is unusable: stop, keep the records

    try:
        await asyncio.gather(*(one(i, p) for i, p in enumerate(todo)))
    finally:
        await connections.aclose()


class _Progress:
    def __init__(self, total: int, done: int, enabled: bool, label: str):
        self.passed = 0
        self.errors = 0
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=done, desc=label, unit="problem", file=sys.stderr, dynamic_ncols=True)

    def update(self, n: int, rec: Mapping[str, Any]) -> None:
        self.passed += bool(rec.get("passed"))
        self.errors += bool(rec.get("error"))
        if self.bar is not None:
            self.bar.set_postfix(passed=self.passed, errors=self.errors, refresh=False)
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _optimize(node: Any, data: Mapping[str, Any], cell: Cell, loaded: Any, cell_dir: Path) -> tuple[Any, Any, Any]:
    """An optimizer cell first optimizes the topology's prompts on training problems (the
    protocol in apps_bench.optimizers; its cache makes a rerun replay, not recompute), then
    the chosen prompt set is evaluated on this cell's problems like any cell, in a child run
    (layout: optimizers/cell_runs.py). -> (the cell's tracker, PromptSet, OptimizeResult)."""
    try:
        from apps_bench.optimizers.entry import run_optimizer_cell
        from apps_bench.optimizers.run import step_metrics
        from apps_bench.optimizers.scoring import InfrastructureDown
    except ImportError as exc:
        raise CellSetupError(
            f"optimizer={cell.optimizer} needs the optimizers extra: pip install 'apps-bench[optimizers]' ({exc})"
        ) from exc
    from apps_bench.optimizers.cell_runs import StepMetricsSink, link_tags, seed_cell_of
    from apps_bench.topologies.base import PromptSet

    tags = {**link_tags(cell, seed_cell_of(data)), "run_kind": "optimizer_cell"}
    tx = ThreadPoolExecutor(max_workers=1, thread_name_prefix="apps-bench-tracking")
    sink = StepMetricsSink(tx.submit(_open_tracker, data, cell, loaded, extra_tags=tags), step_metrics)
    tx.shutdown(wait=False)
    print(f"apps-bench: optimizer={cell.optimizer}: optimizing the {cell.topology} prompts first", file=sys.stderr)
    try:
        result = run_optimizer_cell(node, out_dir=cell_dir / "optimizer", hook=sink)
        tracker = sink.flush()
    except ValueError as exc:  # bad pool / optimizer settings: the message says which
        sink.fail(f"{type(exc).__name__}: {exc}")
        raise CellSetupError(f"optimizer={cell.optimizer}: {exc}") from exc
    except InfrastructureDown as exc:  # model/sandbox down: a clean stop; the rerun resumes through the cache
        sink.fail(f"{type(exc).__name__}: {exc}")
        raise CellSetupError(f"optimizer={cell.optimizer} stopped: {exc}") from exc
    except BaseException as exc:
        if not isinstance(exc, (KeyboardInterrupt, SystemExit)):
            sink.fail(f"{type(exc).__name__}: {exc}")
        raise
    print(
        f"apps-bench: optimizer={cell.optimizer} chose a prompt set (val strict: seed {result.seed_val.strict:.3f} -> "
        f"chosen {result.chosen_val.strict:.3f}); evaluating it on the cell's problems",
        file=sys.stderr,
    )
    return tracker, PromptSet(dict(result.chosen)), result


def _start_solvers(data: Mapping[str, Any], node: Any, todo: list[Any], *, endpoint: Any, prompts: Any) -> tuple[Any, Any]:
    """The processes `processes` asks for -> (SolverProcesses or None, the topology to solve
    with here or None). Given the command's preloader (apps_bench.preloader), it forks all
    of them and this process never imports the framework; otherwise this process imports
    it, solves, and forks the rest itself."""
    from functools import partial

    from apps_bench import preloader
    from apps_bench.solving import SolverProcesses, helper_count, solve_problem, solver_threads
    from apps_bench.topologies.registry import get_topology

    concurrency = max(1, int(data["concurrency"]))
    threads = solver_threads(concurrency)
    try:
        n = helper_count(
            data["processes"], concurrency=concurrency, n_problems=len(todo),
            framework=str(data["topology"].get("framework", "")),
        )  # fmt: skip
    except ValueError as exc:
        raise CellSetupError(str(exc)) from exc
    pre = preloader.take()
    if pre is not None:
        spawned = pre.spawn(n + 1, todo, cfg=data, endpoint=endpoint, prompts=prompts, threads=threads) if n > 0 else None
        if spawned:
            _settle_heap()
            return SolverProcesses.adopt(spawned, pre), None
        pre.discard()
    try:
        topology = get_topology(node.topology)  # a missing framework fails now, with the pip command
    except ImportError as exc:
        raise CellSetupError(str(exc)) from exc
    _settle_heap()  # everything long-lived is loaded now, and no helper is forked yet
    if n <= 0:
        return None, topology
    solve = partial(solve_problem, cfg=node, topology=topology, endpoint=endpoint, prompts=prompts)
    return SolverProcesses.fork(n, todo, solve, threads=threads), topology


def _quiet_libraries() -> None:
    """Per-request INFO lines of the HTTP clients drown the progress bar and the summary."""
    import logging

    for name in ("httpx", "httpx2", "httpcore", "httpcore2", "openai", "mlflow", "alembic", "urllib3"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _settle_heap() -> None:
    """The command starts with the garbage collector off (__main__): start-up (config, data,
    the framework's import) makes about a million long-lived objects and little garbage, and
    each full pass over them costs ~0.3 s of a core. Once they exist, freeze them (later passes
    skip them; forked helpers share their pages instead of copying them) and turn it back on.
    A library caller, whose collector was never turned off, is left alone."""
    import gc

    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def run_cell(cfg: Any) -> CellResult:
    """Run (or resume) one cell: the whole loop, records, summary and MLflow run."""
    import yaml

    t_start = time.perf_counter()
    phases: dict[str, float] = {}
    _quiet_libraries()
    from omegaconf import OmegaConf

    data = plain_config(cfg)
    node = OmegaConf.create(data)  # attribute + mapping access for the other modules' APIs
    cell = guard(data)  # raises CellRefused before anything runs

    from apps_bench.data import load_selection

    try:
        loaded = load_selection(data)
    except (ValueError, FileNotFoundError, OSError) as exc:
        raise CellSetupError(f"cannot load dataset {cell.dataset}: {exc}") from exc
    empty = empty_selection(loaded, data)
    if empty is not None:
        raise InvalidSettings([empty])  # a cell of zero problems is an error, not a 0.0 score
    problems = loaded.problems
    if loaded.missing_ids:
        print(f"warning: no row has IDs {', '.join(loaded.missing_ids)}", file=sys.stderr)

    cell_dir = cell_dir_for(data, cell)
    store = RecordStore(cell_dir)
    info = {"name": cell.name, "axes": cell.axes(), "identity": dict(cell.identity)}
    store.claim(cell.key, info)
    store.write_config(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    try:
        from apps_bench.topologies.prompts import load_prompts

        store.write_json(PROMPTS, dict(load_prompts(node.topology).texts))
    except Exception as exc:  # noqa: BLE001 - a bad prompt set is a setup error with its own message
        raise CellSetupError(str(exc)) from exc
    state = store.resume()
    selected = {record_key(p.split, p.id) for p in problems}
    todo = [p for p in problems if record_key(p.split, p.id) not in state.done]
    n_done = len(problems) - len(todo)
    verbose = bool(data.get("verbose")) or data["dataset"].get("source") == "demo"

    print(
        f"apps-bench: cell {cell.name} [{cell.key}] dataset={cell.dataset} ({loaded.source}, revision {loaded.revision}): "
        f"{len(problems)} problems, {n_done} already recorded, {len(todo)} to run"
        + (f" ({len(state.retried)} retried after errors)" if state.retried else "")
        + (f", {loaded.n_skipped} rows skipped" if loaded.n_skipped else ""),
        file=sys.stderr,
    )
    if data["model"].get("provider") == "gold":
        print(
            "apps-bench: model=gold is the built-in harness self-check server: it answers with reference "
            "solutions; it is not an LLM and its scores measure the harness, not a model.",
            file=sys.stderr,
        )

    pre_tracker = None  # an optimizer cell's own run; its final evaluation is a child run
    prompts = opt_result = None
    if cell.optimizer != "none":
        _settle_heap()  # optimizing runs long: collect as usual
        pre_tracker, prompts, opt_result = _optimize(node, data, cell, loaded, cell_dir)
        store.write_json(PROMPTS, dict(prompts.texts))

    tracker = None
    solvers = 0
    sandbox_features = _previous_sandbox(cell_dir)  # a rerun with nothing to solve starts no sandbox
    if todo:
        from apps_bench.models import ModelEndpointError, open_endpoint
        from apps_bench.sandbox import SandboxPool

        try:  # first, and fast: an unreachable endpoint fails before any MLflow run exists
            endpoint_cm = open_endpoint(node.model, problems)
            endpoint = endpoint_cm.__enter__()
        except ModelEndpointError as exc:
            raise CellSetupError(str(exc)) from exc
        # The MLflow run opens in a helper process (importing mlflow and reaching the store take
        # seconds, on another core) while the solvers start and the first problems run; a store
        # that fails stops the cell at the next completed problem, and the records written so
        # far are kept for the rerun. An optimizer cell's final evaluation is a child of its run.
        tx = ThreadPoolExecutor(max_workers=1, thread_name_prefix="apps-bench-tracking")
        tracker_future = tx.submit(_open_tracker, data, cell, loaded, final_eval_of=pre_tracker)
        helpers = None
        try:
            helpers, topology = _start_solvers(data, node, todo, endpoint=endpoint, prompts=prompts)
            solvers = (len(helpers.helpers) if helpers is not None else 0) + (topology is not None)
            with SandboxPool.from_config(data["judge"]) as pool:
                progress = _Progress(len(problems), n_done, bool(data.get("progress", True)), cell.name)
                try:
                    phases["setup_s"] = time.perf_counter() - t_start
                    asyncio.run(
                        _solve_all(
                            node, cell, todo, store, topology=topology, endpoint=endpoint, pool=pool,
                            progress=progress, tracker_future=tracker_future, prompts=prompts, helpers=helpers,
                        )
                    )
                finally:
                    progress.close()
                    phases["problems_s"] = time.perf_counter() - t_start - phases.get("setup_s", 0.0)
                sandbox_features = pool.features
            tracker = tracker_future.result()
        except BaseException as exc:
            if not isinstance(exc, (KeyboardInterrupt, SystemExit)):  # an interrupted run stays open for its rerun
                for get_run in (tracker_future.result, lambda: pre_tracker):
                    try:
                        run = get_run()
                        if run is not None:
                            run.fail(f"{type(exc).__name__}: {exc}")
                    except Exception:  # noqa: BLE001 - the store itself failed: the cell's own error is the one to show
                        pass
            raise
        finally:
            if helpers is not None:
                helpers.close()
            tx.shutdown(wait=True)
            store.close()
            endpoint_cm.__exit__(None, None, None)
    else:
        _settle_heap()
        tracker = _open_tracker(data, cell, loaded, final_eval_of=pre_tracker)

    records = [r for r in store.records() if r["key"] in selected]
    order = {record_key(p.split, p.id): i for i, p in enumerate(problems)}
    records.sort(key=lambda r: order.get(r["key"], 0))
    summary = summarize_cell(
        records,
        n_selected=len(problems),
        skipped=loaded.skipped,
        profile=str(data["judge"]["profile"]),
        wall_s=time.perf_counter() - t_start,
    )
    summary["phases_s"] = {k: round(v, 3) for k, v in phases.items()}
    summary["run"] = {"concurrency": int(data["concurrency"]), "processes": str(data["processes"]), "solvers": solvers}
    summary["cell"] = {"key": cell.key, "name": cell.name, **cell.axes(), "model_label": cell.model_label}
    from apps_bench.topologies.tool_use import tool_protocol, tool_warnings  # not at import: re-scoring loads no topology

    summary["tool_protocol"] = tool_protocol(records)
    summary["warnings"] = tool_warnings(records, data["topology"], data["model"])
    summary["dataset"] = {"source": loaded.source, "revision": loaded.revision}
    from apps_bench import provenance

    summary["provenance"] = provenance.collect(str(data["topology"].get("framework", "")), sandbox_features)
    store.write_json(CELL, {"key": cell.key, **info, "provenance": summary["provenance"]})
    summary_path = store.write_summary(summary)

    if verbose:
        for rec in records:
            print_problem(rec)
        print()
    run_id = tracker.run_id if tracker else None
    if tracker is not None:
        files = [cell_dir / RECORDS, summary_path, cell_dir / CONFIG, cell_dir / PROMPTS]
        if (data.get("tracking") or {}).get("log_transcripts", True):
            files.append(cell_dir / TRANSCRIPTS)
        tracker.finish(
            metrics=metrics_of(summary),
            rows=table_rows(records),
            files=files,
            complete=bool(summary["complete"]),
            tags={**summary_tags(summary), **provenance.as_tags(summary["provenance"])},
        )
    print_summary(summary, cell, cell_dir, run_id)
    if pre_tracker is not None:
        _finish_optimizer_run(pre_tracker, data, cell, cell_dir, opt_result, summary, run_id)
    return CellResult(cell=cell, dir=cell_dir, summary=summary, complete=bool(summary["complete"]), run_id=run_id, records=records)


def _previous_sandbox(cell_dir: Path) -> Any:
    """The sandbox features an earlier run of this cell recorded (None when none did)."""
    import json

    try:
        return (json.loads((cell_dir / SUMMARY).read_text(encoding="utf-8")).get("provenance") or {}).get("sandbox")
    except (OSError, ValueError, AttributeError):
        return None


def _finish_optimizer_run(
    tracker: Any, data: Mapping[str, Any], cell: Cell, cell_dir: Path, result: Any, summary: Mapping[str, Any], child_id: str | None
) -> None:
    """The optimizer cell's run: its optimization figures and artifacts, the final eval's
    headline copied over, the seed cell's pass@1 when it ran here; then the comparison line."""
    from apps_bench import provenance
    from apps_bench.optimizers import cell_runs

    seed = cell_runs.seed_cell_result(cell_runs.seed_cell_of(data))
    metrics = {**cell_runs.optimizer_metrics(result), **cell_runs.headline(metrics_of(summary), seed)}
    tracker.finish(
        metrics=metrics,
        rows=[],
        files=[cell_dir / CONFIG, cell_dir / PROMPTS],
        complete=bool(summary["complete"]),
        tags={"final_eval_run_id": child_id or "", **provenance.as_tags(summary["provenance"])},
        dirs={"optimizer": cell_dir / "optimizer"},
    )
    print(f"MLflow: optimizer cell run {tracker.run_id} (final evaluation: child run {child_id})")
    print(cell_runs.comparison_line(float(summary["pass_at_1"]), seed))


def _open_tracker(
    data: Mapping[str, Any], cell: Cell, loaded: Any, *, extra_tags: Mapping[str, str] | None = None, final_eval_of: Any = None
) -> Any:
    """The cell's MLflow run; with `final_eval_of` (an optimizer cell's run), its final-eval child run."""
    from apps_bench.tracking import mlflow as mlf

    tags = {
        **{k: str(v) for k, v in cell.axes().items()},
        # the model's identity: the report's "model" column must not merge different served models
        "model": cell.model_label,
        "model_preset": cell.model,
        "model_id": str(data["model"].get("model_id", "")),
        "endpoint_kind": str(data["model"].get("provider", "")),
        "cell_key": cell.key,
        "cell_name": cell.name,
        "framework": str(data["topology"].get("framework", "")),
        "judge_profile": str(data["judge"]["profile"]),
        "max_tests_per_row": str(data["max_tests_per_row"]),
        "dataset_revision": str(loaded.revision),
        "dataset_source": str(loaded.source),
        "package_version": mlf.package_version(),
        **mlf.git_info(),
        **(extra_tags or {}),
    }
    from apps_bench.tracking.sidecar import open_cell_run

    experiment = str((data.get("tracking") or {}).get("experiment") or "apps")
    if final_eval_of is not None:
        from apps_bench.optimizers.cell_runs import final_eval_tags, seed_cell_of

        return open_cell_run(
            experiment=experiment,
            cell_key=cell.key,
            run_name=f"{cell.name}·final_eval",
            params=dict(cell.identity),
            tags=final_eval_tags(tags, cell, seed_cell_of(data), final_eval_of.run_id),
            uri=mlf.tracking_uri(),
            key_tag="final_eval_of",
            parent_run_id=final_eval_of.run_id,
        )

    # served by a helper process: mlflow's import and store I/O run on another core
    return open_cell_run(
        experiment=experiment,
        cell_key=cell.key,
        run_name=cell.name,
        params=dict(cell.identity),
        tags=tags,
        uri=mlf.tracking_uri(),
    )
