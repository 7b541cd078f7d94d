"""Cells with their per-problem records, read from MLflow or from local cell folders.

Everything the report computes (intervals, paired tests, cost, the tidy export) needs
each problem's outcome, not a cell's mean: the records (`records.jsonl`, logged as an
artifact of every cell run; the `problems.json` table when a run has no records file), read
one record at a time, of which a problem's row keeps its outcome and counts; per-role cost
comes from each cell's counts (tracking/cell_counts.py), never from transcripts held in
memory. A cell's *comparability class* is what must be equal
for two cells to be compared problem by problem: dataset and problem selection, test cap,
judge profile and the version of its rules (`judge.rules`: a profile whose verdicts changed
is a new version, never compared with the old one). A re-scoring run (`run_kind=rescore`)
is a cell like any other, under its own judge profile and cap.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Hashable, Mapping, Sequence, TypedDict

from apps_bench.errors import AppsBenchError
from apps_bench.judge.pass_at_1 import counted_tests
from apps_bench.tracking import membership, provenance
from apps_bench.tracking import mlflow as mlf
from apps_bench.tracking.cell_counts import COUNTS, CellCounts, Tally, of_folder
from apps_bench.tracking.mlflow import TABLE_ARTIFACT, flatten
from apps_bench.tracking.records import RECORDS, TRANSCRIPTS, RecordsUnreadable, iter_lines, iter_records
from apps_bench.types import JsonObject, ProblemRecord, UsageRecord

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run


class ReportError(AppsBenchError):
    """Nothing to report, or a store/experiment/run that does not exist: says what to check."""


# identity params that define which problems a cell is judged on
SELECTION_PARAMS = ("dataset.name", "dataset.revision", "dataset.path", "dataset.split", "limit", "offset", "only", "difficulty")


class ProblemRow(TypedDict):
    """The report's row of one recorded problem: outcome, the tests the test-case average counts
    (judge.pass_at_1.counted_tests), tokens, calls and times."""

    key: str
    id: str
    split: str
    difficulty: str
    passed: bool
    error: str
    tests_passed: int
    tests_run: int
    tests_kept: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    billed_input_tokens: int  # retried attempts' discarded replies included: what money counts
    billed_output_tokens: int
    model_calls: int
    tool_calls: int
    latency_s: float
    solve_s: float
    judge_s: float
    tool_s: float


@dataclass
class CellData:
    dataset: str
    topology: str
    model: str
    optimizer: str
    seed: str
    key: str
    judge_profile: str
    max_tests_per_row: str
    selection: dict[str, str]
    complete: bool
    source: str  # MLflow run id or the cell folder
    framework: str = ""
    flow: str = ""
    run_kind: str = "cell"
    judge_rules: str = "?"  # the profile's rules version (conf/judge/*.yaml `rules`)
    price: JsonObject | None = None  # the model.price it was costed at when it ran (report.money); None = no price
    provenance: dict[str, str] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict)  # model/judge/tool settings from the cell's identity
    identity: dict[str, str] = field(default_factory=dict)  # the cell's whole identity, flat (its run's params)
    problems: list[ProblemRow] = field(default_factory=list)  # one row per recorded problem: outcome and counts
    counts: CellCounts | None = None  # totals and per-role figures (tracking/cell_counts.py); None: not read

    @property
    def label(self) -> str:
        """Row label: the topology, with the optimizer when one ran (`single+maspo`)."""
        return self.topology if self.optimizer in ("none", "", "?") else f"{self.topology}+{self.optimizer}"

    @property
    def replicate_of(self) -> tuple[tuple[str, str], ...]:
        """What the cell shares with its seed replicates: its identity without the seed (cells are pooled
        over seeds only when this is equal)."""
        return tuple(sorted((k, v) for k, v in self.identity.items() if k != "seed"))

    @property
    def comparability(self) -> tuple[str, str, str, str, str]:
        return (
            self.dataset,
            json.dumps(self.selection, sort_keys=True),
            self.max_tests_per_row,
            self.judge_profile,
            self.judge_rules,
        )

    def judged(self) -> list[ProblemRow]:
        """Problems with a verdict (an infrastructure error is not a wrong answer: left out)."""
        return [p for p in self.problems if not p.get("error")]

    def outcomes(self) -> dict[str, bool]:
        return {p["key"]: bool(p["passed"]) for p in self.judged()}


SETTING_SECTIONS = ("model.", "judge.", "tool.")


def _settings(flat: Mapping[str, str]) -> dict[str, str]:
    return {k: str(v) for k, v in flat.items() if k.startswith(SETTING_SECTIONS) and k not in KEY_SETTINGS}


KEY_SETTINGS = ("model.name", "judge.profile", "judge.rules")  # axes or comparability keys, not settings


def setting_differences(a: CellData, b: CellData) -> list[str]:
    """Model, judge and tool settings two compared cells differ in (e.g. a model's sampling,
    a judge timeout): allowed, since the axes say what is compared, but worth saying."""
    keys = sorted(set(a.settings) | set(b.settings))
    return [
        f"{k}: {a.settings.get(k, '(unset)')} vs {b.settings.get(k, '(unset)')}"
        for k in keys
        if a.settings.get(k) != b.settings.get(k)
    ]


UNSET = "(unset)"  # a setting one cell's identity has and another's has not


def setting_columns(members: Sequence[tuple[Hashable, Mapping[str, str]]]) -> list[str]:
    """The settings (flat identity keys) that tell apart members with the same axes (the first item of
    each pair; one pair per group of seed replicates): what a table shows as columns beside the axes, so
    two cells that differ never share a row. A file's digest is left out when its path tells the same."""
    by_axes: dict[Hashable, list[Mapping[str, str]]] = {}
    for axes, ident in members:
        by_axes.setdefault(axes, []).append(ident)
    keys: set[str] = set()
    for idents in by_axes.values():
        for k in set().union(*idents) - {"seed"}:
            if len({i.get(k, UNSET) for i in idents}) > 1:
                keys.add(k)
    digests = {k for k in keys if k.endswith("_sha256") and k.removesuffix("_sha256") in keys}
    fewer = sorted(keys - digests)
    if all(
        len({tuple(i.get(k, UNSET) for k in fewer) for i in idents})
        == len({tuple(i.get(k, UNSET) for k in keys) for i in idents})
        for idents in by_axes.values()
    ):
        return fewer
    return sorted(keys)


