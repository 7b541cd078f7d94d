"""`python -m apps_bench.rescore CELL_DIR|RUN_ID [judge=PROFILE] [judge.KEY=VALUE] [max_tests_per_row=N]`

Re-judge the programs a cell recorded under another judge profile or test cap, without
regenerating anything: no model endpoint is opened and no agent code is imported; only the
dataset (for the tests) and the sandbox are used. The new verdicts go next to the old ones,
in `<cell>/rescore/<profile>-max<cap>-<key>/` (records.jsonl, summary.json, config.yaml,
cell.json), never over them; `<key>` is the key the cell would have with the new judge
settings. A rerun resumes (programs already re-judged are kept). The result is logged to
MLflow as a child run of the cell's run (see docs/report.md "Re-scoring").

An interrupted cell is re-scored on what it recorded; a problem whose record is an error
(no answer: the model or the sandbox failed) stays an error, left out of pass@1.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence

from apps_bench.cell.key import cell_key, identity_of
from apps_bench.config.schema import DatasetConfig, JudgeConfig, read_option, typed
from apps_bench.data import LoadResult, load_problems
from apps_bench.errors import AppsBenchError
from apps_bench.judge import Judge
from apps_bench.judge.core import judge_program
from apps_bench.judge.profiles import JudgeConfigError, judge_config, with_rules
from apps_bench.sandbox import SandboxPool
from apps_bench.tracking import faults, provenance
from apps_bench.tracking import mlflow as mlf
from apps_bench.tracking.records import CELL, CONFIG, RECORDS, SUMMARY, RecordStore, RecordsUnreadable, record_key
from apps_bench.tracking.summary import metrics_of, summarize_cell, table_rows
from apps_bench.types import JsonObject, Problem, ProblemRecord, Rejudged, RescoreOf, Verdict

RESCORE_DIR = "rescore"
RUN_ID = re.compile(r"[0-9a-f]{32}\Z")
# What a re-scoring may change: the judge and the test cap. Everything else is how answers were made.
TOP_LEVEL = frozenset({"max_tests_per_row"})
RUN_ONLY = frozenset({"tracking.experiment", "progress"})


class RescoreError(AppsBenchError):
    """Bad input: printed as one clear line, exit status 2."""


# ----------------------------------------------------------------------------- the source


def check_cell_dir(path: Path) -> JsonObject:
    """The cell.json of a cell folder; RescoreError saying what is missing otherwise."""
    if not path.is_dir():
        raise RescoreError(f"{path} is not a folder")
    missing = [f for f in (CELL, CONFIG) if not (path / f).is_file()]
    if missing:
        raise RescoreError(
            f"{path} is not a cell folder: it has no {' or '.join(missing)}. A cell folder is what "
            "`python -m apps_bench` writes (outputs/cells/<dataset>-<topology>-<model>-<optimizer>-s<seed>-<key>/); "
            "pass one of those, or the MLflow run id of a cell."
        )
    try:
        info = json.loads((path / CELL).read_text(encoding="utf-8"))
    except ValueError as e:
        raise RescoreError(f"{path / CELL} is not valid JSON ({e}): not a cell folder apps-bench wrote") from None
    if not isinstance(info, dict) or not info.get("key"):
        raise RescoreError(f"{path / CELL} has no cell key: not a cell folder apps-bench wrote")
    if info.get("rescore_of"):
        raise RescoreError(
            f"{path} holds re-scored verdicts, not a cell; re-score the cell it came from: {info.get('source_dir')}"
        )
    return info


@dataclass(frozen=True)
class CellRunRef:
    """The MLflow run a re-scoring was given: the new run is its child, in its experiment."""

    run_id: str
    experiment: str


def cell_dir_of_run(run_id: str, cwd: Path) -> tuple[Path, CellRunRef]:
    """The local folder of the cell whose MLflow run is `run_id` (found by its cell key), and the run."""
    c = mlf.client(mlf.tracking_uri())
    try:
        run = c.get_run(run_id)
    except Exception as e:  # noqa: BLE001 - mlflow raises its own exception types
        raise RescoreError(
            f"no MLflow run {run_id} in {mlf.tracking_uri()} ({type(e).__name__}); "
            "set MLFLOW_TRACKING_URI to the store the cell logged to"
        ) from None
    tags = run.data.tags
    key = tags.get("cell_key") or tags.get("final_eval_of")
    if not key or tags.get("run_kind") == "rescore":
        raise RescoreError(f"MLflow run {run_id} is not a cell's run (no cell_key tag)")
    found = sorted((cwd / "outputs" / "cells").glob(f"*-{key}"))
    if not found:
        raise RescoreError(
            f"run {run_id} is cell {key}, but its folder is not under {cwd / 'outputs' / 'cells'}: "
            "re-scoring needs the recorded programs; run it where the cell ran, or pass the cell folder"
        )
    return found[0], CellRunRef(run_id, str(c.get_experiment(run.info.experiment_id).name))


def resolve_source(source: str, cwd: Path | None = None) -> tuple[Path, CellRunRef | None]:
    """The cell folder to re-score, and the cell's run when the source is a run id (else None: the run is
    the cell's in its config's experiment)."""
    cwd = cwd or Path.cwd()
    p = Path(source).expanduser()
    if p.exists():
        return p.resolve(), None
    if RUN_ID.match(source):
        return cell_dir_of_run(source, cwd)
    raise RescoreError(f"{source!r} is neither a folder nor an MLflow run id (32 hex characters)")


# ----------------------------------------------------------------------------- settings


def parse_overrides(items: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise RescoreError(f"bad override {item!r}: use key=value (judge=reference, max_tests_per_row=0, judge.timeout_s=4)")
        if not (key == "judge" or key.startswith("judge.") or key in TOP_LEVEL or key in RUN_ONLY):
            raise RescoreError(
                f"{key} cannot be re-scored: it changes how the answers were produced, not how they are judged. "
                "Re-scoring takes judge=PROFILE, judge.KEY=VALUE and max_tests_per_row=N; run a new cell for anything else."
            )
        out[key] = value
    return out


def rescored_config(data: JsonObject, overrides: Mapping[str, str]) -> JsonObject:
    """The cell's resolved config with the judge and test cap replaced (validated by the schema).

    `judge=PROFILE` starts from conf/judge/PROFILE.yaml, else from the cell's own judge settings;
    `judge.KEY=VALUE` (dotted keys too: judge.sandbox.output_cap_bytes=...) is applied on top."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    new = copy.deepcopy(dict(data))
    if "judge" in overrides:
        try:
            new["judge"] = asdict(judge_config(overrides["judge"]))
        except JudgeConfigError as e:
            raise RescoreError(str(e)) from None
    try:
        judge = OmegaConf.create(with_rules(new.get("judge") or {}))
    except JudgeConfigError as e:
        raise RescoreError(str(e)) from None
    try:
        for key, value in overrides.items():
            if key.startswith("judge."):
                OmegaConf.update(judge, key.split(".", 1)[1], yaml.safe_load(value), merge=True)
        checked = OmegaConf.merge(OmegaConf.structured(JudgeConfig), judge)
    except OmegaConfBaseException as e:
        raise RescoreError(f"bad judge setting: {e}".splitlines()[0]) from None
    missing = sorted(OmegaConf.missing_keys(checked))
    if missing:
        raise RescoreError(
            f"the cell's judge settings lack {', '.join('judge.' + m for m in missing)} (recorded before they were "
            f"settings); pass judge={checked.profile} to re-score with conf/judge/{checked.profile}.yaml's values"
        )
    new["judge"] = OmegaConf.to_container(checked, resolve=True)
    if "max_tests_per_row" in overrides:
        try:
            new["max_tests_per_row"] = int(overrides["max_tests_per_row"])
        except ValueError:
            raise RescoreError(
                f"max_tests_per_row must be an integer (<= 0 keeps all tests), got {overrides['max_tests_per_row']!r}"
            ) from None
    if "tracking.experiment" in overrides:
        new.setdefault("tracking", {})["experiment"] = overrides["tracking.experiment"]
    if "progress" in overrides:
        new["progress"] = bool(yaml.safe_load(overrides["progress"]))
    return new


