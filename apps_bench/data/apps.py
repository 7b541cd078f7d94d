"""Load APPS problems: the hub's data files at a pinned revision, a local file, or the demos.

Why not `load_dataset("codeparrot/apps")`: datasets >= 4 rejects dataset loading
scripts, so the repo's plain data files are read with the `json` (or `parquet`)
builder instead, at a pinned revision that is recorded with every run.
Selection (only / difficulty / offset / limit) is applied to raw rows before the
expensive `input_output` parse, and a bounded selection stops reading early, so
streaming the 1.2 GB test split for its first 50 rows reads only those rows.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

from apps_bench.config.schema import Config, DatasetConfig
from apps_bench.data.demo import DEMO_PROBLEMS
from apps_bench.data.rows import RowError, lift_int_digit_limit, parse_row, row_id
from apps_bench.errors import AppsBenchError
from apps_bench.types import JsonObject, Problem

DIFFICULTIES = ("introductory", "interview", "competition")
UNPARSABLE_ROW = "unparsable_row"  # a JSONL line that is not a JSON object
REQUIRED_COLUMNS = ("problem_id", "question", "input_output")
PARQUET_REVISION = "refs/convert/parquet"  # the hub's parquet conversion branch: read its all/ folder


class DatasetUnavailableError(OSError, AppsBenchError):
    """The hub (or a local mirror) could not be read; the message says how to load offline instead."""


@dataclass(frozen=True)
class LoadResult:
    problems: list[Problem]
    skipped: dict[str, int]  # skip reason -> rows skipped for it (never silent)
    source: str  # where the rows came from (hub URL, file path, or "builtin:demo")
    revision: str  # pinned hub revision, "local" for a file, "builtin" for the demos
    missing_ids: tuple[str, ...] = ()  # `only` IDs that no row had (skipped rows count as present)
    rows_selected: int = 0  # rows that passed the filters (problems + skipped)
    rows_matched: int = 0  # rows that `only`/`difficulty` matched, before `offset`/`limit` (validate.empty_selection)
    skipped_rows: tuple[str, ...] = ()  # each skipped row: its line (a local JSONL file) or id, and why

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped.values())


_Item = TypeVar("_Item")


@dataclass(frozen=True)
class _Selection:
    """The selection keys of a load: `only` and `difficulty` filter, then `offset` skips and `limit` keeps."""

    limit: int | None
    offset: int
    only: Sequence[str]
    difficulty: str | None


@dataclass
class _Tally:
    """What `_select` saw, so an empty selection can say which setting emptied it."""

    matched: int = 0  # rows past the filters, before offset
    found: set[str] = field(default_factory=set)  # the `only` IDs seen


def _select(
    items: Iterable[_Item],
    key: Callable[[_Item], tuple[str | None, str]],
    sel: _Selection,
    tally: _Tally,
) -> Iterator[_Item]:
    """Filter by `only` and `difficulty`, then skip `offset` and keep `limit`; stop reading as soon as done."""
    wanted = {str(i) for i in sel.only}
    if sel.limit is not None and sel.limit <= 0:
        return
    for item in items:
        pid, diff = key(item)
        if wanted and pid not in wanted:
            continue
        if wanted and pid is not None:
            tally.found.add(pid)
        if sel.difficulty and diff != sel.difficulty:
            continue
        tally.matched += 1
        if tally.matched <= sel.offset:
            continue
        yield item
        if sel.limit is not None and tally.matched - sel.offset >= sel.limit:
            return
        if wanted and tally.found >= wanted:
            return


def _row_key(item: Located) -> tuple[str | None, str]:
    if item.row is None:
        return None, ""
    return row_id(item.row), str(item.row.get("difficulty") or "")


def _check_schema(row: Mapping[str, object], source: str) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in row]
    if missing:
        raise ValueError(
            f"{source}: rows lack {missing}; expected the codeparrot/apps schema "
            f"(problem_id, question, solutions, input_output, difficulty, url, starter_code)"
        )


@dataclass(frozen=True)
class Located:
    """A row and where its source holds it ("line 4" of a JSONL file, "row 4" of parquet or the hub),
    so a skipped or repeated row is named where the user can find it. `row` is None for a JSONL line
    that is not a JSON object: kept in the stream so the row counts."""

    where: str
    row: JsonObject | None


class DuplicateIds(ValueError, AppsBenchError):
    """Selected rows that share a problem_id: both would be recorded under one key, so none is run."""

    def __init__(self, source: str, places: Mapping[str, Sequence[str]]) -> None:
        shown = "; ".join(f"problem_id {pid} on {', '.join(where)}" for pid, where in list(places.items())[:10])
        more = f"; and {len(places) - 10} more ids" if len(places) > 10 else ""
        super().__init__(
            f"{source}: {len(places)} problem_id(s) appear on more than one row ({shown}{more}); a problem is "
            "recorded by its id, so each row needs its own: remove or renumber the repeated rows"
        )
        self.places = dict(places)


class NotJsonLines(ValueError, AppsBenchError):
    """A .jsonl/.json file that holds one JSON document (an array, or pretty-printed) instead of one object per line."""


def _iter_jsonl(path: Path) -> Iterator[Located]:
    with path.open("r", encoding="utf-8-sig") as f:  # -sig: a byte-order mark (Windows editors write one) is not data
        first = True
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            if first and line.lstrip()[:1] == "[" or first and line.strip() == "{":
                kind = "a JSON array" if line.lstrip()[:1] == "[" else "one pretty-printed JSON document"
                raise NotJsonLines(
                    f"dataset file {path} is not JSON Lines (one JSON object per line): it holds {kind}. Write one row "
                    'per line, e.g. python -c "import json,sys; [print(json.dumps(r)) for r in json.load(open(sys.argv[1]))]" '
                    f"{path} > rows.jsonl"
                )
            first = False
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            yield Located(f"line {number}", row if isinstance(row, dict) else None)


def _numbered(rows: Iterable[object]) -> Iterator[Located]:
    """Rows of parquet or the hub, named by their position (1-based, as lines are)."""
    for number, row in enumerate(rows, start=1):
        yield Located(f"row {number}", row if isinstance(row, dict) else None)


def _iter_parquet(path: Path) -> Iterator[JsonObject]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    for batch in pf.iter_batches(batch_size=32):
        yield from batch.to_pylist()


def _iter_local(path: Path) -> Iterator[Located]:
    if path.is_dir():
        raise IsADirectoryError(f"dataset.path={path} is a directory; give one codeparrot-schema .jsonl or .parquet file in it")
    if not path.is_file():
        raise FileNotFoundError(
            f"dataset file {path} not found (dataset.path must be a codeparrot-schema .jsonl or .parquet file)"
        )
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    if suffix == ".parquet":
        return _numbered(_iter_parquet(path))
    if suffix in (".jsonl", ".json"):
        return _iter_jsonl(path)
    raise ValueError(f"dataset file {path}: unknown format {suffix!r}; use .jsonl or .parquet")


def hub_data_files(hub_repo: str, revision: str, split: str) -> tuple[str, str]:
    """(builder, data_files) for a split of the hub repo, or of a local mirror of it (a directory).

    The JSONL files at a pinned commit are the default; the revision
    `refs/convert/parquet` reads the hub's parquet conversion (its `all/` folder only:
    the per-difficulty folders duplicate it).
    """
    local = Path(hub_repo).expanduser()
    if local.is_dir():
        if revision == PARQUET_REVISION or not (local / f"{split}.jsonl").exists() and (local / "all" / split).is_dir():
            return "parquet", str(local / "all" / split / "*.parquet")
        return "json", str(local / f"{split}.jsonl")
    base = f"hf://datasets/{hub_repo}@{revision}"
    if revision == PARQUET_REVISION:
        return "parquet", f"{base}/all/{split}/*.parquet"
    return "json", f"{base}/{split}.jsonl"


def _iter_hub(builder: str, data_files: str, streaming: bool) -> Iterator[JsonObject]:
    try:
        from datasets import load_dataset
    except ImportError as e:  # pragma: no cover - datasets is a core dependency
        raise ImportError("loading APPS from the hub needs the `datasets` package: pip install datasets") from e
    try:
        ds = load_dataset(builder, data_files=data_files, split="train", streaming=streaming)
    except Exception as e:
        raise DatasetUnavailableError(
            f"could not load {data_files} with the datasets {builder!r} builder: {type(e).__name__}: {e}. "
            "Offline or behind a firewall? Use a local codeparrot-schema .jsonl/.parquet file instead: "
            "dataset.path=/data/apps/test.jsonl for a run, or ROWS for `python -m apps_bench.judge`."
        ) from e
    return iter(ds)


def load_problems(
    dataset_cfg: DatasetConfig,
    *,
    limit: int | None = None,
    offset: int = 0,
    only: Sequence[str] = (),
    difficulty: str | None = None,
    max_tests_per_row: int = 20,
) -> LoadResult:
    """Load, filter and parse problems; rows without usable tests are skipped and counted by reason.

    `dataset_cfg` is the typed dataset config (`config.typed(DatasetConfig, data)` from plain data).
    `limit` and `offset` count rows that pass `only`/`difficulty`, skipped rows included,
    so `limit=50` on the test split is exactly problem IDs 0-49 (the eval IDs), whatever rows
    among them cannot be used; each skipped row is named in `skipped_rows`.
    """
    lift_int_digit_limit()
    if difficulty is not None and difficulty not in DIFFICULTIES:
        raise ValueError(f"unknown difficulty {difficulty!r}; choose one of {', '.join(DIFFICULTIES)}")
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    only = tuple(str(i) for i in (only or ()))
    split, path, source_kind = dataset_cfg.split, dataset_cfg.path, dataset_cfg.source
    tally = _Tally()
    sel = _Selection(limit=limit, offset=offset, only=only, difficulty=difficulty)

    if source_kind == "demo" and not path:
        chosen = list(_select(DEMO_PROBLEMS, lambda p: (p.id, p.difficulty), sel, tally))
        return _result(chosen, Counter(), "builtin:demo", "builtin", only, tally, len(chosen))

    if path:
        p = Path(str(path)).expanduser()
        rows, source, revision = _iter_local(p), str(p), "local"
    elif source_kind in ("hub", "file"):
        if source_kind == "file":
            raise ValueError("dataset.source=file needs dataset.path=FILE (a codeparrot-schema .jsonl or .parquet)")
        repo, revision = dataset_cfg.hub_repo, dataset_cfg.revision
        if not revision:
            raise ValueError("dataset.revision must pin a hub revision (a commit sha, or 'main' explicitly)")
        builder, data_files = hub_data_files(repo, revision, split)
        bounded = limit is not None or bool(only)
        streaming = dataset_cfg.streaming and bounded
        rows, source = _numbered(_iter_hub(builder, data_files, streaming)), data_files
    else:
        raise ValueError(f"unknown dataset.source {source_kind!r}; choose hub, file or demo")

    skipped: Counter[str] = Counter()
    which: list[str] = []
    problems: list[Problem] = []
    n_selected = 0
    checked = False
    places: dict[str, list[str]] = {}  # problem_id -> where each selected row with it is
    for item in _select(rows, _row_key, sel, tally):
        n_selected += 1
        row = item.row
        if row is None:
            skipped[UNPARSABLE_ROW] += 1
            which.append(f"{item.where}: not a JSON object")
            continue
        if row_id(row) is not None:
            places.setdefault(str(row_id(row)), []).append(item.where)
        if not checked:
            _check_schema(row, source)
            checked = True
        try:
            problems.append(parse_row(row, split=split, max_tests_per_row=max_tests_per_row))
        except RowError as e:
            skipped[e.reason] += 1
            which.append(f"id {row_id(row)}: {e.reason}")
    repeated = {pid: where for pid, where in places.items() if len(where) > 1}
    if repeated:
        raise DuplicateIds(source, repeated)
    return _result(problems, skipped, source, revision, only, tally, n_selected, which)


def load_selection(config: Config) -> LoadResult:
    """The problems a cell selects: its dataset and the top-level selection keys of its `Config`."""
    return load_problems(
        config.dataset,
        limit=config.limit,
        offset=config.offset,
        only=tuple(str(x) for x in config.only),
        difficulty=config.difficulty,
        max_tests_per_row=config.max_tests_per_row,
    )


def _result(
    problems: list[Problem],
    skipped: Counter[str],
    source: str,
    revision: str,
    only: Sequence[str],
    tally: _Tally,
    n: int,
    which: Sequence[str] = (),
) -> LoadResult:
    missing = tuple(i for i in only if i not in tally.found)
    return LoadResult(
        problems=problems,
        skipped=dict(skipped),
        source=source,
        revision=revision,
        missing_ids=missing,
        rows_selected=n,
        rows_matched=tally.matched,
        skipped_rows=tuple(which),
    )
