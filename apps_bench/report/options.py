"""The report's options, checked before any cell is read or anything is printed or written.

A misspelt name (a baseline topology, a judge profile, a dataset, an optimizer, a model
preset) is answered with "did you mean" and the options conf/ (and `--config-dir`) offers; a file the report
cannot write (an export or chart of another type) with the types it can. Every problem is
listed at once; the command exits 2 (report.__main__).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from apps_bench.config.overrides import closest, groups
from apps_bench.config.schema import ConfigDirMissing, config_dirs
from apps_bench.report.groups import Baseline
from apps_bench.report.table import ReportError

EXPORT_SUFFIXES = (".csv", ".parquet", ".pq")
CHART_SUFFIXES = (".png", ".pdf", ".svg")


def _name(option: str, value: str, choices: list[str], what: str) -> str | None:
    if value in choices:
        return None
    guess = closest(value, choices)
    hint = f"; did you mean {option} {guess}?" if guess else ""
    return f"{option} {value}: no such {what}{hint} ({what}s: {', '.join(choices)})"


def topology_labels(options: dict[str, list[str]]) -> list[str]:
    """What a baseline can be: a topology, or topology+optimizer (the report's row label)."""
    topos = options.get("topology", [])
    opts = [o for o in options.get("optimizer", []) if o != "none"]
    return topos + [f"{t}+{o}" for t in topos for o in opts]


SETTING = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


def baseline_of(spec: str) -> Baseline:
    """`baseline=TOPOLOGY`, or `SETTING=VALUE` for a setting the cells vary (model.temperature=0)."""
    key, sep, value = (x.strip() for x in spec.partition("="))
    if not sep or not value or not SETTING.match(key):
        raise ReportError(
            f"--compare {spec!r}: write --compare baseline=TOPOLOGY (e.g. --compare baseline=single), "
            "or --compare SETTING=VALUE for a setting the cells vary (e.g. --compare model.temperature=0)"
        )
    # a provider's own setting as the command line spells it (model.gold.wrong_fraction): the cells name their
    # settings as their keys hash them, in the flat layout (model.wrong_fraction)
    key = re.sub(r"\Amodel\.(gold|local)\.", "model.", key)
    return Baseline("baseline" if key == "topology" else key, value)


def check(args: argparse.Namespace) -> Baseline | None:
    """Every bad option at once (ReportError) before any work; -> the --compare baseline, if any."""
    try:
        with config_dirs([args.config_dir] if getattr(args, "config_dir", None) else []):
            options = groups()  # the package's conf/ and the presets of --config-dir
    except ConfigDirMissing as exc:
        raise ReportError(str(exc)) from None
    baseline, bad = _compare(args, options)
    bad += _names(args, options) + _files(args) + _combinations(args)
    if bad:
        raise ReportError("bad option" + ("s" if len(bad) > 1 else "") + ", nothing was read or written:\n  " + "\n  ".join(bad))
    return baseline


def _compare(args: argparse.Namespace, options: dict[str, list[str]]) -> tuple[Baseline | None, list[str]]:
    """--compare: its form, and a topology baseline that names a topology (or topology+optimizer)."""
    if not args.compare:
        return None, []
    try:
        baseline = baseline_of(args.compare)
    except ReportError as exc:
        return None, [str(exc)]
    labels = topology_labels(options)
    if baseline.on_setting or baseline.value in labels:
        return baseline, []
    guess = closest(baseline.value, labels)
    hint = f"; did you mean --compare baseline={guess}?" if guess else ""
    return baseline, [
        f"--compare {baseline}: no such topology{hint} (topologies: {', '.join(options.get('topology', []))}; "
        "with an optimizer: TOPOLOGY+OPTIMIZER, e.g. single+maspo)"
    ]


def _names(args: argparse.Namespace, options: dict[str, list[str]]) -> list[str]:
    """--judge, --dataset, --optimizer and --model name options conf/ has; --seeds are whole numbers."""
    bad = []
    for option, value, group in (
        ("--judge", args.judge, "judge"),
        ("--dataset", args.dataset, "dataset"),
        ("--optimizer", args.optimizer, "optimizer"),
    ):
        if value:
            why = _name(option, value, options.get(group, []), f"{group} profile" if group == "judge" else group)
            if why:
                bad.append(why)
    if args.model:  # a preset, or preset:MODEL_ID for presets that serve any model (openai:gpt-x)
        why = _name("--model", args.model.split(":", 1)[0], options.get("model", []), "model preset")
        if why:
            bad.append(why)
    if args.seeds:
        wrong = [s for s in (x.strip() for x in args.seeds.split(",")) if not s.isdigit()]
        if wrong:
            bad.append(
                f"--seeds {args.seeds}: seeds are whole numbers >= 0 separated by commas, e.g. --seeds 0,1 (not {', '.join(wrong)})"
            )
    return bad


def _files(args: argparse.Namespace) -> list[str]:
    """What the report writes has a suffix it can write; the folder it reads exists."""
    bad = []
    for path in args.export:
        if Path(path).suffix not in EXPORT_SUFFIXES:
            bad.append(
                f"--export {path}: the tidy table is written as .csv or .parquet; e.g. --export {Path(path).with_suffix('.csv')}"
            )
    for option in ("plot", "pareto", "forest"):
        path = getattr(args, option)
        if path and Path(path).suffix not in CHART_SUFFIXES:
            bad.append(
                f"--{option} {path}: charts are written as {', '.join(CHART_SUFFIXES)}; "
                f"e.g. --{option} {Path(path).with_suffix('.png')}"
            )
    if args.forest and not args.compare:
        bad.append(f"--forest {args.forest}: the forest plot draws --compare's differences; add --compare baseline=TOPOLOGY")
    if args.cells_dir and not Path(args.cells_dir).is_dir():
        bad.append(f"--cells-dir {args.cells_dir}: no such folder; point it at a folder of cells (e.g. outputs/cells)")
    return bad


def _given(args: argparse.Namespace, options: tuple[str, ...]) -> list[str]:
    """The options among `options` (as `--name`) that the command gave."""
    return [o for o in options if getattr(args, o.removeprefix("--").replace("-", "_"))]


def _combinations(args: argparse.Namespace) -> list[str]:
    """Options that mean nothing together: --publish without --sweep, --format without --table, --table or
    another --metric beside the whole report's options."""
    bad = []
    if args.publish and not args.sweep:
        bad.append("--publish writes a sweep's comparison: give the sweep's parent run, --sweep PARENT_RUN_ID")
    if args.format != "text" and not args.table:
        bad.append(f"--format {args.format}: formats one table; add --table apps-paper (or --table pass-at-k)")
    if args.table:
        others = _given(args, ("--compare", "--export", "--plots", "--plot", "--pareto", "--forest", "--publish"))
        if others:
            bad.append(
                f"--table {args.table} prints that table alone; {', '.join(others)} belong to the whole report: "
                "drop --table, or run the report twice"
            )
    if args.metric != "pass_at_1":
        ignored = _given(args, ("--compare", "--export", "--plots", "--pareto", "--forest", "--cells-dir", "--table"))
        if ignored:
            bad.append(
                f"--metric {args.metric}: another metric is one table of means over seeds (and --plot); "
                f"{', '.join(ignored)} need the per-problem records of pass@1: drop --metric or them"
            )
    return bad