# ----------------------------------------------------------------------------- judging


def cell_records(cell_dir: Path) -> list[ProblemRecord]:
    """The cell's records, each read as the type it was written as (a line this version cannot read: RescoreError)."""
    try:
        return RecordStore(cell_dir).records()
    except RecordsUnreadable as e:
        raise RescoreError(str(e)) from None


def _rescored_record(
    old: ProblemRecord, verdict: Verdict, judge_s: float, new_key: str, old_key: str, old_cap: int | None
) -> ProblemRecord:
    return replace(
        old,
        cell=new_key,
        passed=bool(verdict.passed),
        verdict=verdict,
        judge_s=round(judge_s, 4),
        latency_s=round(old.solve_s + judge_s, 4),
        rescore_of=Rejudged(
            cell=old_key,
            passed=old.passed,
            profile=old.verdict.profile if old.verdict else None,
            max_tests_per_row=old_cap,
            judge_s=old.judge_s,
        ),
        completed_at=time.time(),
    )


def _error_record(old: ProblemRecord, error: str, new_key: str, old_key: str) -> ProblemRecord:
    return replace(old, cell=new_key, passed=False, error=error, rescore_of=RescoreOf(cell=old_key, passed=old.passed))


def judge_records(
    store: RecordStore,
    todo: list[ProblemRecord],
    problems: Mapping[str, Problem],
    judge: Judge,
    *,
    workers: int,
    new_key: str,
    old_key: str,
    old_cap: int | None,
    progress: bool,
) -> None:
    """Judge every record of `todo` on its problem and append the new records to `store`."""

    def one(rec: ProblemRecord) -> ProblemRecord:
        problem = problems.get(rec.key)
        if problem is None:
            return _error_record(rec, f"problem {rec.key} is not in the dataset any more", new_key, old_key)
        t0 = time.perf_counter()
        verdict, error = judge_program(judge, problem, rec.program)
        if error is not None:
            return _error_record(rec, f"{error} (while re-scoring)", new_key, old_key)
        assert verdict is not None  # judge_program: a verdict whenever there is no error
        return _rescored_record(rec, verdict, time.perf_counter() - t0, new_key, old_key, old_cap)

    from tqdm import tqdm

    bar = tqdm(total=len(todo), unit="program", desc="re-scoring", file=sys.stderr, disable=not progress)
    try:
        with ThreadPoolExecutor(max_workers=workers) as ex:
            for fut in as_completed([ex.submit(one, r) for r in todo]):
                store.append(fut.result())
                bar.update(1)
    finally:
        bar.close()