def setting_values(idents: Sequence[Mapping[str, str]], keys: Sequence[str]) -> list[tuple[str, ...]]:
    """Each identity's values of `keys` as a table shows them: a path by its file name when the names
    alone tell the values apart."""
    cols = []
    for k in keys:
        vals = [i.get(k, UNSET) for i in idents]
        names = [Path(v).name if "/" in v else v for v in vals]
        cols.append(names if len(set(names)) == len(set(vals)) else vals)
    return [tuple(col[n] for col in cols) for n in range(len(idents))]


def same_value(a: str | None, b: str | None) -> bool:
    """Two settings' values as the user means them: `0` is `0.0`, `true` is `True`."""
    if a is None or b is None:
        return a is b
    if a == b or a.lower() == b.lower() and a.lower() in ("true", "false", "none", "null"):
        return True
    try:
        return float(a) == float(b)
    except ValueError:
        return False


def comparability_label(c: CellData) -> str:
    """The block a cell belongs to, short enough for a header line: the data (a local file by its
    name, the hub by its revision), the judge profile and its rules version, the test cap and the
    problem selection (`python -m apps_bench.report` prints each block once, with a letter)."""
    sel = c.selection
    path = sel.get("dataset.path") or ""
    if path not in ("", "None", "null"):
        data = f"{c.dataset} · file {Path(path).name} (local)"
    else:
        rev = str(sel.get("dataset.revision") or "?")
        data = f"{c.dataset} · hub rev {rev[:7] if len(rev) == 40 else rev}"
    split = sel.get("dataset.split") or ""
    if split not in ("", "test", "None", "demo"):
        data += f" split {split}"
    cap = c.max_tests_per_row
    tests = "all tests" if cap.lstrip("-").isdigit() and int(cap) <= 0 else f"cap {cap} tests"
    picked = [
        f"{k} {v}"
        for k, v in sel.items()
        if k in ("limit", "offset", "only", "difficulty") and v not in ("", "None", "[]", "0", "null")
    ]
    return " · ".join([data, f"judge {c.judge_profile} (rules {c.judge_rules})", tests, *picked])


def _selection(get: Callable[[str, str], object]) -> dict[str, str]:
    """The cell's problem selection; a local file's revision is `local`, whatever the hub's pin said
    (the configured revision is not what a file's rows came from)."""
    sel = {k: str(get(k, "")) for k in SELECTION_PARAMS}
    if sel.get("dataset.path") not in ("", "None", "null"):
        sel["dataset.revision"] = "local"
    return sel


