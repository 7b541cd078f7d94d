#!/usr/bin/env python
"""Trace overhead: the same gold cell (100 problems of train_mini150) with a trace per problem
(`tracking.traces=true`) and without (`tracking.traces=false`), alternated in one session.

Each run is the whole `python -m apps_bench` command (a fresh cell folder and MLflow experiment
in one store created beforehand, so no run pays the SQLite migrations): wall time end to end,
and CPU time (user + system of the command and every process it waited for: solver workers,
the gold server's thread, sandbox children, as `wait4` reports them). Both modes run `--repeat`
times, interleaved (off, on, off, on, ...); medians count. Records of both modes are compared
apart from timing fields: tracing must change none. The machine is shared: the printed load
average says how rough the numbers are.

Where a trace's CPU goes: a `sitecustomize` on the cells' PYTHONPATH adds up the CPU of the cell's
trace-writer thread (`TraceWriter._write`: building the tree from what was captured, with MLflow's
span API) and, when the cell's run is finished (`CellRun.finish`, after the writer has flushed), reads
the process's CPU and each running thread's from /proc, in both modes; per trace = on - off, medians.
MLflow's export workers are gone by then: their share is the process's less the threads listed.
Nothing else changes.

With `--server` the cells log to a real `mlflow server` on loopback (launchers/mlflow_server.sh, its
own SQLite store and artifact folder) as a study's cells do, instead of a SQLite file: the store's
work then runs in the server's processes, whose CPU (the server and its workers, read from /proc
around each run) is shown apart from the cell's.

Usage (from anywhere):
  python benchmarks/trace_overhead.py [--rows FILE] [--n 100] [--topology sequential_langgraph] [--repeat 2] [--server]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import free_port, run_timed, tree_cpu  # noqa: E402

WHERE = """
import json, os, threading, time