# ----------------------------------------------------------------------------- MLflow


def source_run_id(experiment: str, cell_key: str) -> str | None:
    """The cell's own run (found by its cell_key tag; re-scoring runs excluded)."""
    c = mlf.client(mlf.tracking_uri())
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return None
    for run in c.search_runs(
        [exp.experiment_id], filter_string=f"tags.cell_key = '{cell_key}'", order_by=["attributes.start_time DESC"]
    ):
        if run.data.tags.get("run_kind") != "rescore":
            return str(run.info.run_id)
    return None


def log_rescore(
    data: JsonObject,
    cell_info: JsonObject,
    new_identity: JsonObject,
    new_key: str,
    out_dir: Path,
    summary: JsonObject,
    records: list[ProblemRecord],
    given: CellRunRef | None = None,
) -> tuple[str, str | None]:
    """A child run of the cell's run that reads like a cell run: (run id, parent run id). The cell's run is
    the one the command was given (its experiment, whatever the cell folder's config last said), else the
    cell's run in the experiment of its config (or `tracking.experiment=`)."""
    parent: str | None
    if given is not None:
        experiment, parent = given.experiment, given.run_id
    else:
        experiment = str((data.get("tracking") or {}).get("experiment") or "apps")
        parent = source_run_id(experiment, str(cell_info["key"]))
    axes = dict(cell_info.get("axes") or {})
    judge = data["judge"]
    rescore_key = f"{cell_info['key']}->{new_key}"
    tags = {
        **{k: str(v) for k, v in axes.items()},
        "cell_key": new_key,
        "cell_name": str(cell_info.get("name", "")),
        "judge_profile": str(judge["profile"]),
        "max_tests_per_row": str(data["max_tests_per_row"]),
        "run_kind": "rescore",
        "rescore_of": parent or "",
        "rescore_of_cell": str(cell_info["key"]),
        "rescore_key": rescore_key,
        "package_version": provenance.package_version(),
        **provenance.git_info(),
        **provenance.as_tags(summary["provenance"]),
    }
    run = mlf.CellRun.open(
        experiment=experiment,
        cell_key=rescore_key,
        key_tag="rescore_key",
        run_name=f"{cell_info.get('name', new_key)}·rescore·{judge['profile']}·max{data['max_tests_per_row']}",
        params=dict(new_identity),
        tags=tags,
        parent_run_id=parent,
    )
    run.finish(
        metrics=metrics_of(summary),
        rows=table_rows(records),
        files=[out_dir / RECORDS, out_dir / SUMMARY, out_dir / CONFIG],
        complete=bool(summary["complete"]),
    )
    return run.run_id, parent


