"""APPS problems: loading (hub / local file / demos), the test cap, skip counting, the eval IDs."""

from apps_bench.data.apps import DIFFICULTIES, DatasetUnavailableError, LoadResult, hub_data_files, load_problems, load_selection
from apps_bench.data.demo import DEMO_PROBLEMS
from apps_bench.data.manifest import eval_ids, eval_manifest
from apps_bench.data.rows import SKIP_REASONS, RowError, parse_row

__all__ = [
    "DEMO_PROBLEMS",
    "DIFFICULTIES",
    "DatasetUnavailableError",
    "LoadResult",
    "RowError",
    "SKIP_REASONS",
    "eval_ids",
    "eval_manifest",
    "hub_data_files",
    "load_problems",
    "load_selection",
    "parse_row",
]
