"""Micro-benchmark: cost per trivial test, warm contained pool vs a fresh `python` per test.

    python benchmarks/sandbox_micro.py [--tests-per-program 6] [--programs 60] [--baseline-tests 60]

Measured in one run, on the same machine and load, and reported as ratios (absolute
milliseconds depend on the machine and on what else runs). The pool is measured
twice: one caller thread on one worker (pure per-test overhead), and one thread per
core on a pool sized to the cores (the judge's arrangement). Beside the wall time, the
CPU time per test of the sandbox (workers and the program children they reaped, read
from /proc) and of this process (the callers): CPU does not wait for a busy machine,
so it compares two trees run under load far better than wall time. The baseline starts a
fresh interpreter for every test and runs the program bare (no prelude) — what most
harnesses do; `--baseline-prelude` adds the APPS prelude (numpy) to it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from apps_bench.cell.cpus import usable_cpus
from apps_bench.judge.profiles import judge_config
from apps_bench.sandbox import RunRequest, SandboxPool
from apps_bench.sandbox.harness import PRELUDE

PROGRAM = "n = int(input())\nprint(n + 1)\n"


@dataclass
class PoolCost:
    """Per test: wall seconds, CPU seconds of the sandbox processes and of the calling process."""

    wall: float
    sandbox_cpu: float
    caller_cpu: float


def sandbox_cpu(pool: SandboxPool) -> float:
    """CPU seconds so far of the pool's processes and of the children they reaped (a killed program's too)."""
    total = 0
    for pid in pool.worker_pids():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / os.sysconf("SC_CLK_TCK")


def bench_pool(pool: SandboxPool, programs: int, per_program: int, threads: int) -> PoolCost:
    """Cost per test when `threads` callers judge `programs` programs of `per_program` tests."""
    reqs = [RunRequest(PROGRAM, "stdin", [str(p * 100 + i) for i in range(per_program)]) for p in range(programs)]

    def one(req: RunRequest) -> None:
        rs = pool.run(req)
        expect = [f"{int(x) + 1}\n" for x in req.inputs]
        if [r.stdout for r in rs] != expect:
            raise SystemExit(f"wrong pool output: {rs}")

    pool.run(reqs[0])  # warm
    n = programs * per_program
    t0, c0, own0 = time.perf_counter(), sandbox_cpu(pool), time.process_time()
    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(one, reqs))
    return PoolCost((time.perf_counter() - t0) / n, (sandbox_cpu(pool) - c0) / n, (time.process_time() - own0) / n)


def bench_fresh(tests: int, prelude: bool) -> float:
    code = (PRELUDE if prelude else "") + PROGRAM
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "MLFLOW", "HF_"))}
    t0 = time.perf_counter()
    for i in range(tests):
        out = subprocess.run([sys.executable, "-c", code], input=f"{i}\n", capture_output=True, text=True, timeout=30, env=env)
        if out.stdout != f"{i + 1}\n":
            raise SystemExit(f"wrong baseline output: {out!r}")
    return (time.perf_counter() - t0) / tests


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", type=int, default=60)
    ap.add_argument("--tests-per-program", type=int, default=6, help="APPS train_mini150 averages ~6.4")
    ap.add_argument("--baseline-tests", type=int, default=60)
    ap.add_argument("--baseline-prelude", action="store_true", help="also time a fresh python + the prelude")
    args = ap.parse_args()
    cores = usable_cpus()

    with SandboxPool.from_config(judge_config("seed"), workers=1) as one:
        feats = one.features
        single = bench_pool(one, args.programs, args.tests_per_program, threads=1)
        per_prog = bench_pool(one, max(10, args.programs // 2), 1, threads=1)
    with SandboxPool.from_config(judge_config("seed"), workers=0) as full:
        _ = full.features  # waits until every worker is up
        parallel = bench_pool(full, args.programs, args.tests_per_program, threads=cores)
    fresh = bench_fresh(args.baseline_tests, prelude=False)
    fresh_prelude = bench_fresh(max(5, args.baseline_tests // 4), prelude=True) if args.baseline_prelude else None

    print(
        f"containment: {'contained (namespaces, uid, cgroup)' if feats.get('contained') else 'WEAK fallback'}; "
        f"cores: {cores}; load average: {os.getloadavg()[0]:.2f}"
    )
    rows: list[tuple[str, PoolCost | float]] = [
        (f"pool, 1 worker, 1 thread ({args.tests_per_program} tests/program)", single),
        ("pool, 1 worker, 1 thread (1 test/program: fork+sweep cost)", per_prog),
        (f"pool, {cores} workers, {cores} threads ({args.tests_per_program} tests/program)", parallel),
        ("fresh python per test, bare program, sequential", fresh),
    ]
    if fresh_prelude is not None:
        rows.append(("fresh python per test + APPS prelude, sequential", fresh_prelude))
    for label, cost in rows:
        if isinstance(cost, PoolCost):
            print(
                f"  {label:<66} {cost.wall * 1000:8.2f} ms/test  (CPU: sandbox {cost.sandbox_cpu * 1000:.2f}, "
                f"caller {cost.caller_cpu * 1000:.2f} ms/test)"
            )
        else:
            print(f"  {label:<66} {cost * 1000:8.2f} ms/test")
    print(f"ratio fresh-python / pool (1 thread):        {fresh / single.wall:6.1f}x")
    print(f"ratio fresh-python / pool ({cores} threads):       {fresh / parallel.wall:6.1f}x")
    if fresh_prelude is not None:
        print(f"ratio fresh-python+prelude / pool ({cores} threads): {fresh_prelude / parallel.wall:6.1f}x")


if __name__ == "__main__":
    main()