# ----------------------------------------------------------------------------- the command


def rescore(source: str, overrides: Sequence[str], *, track: bool = True, cwd: Path | None = None) -> JsonObject:
    """Re-judge a cell's recorded programs; returns the new summary (with where it went)."""
    import yaml

    if track or RUN_ID.match(source):  # before anything is read or written: a server that does not answer costs seconds
        mlf.check_store(mlf.tracking_uri(), read_option("tracking", "mlflow").store)  # the store it logs to: MLflow's
    cell_dir, given = resolve_source(source, cwd)
    info = check_cell_dir(cell_dir)
    sets = parse_overrides(overrides)
    if given is not None and sets.get("tracking.experiment", given.experiment) != given.experiment:
        raise RescoreError(
            f"tracking.experiment={sets['tracking.experiment']}: a re-scoring is logged next to the run it "
            f"was given, {given.run_id} in experiment {given.experiment!r}; drop tracking.experiment, or "
            "pass the cell folder to log it under the cell's run in another experiment"
        )
    data = yaml.safe_load((cell_dir / CONFIG).read_text(encoding="utf-8"))
    new = rescored_config(data, sets)
    new_identity = identity_of(new)
    new_key = cell_key(new_identity)
    old_key = str(info["key"])
    if new_key == old_key:
        raise RescoreError(
            f"judge settings and test cap are the cell's own (judge={data['judge']['profile']}, "
            f"max_tests_per_row={data['max_tests_per_row']}): nothing to re-score; pass e.g. judge=reference or max_tests_per_row=0"
        )
    records = cell_records(cell_dir)  # read only: the cell's records are never rewritten
    if not records:  # before anything is written: a re-scoring of nothing is not a pass@1 of 0
        raise RescoreError(
            f"{cell_dir} has no recorded problems ({RECORDS} is missing or empty: the cell was refused or "
            "stopped before its first problem); nothing to re-score. Run the cell first (the same "
            "`python -m apps_bench ...` command), then re-score it."
        )
    profile, cap = str(new["judge"]["profile"]), int(new["max_tests_per_row"])
    out_dir = cell_dir / RESCORE_DIR / f"{profile}-max{cap}-{new_key}"
    store = RecordStore(out_dir)
    store.claim(
        new_key,
        {
            "name": info.get("name"),
            "axes": info.get("axes"),
            "identity": new_identity,
            "rescore_of": old_key,
            "source_dir": str(cell_dir),
        },
    )
    store.write_config(yaml.safe_dump(new, sort_keys=False, allow_unicode=True))
    done = store.resume().done
    todo = [r for r in records if r.key not in done]
    answered = [r for r in todo if not r.error]
    print(
        f"apps-bench rescore: cell {info.get('name')} [{old_key}] -> judge={profile} max_tests_per_row={cap} [{new_key}]: "
        f"{len(records)} recorded, {len(done)} already re-scored, {len(answered)} to judge, "
        f"{len(todo) - len(answered)} recorded errors kept as errors",
        file=sys.stderr,
    )
    for r in todo:
        if r.error:
            store.append(_error_record(r, r.error, new_key, old_key))

    loaded = _cell_selection(new, cap)
    problems = {record_key(p.split, p.id): p for p in loaded.problems}
    sandbox_features = _judge_answered(
        store, answered, problems, new, old_cap=data.get("max_tests_per_row"), new_key=new_key, old_key=old_key
    )
    store.close()
    order = {k: i for i, k in enumerate(problems)}
    recorded = {x.key for x in records}
    new_records = sorted((r for r in store.records() if r.key in recorded), key=lambda r: order.get(r.key, len(order)))
    summary = summarize_cell(
        new_records,
        n_selected=len(problems),
        skipped=loaded.skipped,
        profile=profile,
        stopped_early=bool(new["judge"]["stop_on_first_failure"]),
    )
    summary["cell"] = {"key": new_key, "name": info.get("name"), **(info.get("axes") or {})}
    summary["rescore_of"] = _rescore_of(records, loaded, len(problems), data, old_key, cell_dir)
    summary["dir"] = str(out_dir)

    summary["provenance"] = provenance.collect("", sandbox_features)  # what the new verdicts ran on
    if track:
        run_id, parent = log_rescore(new, info, new_identity, new_key, out_dir, summary, new_records, given)
        summary["mlflow"] = {"run_id": run_id, "parent_run_id": parent}
    store.write_summary(summary)
    _print(summary, data, profile, cap)
    return summary


