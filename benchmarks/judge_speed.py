#!/usr/bin/env python
"""Judge speed: the project's judge command vs one fresh `python` per test.

In one run, judge the reference solutions (first solution of each problem, all tests)
of an APPS file with
  (a) `python -m apps_bench.judge ROWS --gold --max-tests-per-row 0` as a subprocess,
      the whole command timed (interpreter start, imports, loading, pool start-up);
  (b) a baseline that starts a fresh `python` for every test, one after another, the
      program run bare (no prelude, default int-string limit), and compares with the
      same comparison functions, stopping a problem at its first failing test.
Then check that the per-problem verdicts agree, explain each disagreement (a rerun
of the baseline with the seed prelude decides "prelude"; a test near the time limit
is "timing-marginal"), and print both times, the ratio and the compute floor (the
solutions' own CPU time, measured inside the baseline's children).

With --every-test-cost, instead: what running every kept test of a failing program costs (the
test-case average needs it; judge.stop_on_first_failure: false) against stopping at its first
failing test. Each row is answered with the next row's reference solution (wrong programs that
really run: wrong answers, crashes, the odd timeout), judged with all tests both ways,
alternating, --repeat times each; the medians and the tests run are printed.

Usage (from the repo root):
  python benchmarks/judge_speed.py [ROWS] [--timeout-s 4] [--workers 0] [--every-test-cost]
ROWS defaults to tests/fixtures/apps/train_mini150.jsonl (the vendored rows).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from omegaconf import OmegaConf  # noqa: E402

from apps_bench.config.schema import DatasetConfig, typed  # noqa: E402
from apps_bench.data import load_problems  # noqa: E402
from apps_bench.judge.compare import compare_call, compare_stdin  # noqa: E402

# The seed profile's prelude (docs/judge.md), used only to explain disagreements.
PRELUDE = """\
import sys, time, itertools, collections, functools, math, fractions, random, heapq
from itertools import accumulate, product, permutations, combinations
from collections import Counter, OrderedDict, deque, defaultdict, ChainMap
from functools import lru_cache
from math import sqrt, sin, cos, tan, ceil, fabs, floor, gcd, exp, log, log2
from typing import List, Tuple
import numpy as np
from heapq import *
sys.set_int_max_str_digits(0)
"""

# Baseline drivers: run the program bare (its own __main__, no prelude, default int-string
# limit) in a fresh interpreter, and report the program's own CPU time on stderr (the floor).
STDIN_DRIVER = """\
import sys, time
path = sys.argv[1]
src = open(path).read()
t0 = time.process_time()
try:
    exec(compile(src, path, "exec"), {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__})
finally:
    sys.stderr.write("\\n@@CPU@@%r\\n" % (time.process_time() - t0))
"""
# Call-based: runs the program, calls the target, prints its JSON.
CALL_DRIVER = """\
import json, sys, time
spec = json.loads(sys.stdin.read())
ns = {"__name__": "__main__"}
t0 = time.process_time()
try:
    exec(compile(open(spec["code"]).read(), spec["code"], "exec"), ns)
    fn = getattr(ns["Solution"](), spec["fn"]) if "Solution" in ns else ns[spec["fn"]]
    out = fn(*spec["args"])
finally:
    sys.stderr.write("\\n@@CPU@@%r\\n" % (time.process_time() - t0))
