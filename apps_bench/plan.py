"""`python -m apps_bench.plan [-m] OVERRIDE ...`: what the same `python -m apps_bench` command
would do, without calling any model.

Takes exactly the main command's overrides (experiment files and `-m` sweeps included),
composes every cell the way the real command would (Hydra's config loader, the sweep
expanded as Hydra's basic sweeper does), and for each cell reports its key, its state
from the records on disk (done / partial with n of N recorded / new; `invalid` for bad
settings, which select no problems), the grid guard's verdict, and the model calls and tokens still to spend, estimated from its finished seed
replicates, else from finished cells of the same topology and model (saying which, or that there are none). Nothing is written: no cell
folder, no MLflow run, no model endpoint, no sandbox. It exits 2 when any cell it lists
would be refused or cannot read its data here (so it can gate a script), else 0.

    python -m apps_bench.plan -m topology=single,independent seed=0,1 dataset=apps limit=50
    python -m apps_bench.plan experiment=study --json plan.json     # also machine-readable
    python -m apps_bench.plan experiment=smoke --json -             # JSON only, on stdout
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from apps_bench.cell.key import Cell, grid_refusal, resolve_cell
from apps_bench.cell.pipeline import cell_dir_for
from apps_bench.config.overrides import check_overrides, split_config_dir, with_range_problems
from apps_bench.config.schema import CONF_DIR, Config, ConfigDirMissing, cell_data, config_dirs, hydra_on, typed_config
from apps_bench.config.validate import InvalidSettings, check_settings, empty_selection
from apps_bench.data import load_selection
from apps_bench.errors import AppsBenchError
from apps_bench.report.cells import CellData, cell_heads
from apps_bench.report.render import text_table
from apps_bench.report.table import ReportError
from apps_bench.tracking import cell_counts, faults
from apps_bench.tracking.cell_counts import CellCounts
from apps_bench.tracking.mlflow import flatten
from apps_bench.tracking.records import RecordStore, RecordsUnreadable, record_key
from apps_bench.types import JsonObject, ProblemRecord

# a selection's signature (dataset and selection settings) -> its problems' record keys (None: unreadable here), why not
SelectionCache = dict[str, tuple[set[str] | None, str]]


class PlanError(AppsBenchError):
    """The command cannot be composed (a typo, an unknown option): says what to fix."""


@dataclass
class Estimate:
    basis: str  # what it was estimated from, or why there is no estimate
    calls_per_problem: float | None = None
    tokens_per_problem: float | None = None
    calls: float | None = None  # for the problems still to run
    tokens: float | None = None


@dataclass
class PlannedCell:
    name: str
    key: str
    overrides: list[str]
    axes: dict[str, str | int]
    dir: str
    guard: str  # "allowed", "allowed (allow_any_cell)" or the refusal
    allowed: bool
    state: str  # done | partial | new | unknown (data not readable here) | invalid (bad settings)
    n_selected: int | None
    n_recorded: int  # recorded without error (kept on resume)
    n_errors: int  # recorded errors: retried by the run
    n_to_run: int | None
    estimate: Estimate = field(default_factory=lambda: Estimate(""))
    note: str = ""


# ----------------------------------------------------------------------------- composing


def compose_cells(overrides: list[str], multirun: bool) -> list[tuple[list[str], JsonObject]]:
    """-> [(the cell's own sweep overrides, its job config as plain data)], as the real command composes them."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from apps_bench.tracking.callbacks import sweep_overrides

    try:
        with hydra_on(CONF_DIR):
            loader = GlobalHydra.instance().config_loader()
            master = loader.load_configuration("config", overrides, run_mode=RunMode.MULTIRUN)
            declared = str(OmegaConf.select(master, "hydra.mode") or "").endswith("MULTIRUN")  # an experiment's sweep
            if not (multirun or declared):
                cfg = loader.load_configuration("config", overrides, run_mode=RunMode.RUN)
                return [([], cell_data(cfg))]
            return [
                (list(cell), cell_data(loader.load_sweep_config(master_config=master, sweep_overrides=list(cell))))
                for cell in sweep_overrides(master)
            ]
    except HydraException as exc:
        raise PlanError(str(exc)) from None


# ----------------------------------------------------------------------------- one cell


def _selected_keys(config: Config, cache: SelectionCache) -> tuple[set[str] | None, str]:
    """Record keys of the cell's problems (loading the dataset, no model), or None and why not."""
    sel = {k: getattr(config, k) for k in ("limit", "offset", "only", "difficulty", "max_tests_per_row")}
    sig = json.dumps([asdict(config.dataset), sel], sort_keys=True, default=str)
    if sig not in cache:
        try:
            loaded = load_selection(config)
        except Exception as exc:  # noqa: BLE001 - an unreadable dataset leaves N unknown; the plan still lists the cell
            cache[sig] = (None, f"dataset not readable here ({type(exc).__name__}: {exc})")
        else:
            empty = empty_selection(loaded, config)
            if empty is not None:
                raise InvalidSettings([empty])
            cache[sig] = ({record_key(p.split, p.id) for p in loaded.problems}, "")
    return cache[sig]


def _recorded(cell_dir: Path) -> list[ProblemRecord]:
    """The cell's records as a rerun would find them, read without touching the file."""
    return RecordStore(cell_dir).records() if (cell_dir / "records.jsonl").exists() else []


class Finished:
    """The finished cells under the cells folder, as their cell.json and summary.json describe them; a
    cell's counts (tracking/cell_counts.py) are read only when an estimate needs that cell, once."""

    def __init__(self, heads: list[CellData]) -> None:
        self.done = [c for c in heads if c.complete]
        self._counts: dict[str, CellCounts] = {}

    def counts(self, c: CellData) -> CellCounts:
        """Its saved counts when current, else counted from its records (the plan writes nothing); a cell
        whose records this version cannot read counts no problem (no estimate from it)."""
        if c.source not in self._counts:
            d = Path(c.source)
            try:
                self._counts[c.source] = cell_counts.saved(d) or cell_counts.count(d, transcripts=False)
            except RecordsUnreadable:
                self._counts[c.source] = CellCounts()
        return self._counts[c.source]

    def recorded(self, cells: list[CellData]) -> list[tuple[CellData, CellCounts]]:
        return [(c, k) for c in cells for k in [self.counts(c)] if k.problems]


def _per_problem(finished: Finished, cell: Cell) -> Estimate:
    """Calls and tokens per problem of finished cells like this one: its seed replicates (the same
    identity but for the seed) when there are any, else cells of its topology and model (of its dataset
    when there are any: problem lengths differ between datasets), and the basis says which."""
    ident = flatten(json.loads(json.dumps(dict(cell.identity), default=str)))  # as its cell.json will hold it
    mine = tuple(sorted((k, v) for k, v in ident.items() if k != "seed"))
    replicates = finished.recorded([c for c in finished.done if c.replicate_of == mine])
    if replicates:
        used, what = replicates, "seed replicate(s) of this cell"
    else:
        same = finished.recorded([c for c in finished.done if c.topology == cell.topology and c.model == cell.model])
        if not same:
            return Estimate(f"no finished cell of topology {cell.topology} with model {cell.model} to estimate from")
        here = [(c, k) for c, k in same if c.dataset == cell.dataset]
        where = f"dataset {cell.dataset}" if here else f"other datasets ({', '.join(sorted({c.dataset for c, _ in same}))})"
        used, what = here or same, f"{cell.topology} x {cell.model} on {where} (settings may differ)"
    n = sum(k.problems for _, k in used)
    return Estimate(
        basis=f"{len(used)} finished {what}, {n} problems",
        calls_per_problem=sum(k.model_calls for _, k in used) / n,
        tokens_per_problem=sum(k.total_tokens for _, k in used) / n,
    )


def plan_cell(overrides: list[str], data: JsonObject, *, finished: Finished, cache: SelectionCache) -> PlannedCell:
    config = typed_config(data)
    cell = resolve_cell(config)
    refusal = grid_refusal(cell.axes(), config.grid)
    if refusal and config.allow_any_cell:
        guard, allowed = "allowed (allow_any_cell)", True
    else:
        guard, allowed = (refusal, False) if refusal else ("allowed", True)
    cell_dir = cell_dir_for(config.out_dir, cell)
    invalid = False
    try:  # bad settings refuse a cell whatever allow_any_cell says
        check_settings(config)
        keys, why = _selected_keys(config, cache)
    except InvalidSettings as exc:
        guard, allowed, invalid = str(exc), False, True
        keys, why = None, ""  # no selection: never `done`
    recs = _recorded(cell_dir)
    if keys is not None:
        recs = [r for r in recs if r.key in keys]
    ok = [r for r in recs if not r.error]
    errors = len(recs) - len(ok)
    n = len(keys) if keys is not None else None
    if invalid:
        state = "invalid"
    elif n is None:
        state = "unknown" if recs else "new"
    elif len(ok) >= n:
        state = "done"
    elif recs:
        state = "partial"
    else:
        state = "new"
    to_run = None if n is None else max(0, n - len(ok))
    est = _per_problem(finished, cell)
    if est.calls_per_problem is not None and to_run is not None:
        est.calls, est.tokens = est.calls_per_problem * to_run, (est.tokens_per_problem or 0.0) * to_run
    if cell.optimizer != "none":  # the estimate is the evaluation's: the optimization's rollouts come on top
        why = "; ".join(
            x
            for x in (
                why,
                f"optimizer={cell.optimizer}: its rollouts (budget in optimizer.params.budget) are not in the estimate",
            )
            if x
        )
    return PlannedCell(
        name=cell.name,
        key=cell.key,
        overrides=overrides,
        axes=cell.axes(),
        dir=str(cell_dir),
        guard=guard,
        allowed=allowed,
        state=state,
        n_selected=n,
        n_recorded=len(ok),
        n_errors=errors,
        n_to_run=to_run,
        estimate=est,
        note=why,
    )


def make_plan(overrides: list[str], *, multirun: bool, cells_dir: Path | None = None) -> JsonObject:
    import sys

    from tqdm import tqdm

    composed = compose_cells(overrides, multirun)
    root = cells_dir or Path.cwd() / "outputs" / "cells"
    try:
        finished = Finished(cell_heads(root) if root.is_dir() else [])
    except ReportError:
        finished = Finished([])
    cache: SelectionCache = {}
    bar = tqdm(composed, desc="planning", unit="cell", file=sys.stderr, disable=len(composed) < 20 or not sys.stderr.isatty())
    cells = [plan_cell(o, d, finished=finished, cache=cache) for o, d in bar]
    refused = [c for c in cells if not c.allowed]
    runnable = [c for c in cells if c.allowed]
    estimated = [c for c in runnable if c.estimate.calls is not None and c.state != "done"]
    return {
        "command": ["python", "-m", "apps_bench", *(["-m"] if multirun else []), *overrides],
        "n_cells": len(cells),
        "grid_guard": "refused: nothing would run" if refused else "allowed",
        "states": {s: sum(c.state == s for c in cells) for s in ("done", "partial", "new", "unknown", "invalid")},
        # what the command would stop on: refused cells, and cells whose data cannot be read here
        "blocked": [c.name for c in cells if not c.allowed or c.n_selected is None],
        "problems_to_run": sum(c.n_to_run or 0 for c in runnable),
        "cells_with_unknown_problems": [c.name for c in runnable if c.n_to_run is None],
        "estimated_model_calls": sum(c.estimate.calls or 0.0 for c in estimated),
        "estimated_tokens": sum(c.estimate.tokens or 0.0 for c in estimated),
        "cells_without_estimate": [c.name for c in runnable if c.estimate.calls_per_problem is None and c.state != "done"],
        "finished_cells_read_from": str(root),
        "cells": [asdict(c) for c in cells],
    }


# ----------------------------------------------------------------------------- output


def render(plan: JsonObject) -> str:
    rows = []
    for c in plan["cells"]:
        e = c["estimate"]
        n = "?" if c["n_selected"] is None else str(c["n_selected"])
        state = f"partial {c['n_recorded']} of {n}" if c["state"] == "partial" else c["state"]
        if c["n_errors"]:
            state += f" ({c['n_errors']} errors to retry)"
        calls = "-" if e["calls"] is None else f"{e['calls']:,.0f}"
        tokens = "-" if e["tokens"] is None else f"{e['tokens']:,.0f}"
        if e["calls"] is None and e["calls_per_problem"] is not None:  # problems not countable: the rate alone
            calls, tokens = f"{e['calls_per_problem']:,.1f}/problem", f"{e['tokens_per_problem']:,.0f}/problem"
        guard = "allowed" if c["guard"] == "allowed" else ("allowed*" if c["allowed"] else "REFUSED")
        rows.append([c["name"], c["key"], state, "-" if c["n_to_run"] is None else str(c["n_to_run"]), guard, calls, tokens])
    caption_lines = [
        f"{plan['n_cells']} cells: "
        + ", ".join(f"{v} {k}" for k, v in plan["states"].items() if v)
        + f"; grid guard: {plan['grid_guard']}; {plan['problems_to_run']} problems to run"
        + (
            f" (+ {len(plan['cells_with_unknown_problems'])} cell(s) whose problems could not be counted)"
            if plan["cells_with_unknown_problems"]
            else ""
        ),
        f"estimated: {plan['estimated_model_calls']:,.0f} model calls, {plan['estimated_tokens']:,.0f} tokens "
        f"(per problem from finished seed replicates, else cells of the same topology and model, in {plan['finished_cells_read_from']})",
    ]
    if plan["cells_without_estimate"]:
        caption_lines.append(
            "no estimate (no finished cell of the same topology and model): " + ", ".join(plan["cells_without_estimate"])
        )
    notes: dict[str, list[str]] = {}
    for c in plan["cells"]:
        if not c["allowed"]:
            caption_lines.append(f"REFUSED {c['name']}: {c['guard']}")
        if c["note"]:
            notes.setdefault(c["note"], []).append(c["name"])
    for note, names in notes.items():  # one line per distinct note (a sweep's cells often share one)
        who = names[0] if len(names) == 1 else f"{len(names)} cells ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
        caption_lines.append(f"{who}: {note}")
    if any(c["guard"] == "allowed (allow_any_cell)" for c in plan["cells"]):
        caption_lines.append("allowed* = outside the grid, allowed by allow_any_cell=true")
    head = ["cell", "key", "state", "to run", "grid", "≈ model calls", "≈ tokens"]
    return text_table("plan (no model is called)", head, rows, "\n".join(caption_lines))


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        return 0
    multirun = any(a in ("-m", "--multirun") for a in args)
    dirs, args = split_config_dir(a for a in args if a not in ("-m", "--multirun"))
    try:
        with config_dirs(dirs):
            return _plan(args, multirun)
    except ConfigDirMissing as exc:
        print(f"apps-bench plan: {exc}", file=sys.stderr)
        return 2


def _plan(args: list[str], multirun: bool) -> int:
    json_out = cells_dir = None
    rest: list[str] = []
    it = iter(args)
    for a in it:
        if a in ("--json", "--cells-dir"):
            value = next(it, None)
            if value is None:
                print(f"apps-bench plan: {a} needs a value", file=sys.stderr)
                return 2
            json_out, cells_dir = (value, cells_dir) if a == "--json" else (json_out, value)
        elif a.startswith("--"):
            print(
                f"apps-bench plan: unknown option {a}; options: -m, --json FILE|-, --cells-dir DIR, --config-dir DIR; "
                "the rest are overrides",
                file=sys.stderr,
            )
            return 2
        else:
            rest.append(a)
    bad_json = _json_path_problem(json_out)
    if bad_json:
        print(f"apps-bench plan: --json {json_out}: {bad_json}; nothing was run", file=sys.stderr)
        return 2
    bad = check_overrides(rest)  # the main command's own check of its command line
    if bad:
        print(f"apps-bench plan: {InvalidSettings(with_range_problems(bad, rest))}", file=sys.stderr)
        return 2
    with faults.answered("apps-bench plan", "The plan only reads: nothing was written."):
        return _write_plan(rest, multirun, json_out, cells_dir)


def _json_path_problem(json_out: str | None) -> str | None:
    """Why --json FILE cannot be written, checked before anything is composed (None: it can, or no FILE)."""
    if not json_out or json_out == "-":
        return None
    folder = Path(json_out).parent
    if not folder.is_dir():
        return f"the folder {folder} does not exist. Create it (mkdir -p {folder}) or give a file in an existing folder"
    why = faults.unwritable(folder)
    return f"{why}. Give a file in a folder this user can write" if why else None


def _write_plan(rest: list[str], multirun: bool, json_out: str | None, cells_dir: str | None) -> int:
    try:
        plan = make_plan(rest, multirun=multirun, cells_dir=Path(cells_dir) if cells_dir else None)
    except (AppsBenchError, ValueError) as exc:
        print(f"apps-bench plan: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(plan, indent=2, default=str)
    if json_out == "-":
        print(text)
    else:
        print(render(plan))
        if json_out:
            Path(json_out).write_text(text + "\n", encoding="utf-8")
            print(f"plan written to {json_out}")
    if plan["blocked"]:  # a gate for scripts: the command would not run these cells
        n = len(plan["blocked"])
        print(
            f"apps-bench plan: {n} of {plan['n_cells']} cells would be refused or cannot read their data here "
            f"({', '.join(plan['blocked'][:5])}{', ...' if n > 5 else ''}): fix them before running the command",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
