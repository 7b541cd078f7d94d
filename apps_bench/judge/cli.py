"""`python -m apps_bench.judge`: score predictions (or the reference solutions) without running agents.

Defaults come from conf/: the judge from conf/judge/<profile>.yaml (`judge.profiles.judge_config`),
the dataset from conf/dataset/apps.yaml and max_tests_per_row from conf/config.yaml, each read from
its file as a composed cell holds it (`config.read_option`, `config.read_setting`), with no cell
composed: the command never imports Hydra. Nothing is defaulted in code.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Sequence

from apps_bench.config.schema import read_option, read_setting
from apps_bench.data import load_problems
from apps_bench.errors import AppsBenchError
from apps_bench.judge.core import Judge
from apps_bench.judge.pass_at_1 import summarize
from apps_bench.judge.profiles import JudgeConfigError, judge_config
from apps_bench.sandbox import SandboxPool
from apps_bench.task import extract_program
from apps_bench.tracking.provenance import sandbox_summary
from apps_bench.types import JsonObject, Problem, Verdict

if TYPE_CHECKING:  # pragma: no cover
    from apps_bench.config.schema import DatasetConfig, JudgeConfig


class UsageError(AppsBenchError):
    """Bad input from the user: printed as one clear line, exit status 2."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m apps_bench.judge",
        description="Judge APPS predictions (or the reference solutions with --gold) on the sandbox.",
    )
    p.add_argument(
        "rows", nargs="?", help="codeparrot-schema .jsonl/.parquet file (default: the hub split of conf/dataset/apps.yaml)"
    )
    p.add_argument(
        "--predictions",
        help='JSONL lines {"id": "<problem_id>", "code": "<program>"} ("code": null = no program; '
        'or "reply": a raw model reply, extracted with the APPS rule)',
    )
    p.add_argument("--gold", action="store_true", help="judge each problem's first reference solution (harness self-check)")
    p.add_argument("--out", help="write one verdict per problem here (JSONL, in problem order)")
    p.add_argument("--summary", help="write the summary here (JSON: pass@1 by tier, the judge settings, the sandbox's features)")
    p.add_argument(
        "--max-tests-per-row",
        type=int,
        default=None,
        help="keep the first N tests per problem; <= 0 keeps all (default: conf/config.yaml)",
    )
    p.add_argument("--only", action="append", default=[], help="problem IDs, comma-separated; repeatable")
    p.add_argument("--limit", type=int, default=None, help="first N problems (after --offset)")
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--difficulty", choices=("introductory", "interview", "competition"))
    p.add_argument("--split", default=None, help="split name recorded for a ROWS file (default: the dataset config's)")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="sandbox workers; 0 = one per CPU this process may use (default: conf/judge/<profile>.yaml)",
    )
    p.add_argument("--profile", default="seed", help="judge profile: conf/judge/<profile>.yaml (default: seed)")
    p.add_argument("--timeout-s", type=float, default=None, help="per-test limit (default: the profile's)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="overrides",
        help="a setting of the judge profile, e.g. --set sandbox.output_cap_bytes=1000000; repeatable",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p.parse_args(argv)


def read_predictions(path: str) -> dict[str, str | None]:
    preds: dict[str, str | None] = {}
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"predictions file {p} not found")
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as e:
                raise UsageError(f'{p}:{n}: not JSON ({e}); expected {{"id": ..., "code": ...}}') from None
            if not isinstance(rec, dict) or "id" not in rec or ("code" not in rec and "reply" not in rec):
                raise UsageError(f'{p}:{n}: each line needs "id" and "code" keys (or "reply": raw model text to extract from)')
            if "code" in rec:
                code = rec["code"]
            else:
                if rec["reply"] is not None and not isinstance(rec["reply"], str):
                    raise UsageError(f'{p}:{n}: "reply" must be a string or null')
                code = extract_program(rec["reply"])
            if code is not None and not isinstance(code, str):
                raise UsageError(f'{p}:{n}: "code" must be a string or null')
            preds[str(rec["id"])] = code
    return preds


def _split_only(values: list[str]) -> list[str]:
    return [v.strip() for item in values for v in str(item).split(",") if v.strip()]


class _Progress(Protocol):
    """What the judging loop asks of its progress bar (tqdm's, or none)."""

    def update(self, n: int = 1) -> object: ...

    def close(self) -> object: ...


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


class _OrderedWriter:
    """Writes verdict i once 0..i-1 are written: a file in problem order, flushed as the run goes."""

    def __init__(self, path: str | None) -> None:
        self.f = open(path, "w", encoding="utf-8") if path else None
        self.pending: dict[int, JsonObject] = {}
        self.next = 0
        self.lock = threading.Lock()

    def put(self, i: int, rec: JsonObject) -> None:
        with self.lock:
            self.pending[i] = rec
            while self.next in self.pending:
                r = self.pending.pop(self.next)
                if self.f:
                    self.f.write(json.dumps(r) + "\n")
                    self.f.flush()
                self.next += 1

    def close(self) -> None:
        if self.f:
            self.f.close()


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    if not args.gold and not args.predictions:
        raise UsageError("give --predictions PRED.jsonl, or --gold to judge the reference solutions")
    if args.gold and args.predictions:
        raise UsageError("--gold and --predictions are exclusive")
    return _run(args, t0)