sys.stdout.write("\\n@@RESULT@@" + json.dumps(out))
"""

CHILD_ENV = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "HOME", "TMPDIR")}
CHILD_ENV.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


CPU_SPENT: list[float] = []  # the programs' own CPU seconds, per baseline test


def _record_cpu(stderr: bytes) -> None:
    k = stderr.rfind(b"@@CPU@@")
    if k >= 0:
        try:
            CPU_SPENT.append(float(stderr[k + 7 :].split()[0]))
        except (ValueError, IndexError):
            pass


def run_test(problem, code_path: Path, drivers: dict[str, Path], i: int, timeout_s: float) -> tuple[bool, float, str]:
    """One test in a fresh python: (passed, seconds, why)."""
    tests = problem.tests
    t0 = time.perf_counter()
    try:
        if tests.mode == "stdin":
            proc = subprocess.run(
                [sys.executable, str(drivers["stdin"]), str(code_path)],
                input=tests.inputs[i].encode(),
                capture_output=True,
                timeout=timeout_s,
                env=CHILD_ENV,
                cwd=code_path.parent,
            )
        else:
            spec = json.dumps({"code": str(code_path), "fn": tests.fn_name, "args": tests.inputs[i]})
            proc = subprocess.run(
                [sys.executable, str(drivers["call"])],
                input=spec.encode(),
                capture_output=True,
                timeout=timeout_s,
                env=CHILD_ENV,
                cwd=code_path.parent,
            )
    except subprocess.TimeoutExpired:
        CPU_SPENT.append(timeout_s)
        return False, time.perf_counter() - t0, "timeout"
    secs = time.perf_counter() - t0
    _record_cpu(proc.stderr)
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        return False, secs, f"exit {proc.returncode}: {tail[0][:100]}"
    out = proc.stdout.decode(errors="replace")
    if tests.mode == "stdin":
        ok, rule = compare_stdin(out, tests.outputs[i])
    else:
        marker = out.rfind("@@RESULT@@")
        if marker < 0:
            return False, secs, "no result"
        ok, rule = compare_call(json.loads(out[marker + len("@@RESULT@@") :]), tests.outputs[i])
    return ok, secs, rule


def baseline(problems, timeout_s: float, prelude: bool = False) -> dict[str, dict]:
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="judge-speed-") as d:
        dpath = Path(d)
        drivers = {"stdin": dpath / "stdin_driver.py", "call": dpath / "call_driver.py"}
        drivers["stdin"].write_text(STDIN_DRIVER)
        drivers["call"].write_text(CALL_DRIVER)
        for p in problems:
            code = p.solutions[0] if p.solutions else None
            if code is None:
                continue
            code_path = dpath / f"prog_{p.id}.py"
            code_path.write_text((PRELUDE if prelude else "") + code)
            passed, times, why, n_run = True, [], "", 0
            cpu_before = len(CPU_SPENT)
            for i in range(len(p.tests)):
                ok, secs, rule = run_test(p, code_path, drivers, i, timeout_s)
                times.append(secs)
                n_run += 1
                if not ok:
                    passed, why = False, f"test {i}: {rule}"
                    break
            out[p.id] = {
                "passed": passed,
                "why": why,
                "max_seconds": max(times),
                "tests_run": n_run,
                "cpu": sum(CPU_SPENT[cpu_before:]),
            }
    return out


def every_test_cost(rows: Path, args: argparse.Namespace) -> int:
    """Failing programs (each row answered with the next row's first solution), all tests, judged
    stopping at the first failure and running every test, alternating; medians and tests run."""
    lines = [json.loads(x) for x in rows.read_text(encoding="utf-8").splitlines() if x.strip()]
    tmp = tempfile.TemporaryDirectory(prefix="judge-every-test-")
    pred = Path(tmp.name) / "shifted.jsonl"
    with pred.open("w", encoding="utf-8") as f:
        for row, nxt in zip(lines, lines[1:] + lines[:1]):
            sols = json.loads(nxt["solutions"]) if isinstance(nxt.get("solutions"), str) else nxt.get("solutions") or []
            f.write(json.dumps({"id": str(row["problem_id"]), "code": sols[0] if sols else None}) + "\n")
    times: dict[str, list[float]] = {"true": [], "false": []}
    counts: dict[str, tuple[int, int, int]] = {}
    for _ in range(max(1, args.repeat)):
        for stop in ("true", "false"):
            out = Path(tmp.name) / f"verdicts-{stop}.jsonl"
            cmd = [
                sys.executable,
                "-m",
                "apps_bench.judge",
                str(rows),
                "--predictions",
                str(pred),
                "--split",
                "train",
                "--max-tests-per-row",
                "0",
                "--out",
                str(out),
                "--no-progress",
                "--timeout-s",
                str(args.timeout_s),
                "--set",
                f"stop_on_first_failure={stop}",
            ]
            if args.workers is not None:
                cmd += ["--workers", str(args.workers)]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
            times[stop].append(time.perf_counter() - t0)
            if proc.returncode != 0:
                print(proc.stdout, proc.stderr, sep="\n", file=sys.stderr)
                raise SystemExit(f"error: judge command failed with exit {proc.returncode}")
            vs = [json.loads(x) for x in out.read_text().splitlines()]
            counts[stop] = (len(vs), sum(v["passed"] for v in vs), sum(v["tests_run"] for v in vs))
    tmp.cleanup()
    print(f"load average  : {' '.join(f'{x:.2f}' for x in os.getloadavg())} (other work on the machine slows both sides)")
    for stop, name in (("true", "first failure"), ("false", "every test   ")):
        n, passed, run = counts[stop]
        print(
            f"{name}: {statistics.median(times[stop]):7.2f} s  ({n} programs, {passed} pass, {run} tests run; "
            f"median of {', '.join(f'{x:.2f}' for x in times[stop])})"
        )
    ratio = statistics.median(times["false"]) / statistics.median(times["true"])
    print(f"every test costs {ratio:.1f}x the judge time on failing programs (a passing program runs every test either way)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rows", nargs="?", default=str(REPO / "tests/fixtures/apps/train_mini150.jsonl"))
    ap.add_argument("--timeout-s", type=float, default=4.0)
    ap.add_argument("--workers", type=int, default=None, help="passed to the judge command (default: its config)")
    ap.add_argument(
        "--repeat", type=int, default=4, help="judge command runs (half before, half after the baseline); the median counts"
    )
    ap.add_argument(
        "--every-test-cost",
        action="store_true",
        help="time failing programs judged with every test against stopping at the first failure (no baseline)",
    )
    args = ap.parse_args()
    rows = Path(args.rows).resolve()
    if not rows.is_file():
        print(f"error: {rows} not found (give the path to a codeparrot-schema JSONL file)", file=sys.stderr)
        return 2
    if args.every_test_cost:
        return every_test_cost(rows, args)
    apps = OmegaConf.load(REPO / "apps_bench" / "conf" / "dataset" / "apps.yaml")
    dataset = typed(DatasetConfig, OmegaConf.merge(apps, {"source": "file", "path": str(rows), "split": "train"}))
    problems = load_problems(dataset, max_tests_per_row=0).problems
    n_tests = sum(len(p.tests) for p in problems)
    print(
        f"{len(problems)} problems, {n_tests} tests from {rows}; cpus={os.cpu_count()}; "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )

    # (a) the project's judge command, whole command timed; runs before and after the baseline,
    # so a change in the machine's load during the run weighs on both sides alike
    tmp = tempfile.TemporaryDirectory(prefix="judge-speed-")
    verdicts_path = Path(tmp.name) / "verdicts.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "apps_bench.judge",
        str(rows),
        "--gold",
        "--max-tests-per-row",
        "0",
        "--split",
        "train",
        "--out",
        str(verdicts_path),
        "--no-progress",
        "--timeout-s",
        str(args.timeout_s),
    ]
    if args.workers is not None:
        cmd += ["--workers", str(args.workers)]
    judge_runs: list[float] = []

    def judge_once() -> subprocess.CompletedProcess:
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        judge_runs.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            print(proc.stdout, proc.stderr, sep="\n", file=sys.stderr)
            raise SystemExit(f"error: judge command failed with exit {proc.returncode}")
        return proc

    n_before = (max(1, args.repeat) + 1) // 2
    for _ in range(n_before):
        proc = judge_once()
    verdicts = {json.loads(line)["id"]: json.loads(line) for line in verdicts_path.read_text().splitlines()}
    print("command:", " ".join(cmd[1:]).replace(str(REPO) + "/", "").replace(str(Path(tmp.name)), "$TMP"))
    print(proc.stdout.rstrip())

    # (b) baseline: fresh python per test, bare, sequential
    c0 = child_cpu()
    t0 = time.perf_counter()
    base = baseline(problems, args.timeout_s)
    base_s = time.perf_counter() - t0
    base_cpu = child_cpu() - c0
    floor_s = sum(CPU_SPENT)  # measured inside each child around the program itself
    for _ in range(max(1, args.repeat) - n_before):
        judge_once()
    tmp.cleanup()
    judge_s = statistics.median(judge_runs)
    base_tests = sum(b["tests_run"] for b in base.values())

    # agreement
    disagree = [pid for pid, b in base.items() if pid in verdicts and verdicts[pid]["passed"] != b["passed"]]
    explained: dict[str, str] = {}
    if disagree:
        with_prelude = baseline([p for p in problems if p.id in disagree], args.timeout_s, prelude=True)
        for pid in disagree:
            v, b = verdicts[pid], base[pid]
            slow = max([b["max_seconds"]] + [r["seconds"] for r in v["results"]])
            if slow > 0.5 * args.timeout_s or any(r["outcome"] == "timeout" for r in v["results"]) or "timeout" in b["why"]:
                explained[pid] = "timing-marginal"
            elif with_prelude[pid]["passed"] == v["passed"]:
                explained[pid] = "prelude"
            else:
                explained[pid] = "UNEXPLAINED"
    print()
    print(
        f"verdicts: judge passed {sum(v['passed'] for v in verdicts.values())}/{len(verdicts)}, "
        f"baseline passed {sum(b['passed'] for b in base.values())}/{len(base)}; "
        f"{len(disagree)} disagreement(s)"
    )
    for pid in disagree:
        v, b = verdicts[pid], base[pid]
        first_fail = next((r for r in v["results"] if r["outcome"] != "pass"), None)
        jwhy = f"{first_fail['outcome']} at test {first_fail['index']}" if first_fail else "all pass"
        print(
            f"  {pid}: judge={'pass' if v['passed'] else 'fail'} ({jwhy}), "
            f"baseline={'pass' if b['passed'] else 'fail'} ({b['why'] or 'all pass'}) -> {explained[pid]}"
        )
    print()
    print(f"load average  : {' '.join(f'{x:.2f}' for x in os.getloadavg())} (other work on the machine slows both sides)")
    print(
        f"judge command : {judge_s:7.2f} s  (whole command, {len(verdicts)} problems, {n_tests} tests; "
        f"median of {', '.join(f'{x:.2f}' for x in judge_runs)})"
    )
    print(f"baseline      : {base_s:7.2f} s  ({base_tests} fresh python processes, one after another)")
    print(f"ratio         : {base_s / judge_s:7.1f}x  (target >= 22x)")
    print(
        f"compute floor : {floor_s:7.2f} s CPU  (the programs' own CPU time inside the baseline's children; "
        f"the children's rusage incl. interpreter start-up: {base_cpu:.2f} s CPU)"
    )
    print(
        f"                {floor_s / (os.cpu_count() or 1):7.2f} s on {os.cpu_count()} cores; the judge command is "
        f"{judge_s / max(floor_s / (os.cpu_count() or 1), 1e-9):.1f}x that"
    )
    heavy = sorted(base.items(), key=lambda kv: -kv[1]["cpu"])[:3]
    print(
        "                heaviest problems (their tests run one after another in one child): "
        + ", ".join(f"{pid} {b['cpu']:.2f} s" for pid, b in heavy)
    )
    unexplained = [pid for pid, why in explained.items() if why == "UNEXPLAINED"]
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