def _cell_selection(new: JsonObject, cap: int) -> LoadResult:
    """The cell's own selection, with the new test cap: what a complete cell holds."""
    try:
        return load_problems(
            typed(DatasetConfig, new["dataset"]),
            limit=new.get("limit"),
            offset=int(new.get("offset") or 0),
            only=tuple(str(x) for x in (new.get("only") or ())),
            difficulty=new.get("difficulty"),
            max_tests_per_row=cap,
        )
    except (ValueError, OSError) as e:
        raise RescoreError(f"cannot load the cell's dataset {new['dataset'].get('name', '')}: {e}") from None


def _judge_answered(
    store: RecordStore,
    answered: list[ProblemRecord],
    problems: Mapping[str, Problem],
    new: JsonObject,
    *,
    old_cap: int | None,
    new_key: str,
    old_key: str,
) -> JsonObject | None:
    """Judge the answered records left under the new judge settings; -> the sandbox's features (provenance).
    A rerun with nothing left to judge starts no sandbox: the earlier run's features."""
    out_dir = store.dir
    sandbox_features = None
    if (out_dir / SUMMARY).is_file():
        prev = json.loads((out_dir / SUMMARY).read_text(encoding="utf-8"))
        sandbox_features = (prev.get("provenance") or {}).get("sandbox")
    if answered:
        judge_cfg = typed(JudgeConfig, new["judge"])
        with SandboxPool.from_config(judge_cfg) as pool:
            judge = Judge.from_config(pool, judge_cfg)
            judge_records(
                store,
                answered,
                problems,
                judge,
                workers=pool.workers,
                new_key=new_key,
                old_key=old_key,
                old_cap=old_cap,
                progress=bool(new.get("progress", True)),
            )
            sandbox_features = pool.features
    return sandbox_features