def incomparable_reason(a: CellData, b: CellData) -> str | None:
    """Why two cells cannot be compared problem by problem, or None."""
    if a.dataset != b.dataset:
        return f"different datasets ({a.dataset} vs {b.dataset})"
    if a.judge_profile != b.judge_profile:
        return f"different judge profiles ({a.judge_profile} vs {b.judge_profile}): verdicts of two profiles are never compared"
    if a.judge_rules != b.judge_rules:
        return (
            f"different judge rules (profile {a.judge_profile}: rules {a.judge_rules} vs {b.judge_rules}): the profile's "
            "verdicts changed between the two; re-score the older cell under the current rules (python -m apps_bench.rescore CELL judge=PROFILE)"
        )
    if a.max_tests_per_row != b.max_tests_per_row:
        return (
            f"different test caps (max_tests_per_row {a.max_tests_per_row} vs {b.max_tests_per_row}): the cap changes the score"
        )
    diff = [
        f"{k}: {a.selection.get(k)} vs {b.selection.get(k)}" for k in SELECTION_PARAMS if a.selection.get(k) != b.selection.get(k)
    ]
    if diff:
        return "different problem selections (" + "; ".join(diff) + ")"
    # what each server did with the cell's tool requests (models/server_gate.py); prompt_text (CrewAI) and not_checked pair with any
    outcomes = ("called", "dropped", "as_text", "no_call", "error")
    ta, tb = a.provenance.get("server.tools"), b.provenance.get("server.tools")
    if ta in outcomes and tb in outcomes and ta != tb:
        return (
            f"their servers did different things with the tools ({a.label} s{a.seed}: {ta}, {b.label} s{b.seed}: {tb}; "
            "prov.server.tools, from the server check at each cell's start): one team worked with its tools and the "
            "other without; rerun both on a server that gives every framework its tools (python -m apps_bench.check)"
        )
    ka, kb = set(a.outcomes()), set(b.outcomes())
    if ka != kb:
        return (
            f"different judged problems: {len(ka - kb)} only in {a.label} s{a.seed}, {len(kb - ka)} only in "
            f"{b.label} s{b.seed} (errors are left out; rerun the incomplete cell to finish it)"
        )
    return None


# ----------------------------------------------------------------------------- records -> rows


TEST_COUNTS = ("tests_passed", "tests_run", "tests_kept")


def problem_row(rec: ProblemRecord) -> ProblemRow:
    """A record (a records.jsonl line) -> the report's per-problem row."""
    return _row(
        rec.key,
        rec.id,
        rec.split,
        rec.difficulty,
        rec.passed,
        rec.error,
        rec.usage,
        (rec.latency_s, rec.solve_s, rec.judge_s),
        counted_tests(rec.verdict),
    )


def table_row(row: JsonObject) -> ProblemRow:
    """A row of a run's `problems.json` table (a run logged without its records file), which holds the
    usage columns flat and no per-call entries -> the report's per-problem row."""
    split, pid = str(row.get("split") or "test"), str(row.get("id"))
    times = tuple(float(row.get(k, 0.0) or 0.0) for k in ("latency_s", "solve_s", "judge_s"))
    tests = {k: int(row.get(k, 0) or 0) for k in TEST_COUNTS}
    tests["tests_kept"] = tests["tests_kept"] or int(row.get("n_tests", 0) or 0)  # tables logged before tests_kept
    return _row(
        f"{split}/{pid}",
        pid,
        split,
        str(row.get("difficulty") or ""),
        bool(row.get("passed")),
        row.get("error"),
        table_usage(row),
        (times[0], times[1], times[2]),
        tests,
    )


def table_usage(row: JsonObject) -> UsageRecord:
    """The usage a problems.json row holds (its flat columns; no per-call entries)."""

    def n(k: str) -> int:
        return int(row.get(k, 0) or 0)

    return UsageRecord(
        prompt_tokens=n("prompt_tokens"),
        completion_tokens=n("completion_tokens"),
        model_calls=n("model_calls"),
        tool_calls=n("tool_calls"),
        retried_prompt_tokens=n("retried_prompt_tokens"),
        retried_completion_tokens=n("retried_completion_tokens"),
        tool_s=float(row.get("tool_s", 0.0) or 0.0),
    )