def _cpu(native_id):
    fields = open(f"/proc/self/task/{native_id}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


try:
    from apps_bench.tracking import mlflow as _m, traces as _t

    _writer = [0.0]
    _write, _finish = _t.TraceWriter._write, _m.CellRun.finish

    def _timed_write(self, *args, **kwargs):
        t0 = time.thread_time()
        try:
            return _write(self, *args, **kwargs)
        finally:
            _writer[0] += time.thread_time() - t0

    def _finish_and_log(self, *args, **kwargs):
        threads = {}
        for th in threading.enumerate():
            name = th.name.split(" ")[0].rstrip("0123456789_-:") or th.name
            try:
                threads[name] = threads.get(name, 0.0) + _cpu(th.native_id)
            except OSError:
                pass
        t = os.times()
        with open(os.environ["TRACE_WHERE_LOG"], "a") as f:
            f.write(json.dumps({"process_s": t.user + t.system, "writer_s": _writer[0], "threads": threads}) + "\\n")
        return _finish(self, *args, **kwargs)

    _t.TraceWriter._write, _m.CellRun.finish = _timed_write, _finish_and_log
except ImportError:
    pass
"""

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ROWS = REPO / "tests" / "fixtures" / "apps" / "train_mini150.jsonl"  # the vendored rows
TIMING = {"latency_s", "solve_s", "judge_s", "completed_at", "solver"}


def comparable(records: Path) -> list[dict]:
    out = []
    for line in records.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        r = {k: v for k, v in r.items() if k not in TIMING}
        r["usage"] = {k: v for k, v in r["usage"].items() if k != "tool_s"}
        if r.get("verdict"):
            r["verdict"] = {k: v for k, v in r["verdict"].items() if k != "seconds"}
            r["verdict"]["results"] = [{k: v for k, v in t.items() if k != "seconds"} for t in r["verdict"]["results"]]
        out.append(r)
    return sorted(out, key=lambda r: r["key"])


def differences(a: list[dict], b: list[dict]) -> list[str]:
    """Which problems' records differ, and in which fields (e.g. a test timed out on a loaded machine)."""
    bk = {r["key"]: r for r in b}
    return [
        f"{r['key']}: {sorted(k for k in r.keys() | bk.get(r['key'], {}).keys() if r.get(k) != bk.get(r['key'], {}).get(k))}"
        for r in a
        if r != bk.get(r["key"])
    ][:10]


@contextmanager
def mlflow_server(root: Path) -> Iterator[tuple[str, int]]:
    """A real `mlflow server` on loopback, as launchers/mlflow_server.sh starts one for a team:
    (its tracking URI, its pid) once it answers, stopped afterwards."""
    port = free_port()
    env = {**os.environ, "PYTHON": sys.executable, "PORT": str(port), "MLFLOW_SERVER_DIR": str(root)}
    log = root.parent / "mlflow_server.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            ["bash", str(REPO / "launchers" / "mlflow_server.sh")],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None:
                    raise SystemExit(f"mlflow server exited ({proc.returncode}); see {log}") from None
                time.sleep(0.2)
        else:
            raise SystemExit("mlflow server did not answer within 120 s")
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def count_traces(tracking_uri: str, experiment: str) -> tuple[int, int]:
    """(traces, spans) in the store; every trace must be whole (its judge span written too)."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    exp = mlflow.get_experiment_by_name(experiment)
    traces = mlflow.search_traces(locations=[exp.experiment_id], return_type="list")
    assert all(any(sp.name == "judge" for sp in t.data.spans) for t in traces), "a trace was stored without its judge span"
    return len(traces), sum(len(t.data.spans) for t in traces)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=Path, default=DEFAULT_ROWS)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--topology", default="sequential_langgraph")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each mode, interleaved; medians count")
    ap.add_argument("--keep", type=Path, help="keep outputs in this folder (default: a temp dir)")
    ap.add_argument("--server", action="store_true", help="log to a real `mlflow server` on loopback; its CPU apart")
    args = ap.parse_args()
    if not args.rows.exists():
        print(f"rows not found: {args.rows}", file=sys.stderr)
        return 2
    work = args.keep or Path(tempfile.mkdtemp(prefix="trace_overhead_"))
    work.mkdir(parents=True, exist_ok=True)
    if not args.server:
        return measure(args, work, f"sqlite:///{work / 'mlflow.db'}", None)
    with mlflow_server(work / "mlflow-server") as (uri, pid):
        return measure(args, work, uri, pid)


def measure(args: argparse.Namespace, work: Path, tracking_uri: str, server_pid: int | None) -> int:
    """Both modes, interleaved, into the store at `tracking_uri` (served by `server_pid`, if any); the tables."""
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": tracking_uri,
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "HF_HUB_OFFLINE": "1",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    env.pop("APPS_BENCH_PARENT_RUN_ID", None)
    (work / "where").mkdir(exist_ok=True)
    (work / "where" / "sitecustomize.py").write_text(WHERE)
    where_log = work / "where.jsonl"
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(work / "where"), env.get("PYTHONPATH", "")) if p),
        TRACE_WHERE_LOG=str(where_log),
    )
    py = sys.executable
    subprocess.run(
        [py, "-c", "from apps_bench.tracking import mlflow as m; m.client(m.tracking_uri())"], cwd=work, env=env, check=True
    )
    base = [
        py,
        "-m",
        "apps_bench",
        "model=gold",
        "dataset=apps",
        f"dataset.path={args.rows}",
        "dataset.split=train",
        f"limit={args.n}",
        f"topology={args.topology}",
        "progress=false",
    ]

    results: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    served: dict[str, list[float]] = {"off": [], "on": []}  # the server's CPU during each run
    where: dict[str, list[dict]] = {"off": [], "on": []}  # the cell process's threads at the run's finish
    records: dict[str, list[dict]] = {}
    load = [os.getloadavg()[0]]
    for i in range(args.repeat):
        for mode in ("off", "on"):
            tag = f"{mode}_{i}"
            cmd = base + [
                f"tracking.traces={'true' if mode == 'on' else 'false'}",
                f"out_dir={work / tag}",
                f"tracking.experiment=trace_overhead_{tag}",
            ]
            s0 = tree_cpu(server_pid) if server_pid else 0.0
            wall, cpu = run_timed(cmd, work, env)
            served[mode].append(tree_cpu(server_pid) - s0 if server_pid else 0.0)
            load.append(os.getloadavg()[0])
            results[mode].append((wall, cpu))
            where[mode].append(json.loads(where_log.read_text().splitlines()[-1]))
            recs = comparable(work / tag / "records.jsonl")
            records.setdefault(mode, recs)
            assert recs == records[mode], (
                f"{mode} run {i}: records differ from the first {mode} run: {differences(recs, records[mode])}"
            )
            n_traces, n_spans = count_traces(tracking_uri, f"trace_overhead_{tag}")
            server = f"  server cpu {served[mode][-1]:5.1f} s" if server_pid else ""
            print(
                f"traces {mode:>3} run {i}: wall {wall:6.1f} s  cpu {cpu:6.1f} s{server}  problems {len(recs)}  "
                f"traces {n_traces} ({n_spans} spans)  load {load[-1]:.1f}",
                flush=True,
            )
            assert n_traces == (len(recs) if mode == "on" else 0)
    same = records["on"] == records["off"]
    if not same:
        print("records that differ on/off:", differences(records["on"], records["off"]))
    med = {m: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for m, v in results.items()}
    print()
    store = f"a real `mlflow server` ({tracking_uri}, SQLite behind it)" if server_pid else "a SQLite file"
    print(
        f"trace overhead: {args.n} problems, model=gold, topology={args.topology}, store: {store}, median of {args.repeat} each "
        f"(load average {min(load):.1f}-{max(load):.1f} on {os.cpu_count()} CPUs: rough numbers)"
    )
    print(f"  {'':14}{'wall s':>9}{'CPU s':>9}")
    for mode in ("off", "on"):
        print(f"  traces {mode:<7}{med[mode][0]:9.1f}{med[mode][1]:9.1f}")
    print(f"  ratio on/off  {med['on'][0] / med['off'][0]:8.2f}x{med['on'][1] / med['off'][1]:8.2f}x")
    if server_pid:
        s_off, s_on = statistics.median(served["off"]), statistics.median(served["on"])
        print(f"  the server's CPU: {s_off:.1f} s off, {s_on:.1f} s on: {(s_on - s_off) * 1000 / args.n:.1f} ms per trace")
    print(f"  records equal apart from timing: {same}")

    # Per trace: what each thread of the cell's process spent more with traces on (on - off, medians), and
    # the process's own rest (MLflow's export workers, already gone at the finish, and the main thread).
    def per(mode: str, f: Callable[[dict], float]) -> float:
        return statistics.median(f(w) for w in where[mode])

    def thread(name: str) -> Callable[[dict], float]:
        return lambda w: w["threads"].get(name, 0.0)

    extra = {
        "all of tracing (the whole command)": med["on"][1] - med["off"][1],
        "the cell's process": per("on", lambda w: w["process_s"]) - per("off", lambda w: w["process_s"]),
        "  trace writer thread (the tree, MLflow's span API)": per("on", lambda w: w["writer_s"]),
    }
    names = sorted({n for m in where.values() for w in m for n in w["threads"]} - {"apps-bench-traces"})
    listed = extra["  trace writer thread (the tree, MLflow's span API)"]
    for n in names:
        d = per("on", thread(n)) - per("off", thread(n))
        if abs(d) * 1000 / args.n >= 0.5:
            extra[f"  thread {n}"] = d
            listed += d
    extra["  the rest: threads gone by the finish (MLflow's export workers)"] = extra["the cell's process"] - listed
    print("\nwhere a trace's CPU goes (ms per trace: on - off, medians; the cell's process read at its run's finish)")
    for what, seconds in extra.items():
        print(f"  {what:<66}{seconds * 1000 / args.n:8.1f}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