def _rescore_of(
    records: list[ProblemRecord], loaded: LoadResult, n_selected: int, data: JsonObject, old_key: str, cell_dir: Path
) -> JsonObject:
    """What was re-scored: the cell, its judge settings and figures, and the same records' figures under the
    cell's own verdicts, counted as the new ones are."""
    old_summary = json.loads((cell_dir / SUMMARY).read_text(encoding="utf-8")) if (cell_dir / SUMMARY).is_file() else {}
    old_counts = summarize_cell(
        records,
        n_selected=n_selected,
        skipped=loaded.skipped,
        profile=str(data["judge"]["profile"]),
        stopped_early=bool(data["judge"].get("stop_on_first_failure", True)),
    )
    return {
        "cell": old_key,
        "dir": str(cell_dir),
        "profile": data["judge"]["profile"],
        "max_tests_per_row": data.get("max_tests_per_row"),
        "pass_at_1": old_summary.get("pass_at_1"),
        "complete": old_summary.get("complete"),
        "n_problems": old_counts["n_problems"],
        "n_passed": old_counts["n_passed"],
        "pass_at_1_recorded": old_counts["pass_at_1"],
    }


def _print(summary: JsonObject, data: JsonObject, profile: str, cap: int) -> None:
    """The cell's verdicts and the new ones, one row each, over the same recorded programs."""
    from rich.console import Console
    from rich.table import Table

    old = summary["rescore_of"]
    print(f"re-scored {summary['cell'].get('name')}: cell {old['cell']} -> {summary['cell']['key']}")
    t = Table()
    for col in ("verdicts", "judge", "max_tests_per_row", "problems", "passed", "pass@1"):
        t.add_column(col, justify="left" if col in ("verdicts", "judge") else "right")
    t.add_row(
        "the cell's",
        str(old["profile"]),
        str(old["max_tests_per_row"]),
        str(old["n_problems"]),
        str(old["n_passed"]),
        f"{old['pass_at_1_recorded']:.4f}",
    )
    t.add_row("re-scored", profile, str(cap), str(summary["n_problems"]), str(summary["n_passed"]), f"{summary['pass_at_1']:.4f}")
    Console(file=sys.stdout, width=max(100, Console().width)).print(t)
    print(
        f"errors (not scored): {summary['n_errors']}; not recorded by the cell: {summary['n_missing']}"
        + ("" if summary["complete"] else "  (INCOMPLETE: the cell did not record every problem)")
    )
    mlflow = summary.get("mlflow")
    print(
        f"outputs: {summary['dir']}"
        + (f"   MLflow run: {mlflow['run_id']} (child of {mlflow['parent_run_id']})" if mlflow else "")
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m apps_bench.rescore", description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="a cell folder (outputs/cells/<cell>/) or the MLflow run id of a cell")
    p.add_argument("overrides", nargs="*", help="judge=PROFILE, judge.KEY=VALUE, max_tests_per_row=N (<= 0: all tests)")
    p.add_argument("--no-mlflow", action="store_true", help="write the files only, log nothing")
    p.add_argument("--debug", action="store_true", help="a failure of the store, the disk or an interrupt: its traceback too")
    args = p.parse_args(argv)
    safe = "The cell's own records are never changed, and every verdict re-judged so far is kept: the rerun judges only the rest."
    try:
        with faults.answered("apps-bench rescore", safe, uri=mlf.tracking_uri(), debug=args.debug):
            summary = rescore(args.source, args.overrides, track=not args.no_mlflow)
    except AppsBenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0 if summary["complete"] else 3


if __name__ == "__main__":
    sys.exit(main())