def _row(
    key: str,
    pid: str,
    split: str,
    difficulty: str,
    passed: bool,
    error: str | None,
    u: UsageRecord,
    times: tuple[float, float, float],
    tests: Mapping[str, int],
) -> ProblemRow:
    prompt, completion = u.prompt_tokens, u.completion_tokens
    billed_in, billed_out = u.billed_tokens
    n_calls = u.model_calls
    return {
        "key": key,
        "id": pid,
        "split": split,
        "difficulty": difficulty,
        "passed": passed,
        "error": error or "",
        "tests_passed": int(tests["tests_passed"]),
        "tests_run": int(tests["tests_run"]),
        "tests_kept": int(tests["tests_kept"]),
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "billed_input_tokens": billed_in,
        "billed_output_tokens": billed_out,
        "model_calls": n_calls,
        "tool_calls": u.tool_calls,
        "latency_s": times[0],
        "solve_s": times[1],
        "judge_s": times[2],
        "tool_s": u.tool_s,
    }


def _rows(path: Path, tally: Tally | None = None) -> list[ProblemRow]:
    """A records.jsonl's per-problem rows, one record at a time (a key's last record wins, as the cell's
    rerun reads it; a torn last line of a cell still running is left out); a line this version cannot
    read is a ReportError that names it. `tally` counts each problem's usage too."""
    rows: dict[str, ProblemRow] = {}
    try:
        for rec in iter_records(path):
            rows[rec.key] = problem_row(rec)
            if tally is not None:
                tally.add(rec.key, rec.usage)
    except RecordsUnreadable as exc:
        raise ReportError(str(exc)) from None
    return list(rows.values())


# ----------------------------------------------------------------------------- local folders


def from_dirs(root: Path | str, *, with_roles: bool = True) -> list[CellData]:
    """Every cell folder under `root` (a folder of cells like outputs/cells, or one cell folder), with its
    per-problem rows and (`with_roles`) its counts."""
    cells = cell_heads(root)
    for cell in cells:
        cell.problems = _rows(Path(cell.source) / RECORDS)
        cell.counts = of_folder(Path(cell.source)) if with_roles else None
    return cells


