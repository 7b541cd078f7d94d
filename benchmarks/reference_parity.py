#!/usr/bin/env python
"""Side by side: the original APPS harness vs judge profile `reference`, same programs, same run.

(a) Each vendored rows file's (tests/fixtures/apps) first reference solutions, as whole commands timed one after the
    other: `ref_judge.py ROWS --gold` (the harness given on the command line: hendrycks/apps'
    harness, unmodified, one program at a time through a multiprocessing Manager, as their
    eval runs it) vs `python -m apps_bench.judge ROWS --gold --profile reference`; agreement
    on the strict verdict and on the whole result list, per program.
(b) The parity corpus (those solutions and the probes of tests/fixtures/reference/, with their
    synthetic rows): ref_judge.py --programs vs the reference Judge in one process. Several
    probes sleep on purpose (the 4 s alarm, the 11 s program limit), so (b) measures agreement;
    its times are mostly those sleeps.

Usage (from the repo root): python benchmarks/reference_parity.py PATH/TO/ref_judge.py [--max-tests 0] [--repeat 3] [--no-corpus]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
_spec = importlib.util.spec_from_file_location("reference_corpus", REPO / "tests" / "fixtures" / "reference" / "record.py")
corpus = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(corpus)  # type: ignore[union-attr]


def timed(cmd: list[str]) -> float:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=REPO)
    return time.perf_counter() - t0


def read(path: Path) -> dict[str, dict]:
    return {str(json.loads(x)["id"]): json.loads(x) for x in path.read_text().splitlines() if x.strip()}


def gold_side_by_side(ref_judge: Path, max_tests: int, repeat: int, tmp: Path) -> list[dict]:
    out = []
    for name, split in corpus.ROW_FILES.items():
        rows = corpus.DATA / name
        ref_out, ours_out = tmp / f"{name}.ref.jsonl", tmp / f"{name}.ours.jsonl"
        t_ref, t_ours = [], []
        for _ in range(repeat):  # alternated, so load changes hit both sides alike
            t_ref.append(
                timed([sys.executable, str(ref_judge), str(rows), "--gold", "--max-tests", str(max_tests), "--out", str(ref_out)])
            )
            t_ours.append(
                timed(
                    [
                        sys.executable,
                        "-m",
                        "apps_bench.judge",
                        str(rows),
                        "--gold",
                        "--profile",
                        "reference",
                        "--split",
                        split,
                        "--max-tests-per-row",
                        str(max_tests),
                        "--out",
                        str(ours_out),
                        "--no-progress",
                    ]
                )
            )
        ref, ours = read(ref_out), read(ours_out)
        with_program = [k for k in ref if k in ours and ours[k]["extracted"]]
        out.append(
            {
                "set": name,
                "programs": len(with_program),
                "verdicts_agree": sum(ref[k]["passed"] == ours[k]["passed"] for k in with_program),
                "lists_agree": sum(ref[k]["results"] == ours[k]["reference_results"] for k in with_program),
                "passed_original": sum(ref[k]["passed"] for k in with_program),
                "passed_reference": sum(ours[k]["passed"] for k in with_program),
                "original_s": statistics.median(t_ref),
                "reference_s": statistics.median(t_ours),
                "disagree": [k for k in with_program if ref[k]["passed"] != ours[k]["passed"]],
            }
        )
    return out


def corpus_side_by_side(ref_judge: Path, max_tests: int, tmp: Path) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    from apps_bench.data.rows import parse_row
    from apps_bench.judge.core import Judge
    from apps_bench.judge.profiles import judge_config
    from apps_bench.sandbox import SandboxPool

    rows = corpus.corpus_rows()
    programs = corpus.corpus_programs(rows)
    rows_file, prog_file, ref_out = tmp / "rows.jsonl", tmp / "programs.jsonl", tmp / "corpus.ref.jsonl"
    rows_file.write_text("".join(json.dumps(r) + "\n" for r in rows.values()))
    prog_file.write_text(
        "".join(json.dumps({"id": p["id"], "problem_id": p["problem"], "code": p["code"]}) + "\n" for p in programs)
    )
    t_ref = timed(
        [
            sys.executable,
            str(ref_judge),
            str(rows_file),
            "--programs",
            str(prog_file),
            "--max-tests",
            str(max_tests),
            "--out",
            str(ref_out),
        ]
    )
    t0 = time.perf_counter()
    with SandboxPool.from_config(judge_config("seed"), workers=0) as pool:
        judge = Judge.from_config(pool, judge_config("reference"))
        problems = {k: parse_row(r, split=r["split"], max_tests_per_row=max_tests) for k, r in rows.items()}
        with ThreadPoolExecutor(max_workers=pool.workers) as ex:
            futs = {p["id"]: ex.submit(judge.score, problems[p["problem"]], p["code"]) for p in programs}
            ours = {k: f.result() for k, f in futs.items()}
    t_ours = time.perf_counter() - t0
    ref = read(ref_out)
    return {
        "set": "parity corpus (gold + probes)",
        "programs": len(programs),
        "verdicts_agree": sum(ref[k]["passed"] == v.passed for k, v in ours.items()),
        "lists_agree": sum(ref[k]["results"] == list(v.reference_results) for k, v in ours.items()),
        "passed_original": sum(ref[k]["passed"] for k in ours),
        "passed_reference": sum(v.passed for v in ours.values()),
        "original_s": t_ref,
        "reference_s": t_ours,
        "disagree": [k for k, v in ours.items() if ref[k]["passed"] != v.passed],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("harness", type=Path, help="the original harness's ref_judge.py (hendrycks/apps, unmodified)")
    p.add_argument("--max-tests", type=int, default=0, help="first N tests per problem; <= 0 all (default)")
    p.add_argument("--repeat", type=int, default=3, help="runs of (a) per side; the median counts")
    p.add_argument("--no-corpus", action="store_true", help="skip (b)")
    args = p.parse_args()
    from rich.console import Console
    from rich.table import Table

    with tempfile.TemporaryDirectory() as tmp:
        results = gold_side_by_side(args.harness.resolve(), args.max_tests, args.repeat, Path(tmp))
        total = {
            k: sum(r[k] for r in results)
            for k in (
                "programs",
                "verdicts_agree",
                "lists_agree",
                "passed_original",
                "passed_reference",
                "original_s",
                "reference_s",
            )
        }
        results.append({"set": "all reference solutions", **total, "disagree": sum((r["disagree"] for r in results), [])})
        if not args.no_corpus:
            results.append(corpus_side_by_side(args.harness.resolve(), args.max_tests, Path(tmp)))
    t = Table(
        title=f"original APPS harness vs judge profile reference (max_tests={args.max_tests}; whole commands, median of {args.repeat})"
    )
    for col in (
        "set",
        "programs",
        "verdicts agree",
        "result lists agree",
        "passed (orig / ref)",
        "original s",
        "reference s",
        "speed-up",
    ):
        t.add_column(col, justify="left" if col == "set" else "right")
    for r in results:
        t.add_row(
            r["set"],
            str(r["programs"]),
            f"{r['verdicts_agree']} ({100 * r['verdicts_agree'] / max(1, r['programs']):.1f}%)",
            str(r["lists_agree"]),
            f"{r['passed_original']} / {r['passed_reference']}",
            f"{r['original_s']:.2f}",
            f"{r['reference_s']:.2f}",
            f"{r['original_s'] / max(1e-9, r['reference_s']):.1f}x",
        )
    Console(width=160).print(t)
    for r in results:
        if r["disagree"]:
            print(f"{r['set']}: verdicts differ on {', '.join(r['disagree'])}")
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
