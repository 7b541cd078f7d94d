#!/usr/bin/env python
"""MLflow's own CPU per trace on a SQLite store, apart from this project: what a trace costs at
the least, whatever builds it.

Each case writes `--n` traces of one root span and K child spans (K = 0, 3, 13: the cell's
traces have 13 under the root for sequential_langgraph on gold) with MLflow's public span API
(`mlflow.start_span_no_context`, as tracking/traces.py does) into a fresh SQLite store, then
flushes; CPU = the process's (all threads: MLflow exports on its own workers) from the first
trace to the end of the flush. Export settings as the cell sets them (async trace logging, the
batch span processor, batches of 256 spans), and once with MLflow's synchronous export for
comparison. Each case runs in a fresh interpreter.

Usage (from anywhere):
  python benchmarks/trace_store_cost.py [--n 100] [--payload 6000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from apps_bench.tracking.traces import TRACE_EXPORT

CASE = r"""
import json, os, sys, tempfile, time
import mlflow
from mlflow.entities import SpanType

n, children, payload = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
mlflow.set_tracking_uri(f"sqlite:///{tempfile.mkdtemp()}/mlflow.db")
exp = mlflow.set_experiment("trace_store_cost")
messages = [{"role": "system", "content": "s" * payload}, {"role": "user", "content": "u" * payload}]


def trace(i):
    root = mlflow.start_span_no_context(name=f"problem {i}", span_type=SpanType.AGENT, inputs={"question": "q" * payload},
                                        tags={"problem_id": str(i), "passed": "true"}, experiment_id=exp.experiment_id)
    for _ in range(children):
        span = mlflow.start_span_no_context(name="chat", span_type=SpanType.CHAT_MODEL, parent_span=root,
                                            inputs={"messages": messages}, attributes={"role": "solver"})
        span.end(outputs={"choices": [{"message": {"content": "r" * payload}}]})
    root.end(outputs={"program": "p" * payload})


trace(-1)  # the first trace starts MLflow's exporter
mlflow.flush_trace_async_logging()
t0 = time.process_time()
for i in range(n):
    trace(i)
built = time.process_time()
mlflow.flush_trace_async_logging()
print(json.dumps({"per_trace_ms": (time.process_time() - t0) / n * 1000, "spans_ms": (built - t0) / n * 1000}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--n", type=int, default=100, help="traces per case")
    ap.add_argument("--payload", type=int, default=6000, help="characters per message, input and output")
    args = ap.parse_args()
    batched = TRACE_EXPORT  # as the cell sets them
    synchronous = {"MLFLOW_ENABLE_ASYNC_TRACE_LOGGING": "false", "MLFLOW_USE_BATCH_SPAN_PROCESSOR": "false"}
    cases = [("as the cell writes them", batched, k) for k in (0, 3, 13)] + [("synchronous export", synchronous, 13)]
    print(
        f"MLflow's CPU per trace on SQLite ({args.n} traces per case, {args.payload}-character messages; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)"
    )
    print(f"  {'export':<26}{'child spans':>12}{'ms per trace':>14}{'of it building spans':>22}")
    for name, settings, children in cases:
        env = {**os.environ, **settings, "MLFLOW_DISABLE_TELEMETRY": "true"}
        with tempfile.TemporaryDirectory() as cwd:
            out = subprocess.run(
                [sys.executable, "-c", CASE, str(args.n), str(children), str(args.payload)],
                env=env,
                cwd=cwd,
                capture_output=True,
                text=True,
                check=True,
            )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"  {name:<26}{children:>12}{r['per_trace_ms']:>14.1f}{r['spans_ms']:>22.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