def cell_heads(root: Path | str) -> list[CellData]:
    """Every cell folder under `root` as its cell.json and summary.json describe it, no record read: who
    needs a few cells' records (plan's estimates) picks them from these."""
    root = Path(root)
    if not root.is_dir():
        raise ReportError(f"no folder {root}: point --cells-dir at a folder of cells (e.g. outputs/cells)")
    dirs = [root] if (root / "cell.json").exists() else sorted(p.parent for p in root.glob("*/cell.json"))
    cells = []
    for d in dirs:
        try:
            info = json.loads((d / "cell.json").read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ReportError(f"{d / 'cell.json'} is not JSON ({exc})") from None
        try:
            summary = json.loads((d / "summary.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            summary = {}
        ident = flatten(info.get("identity") or {})
        axes = info.get("axes") or {}
        prov = summary.get("provenance") or info.get("provenance") or {}
        cell = CellData(
            dataset=str(axes.get("dataset", "?")),
            topology=str(axes.get("topology", "?")),
            model=str(axes.get("model", "?")),
            optimizer=str(axes.get("optimizer", "?")),
            seed=str(axes.get("seed", "?")),
            key=str(info.get("key", "")),
            judge_profile=ident.get("judge.profile", "?"),
            max_tests_per_row=ident.get("max_tests_per_row", "?"),
            judge_rules=ident.get("judge.rules", "?"),
            selection=_selection(ident.get),
            complete=bool(summary.get("complete")),
            price=(summary.get("cost") or {}).get("price"),
            settings=_settings(ident),
            identity=ident,
            source=str(d),
            framework=ident.get("topology.framework", ""),
            flow=ident.get("topology.flow", ""),
            provenance=provenance.comparable(prov) if prov else {},
        )
        cells.append(cell)
    return cells


# ----------------------------------------------------------------------------- MLflow


def _search(c: MlflowClient, exp_ids: list[str], filt: str) -> list[Run]:
    runs: list[Run] = []
    page: str | None = None
    while True:
        got = c.search_runs(exp_ids, filter_string=filt, max_results=1000, page_token=page)
        runs.extend(got)
        page = got.token
        if not page:
            return runs


def find_runs(c: MlflowClient, uri: str, *, experiment: str, sweep: str | None) -> list[Run]:
    """The cell runs of an experiment, or of one sweep (its member cells' runs, found by their
    keys wherever they first ran (tracking/membership.py), and their re-scoring runs)."""
    if sweep:
        return _sweep_runs(c, uri, sweep)[0]
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        names = [e.name for e in c.search_experiments()]
        raise ReportError(f"no experiment {experiment!r} in {uri}; experiments there: {names or 'none'}")
    return _search(c, [exp.experiment_id], "tags.cell_key != ''")


def _sweep_runs(c: MlflowClient, uri: str, sweep: str) -> tuple[list[Run], list[str]]:
    """(runs, missing): the runs of a sweep's members and their re-scoring runs; a description of
    each member that has no run."""
    try:
        parent = c.get_run(sweep)
    except Exception as exc:  # noqa: BLE001 - MLflow raises its own exception types
        raise ReportError(f"no run {sweep!r} in {uri}: {exc}") from None
    members, by_key = membership.member_runs(c, sweep)
    missing = [f"{m.describe()}: no run with its cell key {m.key} in {uri}" for m in members or [] if m.key not in by_key]
    runs = list(by_key.values())
    ids = {r.info.run_id for r in runs}
    rescored = [
        r for r in _search(c, [parent.info.experiment_id], "tags.run_kind = 'rescore'") if r.data.tags.get("rescore_of") in ids
    ]
    return runs + rescored, missing


def _member_problem(r: Run, cell: CellData | None, error: str = "") -> str | None:
    """Why a member's run cannot stand for it in the sweep's comparison, or None."""
    name = f"{r.data.tags.get('cell_name', r.info.run_name)} (run {r.info.run_id})"
    if error:
        return f"{name}: its records cannot be read: {error}"
    if r.info.status != "FINISHED" or r.data.tags.get("complete") != "true":
        return f"{name}: unfinished (status {r.info.status}, complete={r.data.tags.get('complete', 'unset')})"
    if cell is not None and not cell.problems:
        return f"{name}: no per-problem records (records.jsonl / problems.json)"
    return None


def _download(c: MlflowClient, run_id: str, name: str, dst: Path, sizes: Mapping[str, int | None]) -> Path | None:
    """The run's artifact `name` in `dst` (None when the run has none)."""
    if name not in sizes:
        return None
    return Path(c.download_artifacts(run_id, name, str(dst)))


def _problems_of_run(c: MlflowClient, run_id: str, dst: Path, sizes: Mapping[str, int | None], tally: Tally) -> list[ProblemRow]:
    path = _download(c, run_id, RECORDS, dst, sizes)
    if path is not None:
        return _rows(path, tally)

    path = _download(c, run_id, TABLE_ARTIFACT, dst, sizes)
    if path is None:
        return []
    table = json.loads(path.read_text(encoding="utf-8"))  # log_table's "split" orientation
    cols = table.get("columns") or []
    rows = [table_row(dict(zip(cols, values))) for values in table.get("data") or []]
    for row, values in zip(rows, table.get("data") or []):
        tally.add(row["key"], table_usage(dict(zip(cols, values))), per_call=False)
    return rows


def _size(stamp: list[int] | None) -> int | None:
    return None if stamp is None else stamp[0]


def _counts_of_run(c: MlflowClient, run_id: str, dst: Path, sizes: Mapping[str, int | None], tally: Tally) -> CellCounts:
    """The run's counts.json when it was counted from the records and transcripts the run holds (their
    sizes agree), else counted now from the records read and the transcripts, streamed."""
    path = _download(c, run_id, COUNTS, dst, sizes)
    if path is not None:
        try:
            got = CellCounts.from_json(json.loads(path.read_text(encoding="utf-8")))
        except ValueError:
            got = None
        if got is not None and all(_size(got.of.get(n)) == sizes.get(n) for n in (RECORDS, TRANSCRIPTS)):
            return got
    path = _download(c, run_id, TRANSCRIPTS, dst, sizes)
    if path is not None:
        tally.add_transcripts(iter_lines(path))
        path.unlink()
    return tally.counts({n: None if sizes.get(n) is None else [int(sizes[n] or 0), 0] for n in (RECORDS, TRANSCRIPTS)})


def from_mlflow(
    *,
    experiment: str = "apps",
    sweep: str | None = None,
    uri: str | None = None,
    with_roles: bool = True,
) -> list[CellData]:
    """Cell runs of an experiment (or of one sweep, with the re-scoring runs of its cells; a
    member cell that is missing, unfinished or unreadable is left out: `sweep_cells` names it)."""
    return _read(experiment=experiment, sweep=sweep, uri=uri, with_roles=with_roles)[0]


def sweep_cells(sweep: str, *, uri: str | None = None, with_roles: bool = True) -> tuple[list[CellData], list[str]]:
    """(cells, missing) of a sweep: `missing` names every member cell with no run, an unfinished
    run, or records that cannot be read; the sweep's figures are whole only when it is empty."""
    return _read(experiment="", sweep=sweep, uri=uri, with_roles=with_roles)


def _read(*, experiment: str, sweep: str | None, uri: str | None, with_roles: bool) -> tuple[list[CellData], list[str]]:
    import os
    import sys

    from tqdm import tqdm

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar of ours, not one per file
    uri = mlf.tracking_uri() if uri is None else uri
    c = mlf.client(uri)
    if sweep:
        runs, missing = _sweep_runs(c, uri, sweep)
    else:
        runs, missing = find_runs(c, uri, experiment=experiment, sweep=None), []
    by_id = {r.info.run_id: r for r in runs}
    cells = []
    bar = tqdm(runs, desc="reading cell runs", unit="run", file=sys.stderr, disable=len(runs) < 20 or not sys.stderr.isatty())
    with tempfile.TemporaryDirectory(prefix="apps-bench-report-") as tmp:
        for i, r in enumerate(bar):
            if "cell_key" not in r.data.tags:
                continue
            member = bool(sweep) and r.data.tags.get("run_kind") != "rescore"
            dst = Path(tmp) / str(i)
            dst.mkdir()
            try:
                cell = _cell_of_run(c, r, by_id, dst, with_roles)
            except Exception as exc:  # noqa: BLE001 - MLflow's artifact stores raise their own types
                if not member:
                    raise
                missing.append(_member_problem(r, None, f"{type(exc).__name__}: {exc}") or "")
                continue
            finally:
                shutil.rmtree(dst, ignore_errors=True)  # a cell's artifacts go as soon as it is read
            why = _member_problem(r, cell) if member else None
            if why:
                missing.append(why)
            cells.append(cell)
    return cells, missing


def _cell_of_run(c: MlflowClient, r: Run, by_id: Mapping[str, Run], dst: Path, with_roles: bool) -> CellData:
    t, p = r.data.tags, r.data.params
    if not p and t.get("rescore_of") in by_id:  # a re-scoring run: selection from the run it re-scored
        p = by_id[t["rescore_of"]].data.params
    data_run = t.get("final_eval_run_id") or r.info.run_id  # an optimizer cell's problems: its final eval
    cell = CellData(
        dataset=t.get("dataset", "?"),
        topology=t.get("topology", "?"),
        model=t.get("model", "?"),
        optimizer=t.get("optimizer", "?"),
        seed=t.get("seed", "?"),
        key=t.get("cell_key", ""),
        judge_profile=t.get("judge_profile") or p.get("judge.profile", "?"),
        max_tests_per_row=t.get("max_tests_per_row") or p.get("max_tests_per_row", "?"),
        judge_rules=t.get("judge_rules") or p.get("judge.rules", "?"),
        selection=_selection(p.get),
        complete=t.get("complete") == "true",
        price={k: t.get(f"price_{k}") for k in ("input_per_mtok", "output_per_mtok", "as_of")}
        if t.get("price_input_per_mtok")
        else None,
        settings=_settings(p),
        identity=dict(p),
        source=r.info.run_id,
        framework=t.get("framework") or p.get("topology.framework", ""),
        flow=p.get("topology.flow", ""),
        run_kind=t.get("run_kind", "cell"),
        provenance=provenance.from_tags(t),
    )
    sizes = {f.path: f.file_size for f in c.list_artifacts(data_run)}
    tally = Tally()
    cell.problems = _problems_of_run(c, data_run, dst, sizes, tally)
    if with_roles:
        cell.counts = _counts_of_run(c, data_run, dst, sizes, tally)
    return cell


def select(
    cells: list[CellData],
    *,
    dataset: str | None = None,
    optimizer: str | None = None,
    judge: str | None = None,
    include_incomplete: bool = False,
    model: str | None = None,
    seeds: list[str] | None = None,
) -> list[CellData]:
    """Filter, and keep one run per (cell key, judge profile, test cap): the last one read wins."""
    out: dict[tuple[str, str, str], CellData] = {}
    for c in cells:
        if model and c.model != model:
            continue
        if seeds and c.seed not in seeds:
            continue
        if dataset and c.dataset != dataset:
            continue
        if optimizer and c.optimizer != optimizer:
            continue
        if judge and c.judge_profile != judge:
            continue
        if not c.complete and not include_incomplete:
            continue
        if not c.problems:
            continue
        out[(c.key, c.judge_profile, c.max_tests_per_row)] = c
    return list(out.values())