def _run(args: argparse.Namespace, t0: float) -> int:
    overrides = list(args.overrides)
    if args.timeout_s is not None:
        if args.timeout_s <= 0:
            raise UsageError(f"--timeout-s must be > 0, got {args.timeout_s}")
        overrides.append(f"timeout_s={args.timeout_s}")
    if args.workers is not None:
        if args.workers < 0:
            raise UsageError(f"--workers must be >= 0 (0 = one per usable CPU), got {args.workers}")
        overrides.append(f"workers={args.workers}")
    try:
        jcfg = judge_config(args.profile, overrides)
    except JudgeConfigError as e:
        raise UsageError(str(e)) from None
    ds = read_option("dataset", "apps")
    max_tests = args.max_tests_per_row if args.max_tests_per_row is not None else read_setting("max_tests_per_row")
    try:
        pool = SandboxPool.from_config(jcfg)  # workers warm up while the data loads
    except ValueError as e:
        raise UsageError(str(e)) from None
    with pool:
        preds = read_predictions(args.predictions) if args.predictions else {}
        if args.rows:
            ds.path = args.rows
        if args.split:
            ds.split = args.split
        only = _split_only(args.only)
        return _judge_all(args, pool, jcfg, ds, t0, max_tests=max_tests, only=only, preds=preds)


def _judge_all(
    args: argparse.Namespace,
    pool: SandboxPool,
    jcfg: JudgeConfig,
    ds: DatasetConfig,
    t0: float,
    *,
    max_tests: int,
    only: list[str],
    preds: dict[str, str | None],
) -> int:
    if preds and not only and args.limit is None:
        only = list(preds)  # judge what was predicted
    try:
        loaded = load_problems(
            ds, limit=args.limit, offset=args.offset, only=only, difficulty=args.difficulty, max_tests_per_row=max_tests
        )
    except (OSError, ValueError) as e:  # missing file, bad schema, hub unreachable (DatasetUnavailableError)
        raise UsageError(str(e)) from None
    problems = loaded.problems
    err = sys.stderr
    print(
        f"{len(problems)} problems from {loaded.source} (revision {loaded.revision}); "
        f"max_tests_per_row={max_tests}; skipped rows: {loaded.skipped or 0}",
        file=err,
    )
    if loaded.missing_ids:
        print(f"warning: {len(loaded.missing_ids)} requested id(s) in no row: {', '.join(loaded.missing_ids[:20])}", file=err)
    if preds:
        unknown = set(preds) - {p.id for p in problems}
        if unknown:
            print(f"warning: {len(unknown)} prediction id(s) match no loaded problem", file=err)

    def program_for(p: Problem) -> str | None:
        if args.gold:
            return p.solutions[0] if p.solutions else None
        return preds.get(p.id)

    # One thread per sandbox worker: a thread never waits for a worker, so problems start in order.
    n_threads = pool.workers
    writer = _OrderedWriter(args.out)
    pairs: dict[int, tuple[Problem, Verdict]] = {}  # by the problem's place in the selection
    judge = Judge.from_config(pool, jcfg)
    bar: _Progress
    if args.no_progress:  # no bar to draw: skip importing tqdm (~50 ms of start-up)
        bar = _NoBar()
    else:
        from tqdm import tqdm

        bar = tqdm(total=len(problems), unit="problem", file=err, desc="judging")
    try:
        with ThreadPoolExecutor(max_workers=n_threads) as ex:
            futs = {ex.submit(judge.score, p, program_for(p)): i for i, p in enumerate(problems)}
            left = len(futs)
            warmed = False
            for fut in as_completed(futs):  # not wait(FIRST_COMPLETED) in a loop: O(n) waiters each time
                left -= 1
                if not warmed and left < n_threads:
                    # The last problems run and a core goes idle: import the summary's
                    # table library now rather than after the last verdict (~50 ms).
                    warmed = True
                    threading.Thread(target=_import_rich, daemon=True).start()
                i = futs[fut]
                v = fut.result()
                p = problems[i]
                pairs[i] = (p, v)
                writer.put(i, {**v.to_json(), "difficulty": p.difficulty, "split": p.split})
                bar.update(1)
    finally:
        bar.close()
        writer.close()
    seconds = time.perf_counter() - t0
    summary = summarize(
        [pairs[i] for i in sorted(pairs)], skipped=loaded.skipped, profile=judge.profile, seconds=seconds, sandbox=pool.features
    )
    summary.print()

    print(f"sandbox: {sandbox_summary(summary.sandbox)}; workers: {pool.workers}")
    if args.summary:
        from dataclasses import asdict

        data = {**summary.to_dict(), "judge": asdict(jcfg), "max_tests_per_row": max_tests}
        Path(args.summary).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    if summary.n_sandbox_errors:
        print(f"warning: {summary.n_sandbox_errors} problem(s) hit sandbox errors (infrastructure, not scored)", file=err)
    print(f"seconds: {seconds:.2f}")
    return 0


def _import_rich() -> None:
    try:
        import rich.console  # noqa: F401
        import rich.table  # noqa: F401
    except Exception:  # noqa: BLE001 - only a warm-up; the summary reports any real problem
        pass


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except AppsBenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
