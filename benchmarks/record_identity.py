#!/usr/bin/env python
"""Do two source trees record the same cells? The eight runners on gold, once with each tree, compared.

Each tree runs one sweep through the real CLI (`python -m apps_bench -m topology=<every conf/topology
option> model=gold ...`, that tree on PYTHONPATH, this interpreter and its packages for both), on the
same copy of tests/fixtures/apps/train_mini150.jsonl, with some deliberately wrong answers
(model.wrong_fraction) and gold's python_exec call in every tool-using role, logged to a SQLite store of
its own. Then, per runner: the cell's folder name (its key), and every file of the folder byte for byte
once timing is masked (TIMING), records.jsonl and transcripts.jsonl line by line in problem order, and
the cell's MLflow table (problems.json). Prints SAME or the first differences per runner; exit 1 on
any difference, 2 on a sweep that fails.

Usage (from the repo root; the reference tree: `git worktree add /tmp/base b38b3ea`):
  python benchmarks/record_identity.py /tmp/base . [--limit 4] [--keep DIR]
  python benchmarks/record_identity.py /tmp/base . --rename model.wrong_fraction=model.gold.wrong_fraction
--rename OLD=NEW spells a setting the candidate's way where it moved (the base keeps OLD).
Run it base against base once: SAME there says the comparison sees no noise of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ROWS = REPO / "tests" / "fixtures" / "apps" / "train_mini150.jsonl"

# What may differ between two runs of the same code, and nothing else (the one list):
# timing fields, by name at any depth of a JSON file: the values are masked, the fields stay
TIMING = ("latency_s", "solve_s", "judge_s", "tool_s", "completed_at", "seconds", "wall_s", "phases_s")
# scheduling: which solver process took the problem (the first free one)
SCHEDULING = ("solver",)
# the interleaving of a problem's concurrent agents (independent, decentralized): their model calls and transcript
# events land in the order they finish; compared in a canonical order (each agent's own events keep theirs), and only
# when the line has the same length (a reordering moves bytes, it adds or removes none)
INTERLEAVED = {"records.jsonl": "usage.calls", "transcripts.jsonl": "events"}
# a file's state, not its content: counts.json's stamp of the files it counted (size, mtime)
STAMPS = {"counts.json": ("of",)}
# sums of floats taken in the order problems finished (counts.json's per-role estimates): compared to 12 digits
SUMMED = {"counts.json": 12}
# which code ran: the commit, by design different between two trees
CODE = {"cell.json": ("git_sha", "git_dirty"), "summary.json": ("git_sha", "git_dirty")}
MASK = "<masked>"

# the sweep both trees run: settings as the base spells them (--rename for the candidate's spelling)
SWEEP = [
    "model=gold",
    "dataset=apps",
    "dataset.split=train",
    "model.wrong_fraction=0.3",
    "allow_any_cell=true",
    "progress=false",
    "tracking.experiment=identity",
]


@dataclass
class Outcome:
    runner: str
    differences: list[str] = field(default_factory=list)
    compared: list[str] = field(default_factory=list)


def runners(tree: Path) -> list[str]:
    return sorted(p.stem for p in (tree / "apps_bench" / "conf" / "topology").glob("*.yaml"))


def run_sweep(tree: Path, work: Path, rows: Path, topologies: list[str], limit: int, renames: dict[str, str]) -> Path:
    """The sweep with `tree`'s code in a fresh folder under `work` -> that folder."""
    work.mkdir(parents=True)
    args = [*SWEEP, f"dataset.path={rows}", f"limit={limit}", f"topology={','.join(topologies)}"]
    args = [renames.get(a.split("=", 1)[0], a.split("=", 1)[0]) + "=" + a.split("=", 1)[1] for a in args]
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "APPS_BENCH_PARENT_RUN_ID")}
    env.update(PYTHONPATH=str(tree), MLFLOW_DISABLE_TELEMETRY="true", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "apps_bench", "-m", *args],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    (work / "sweep.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    if proc.returncode != 0:
        print(
            f"record_identity: the sweep with {tree} failed (exit {proc.returncode}), see {work / 'sweep.log'}:\n"
            f"{proc.stderr[-2000:]}",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return work


def masked(value: Any, drop: tuple[str, ...] = TIMING) -> Any:
    """`value` (JSON) with the fields named in `drop`, at any depth, set to MASK."""
    if isinstance(value, dict):
        return {k: MASK if k in drop else masked(v, drop) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v, drop) for v in value]
    return value


def _jsonl_line(line: str) -> tuple[str, str]:
    """(the problem's key, the line with its timing and scheduling values masked, every other byte kept)."""
    names = "|".join(map(re.escape, TIMING))
    line = re.sub(rf'"({names})": -?[0-9][0-9.eE+-]*', rf'"\1": "{MASK}"', line)
    line = re.sub(rf'"({"|".join(SCHEDULING)})": "[^"]*"', rf'"\1": "{MASK}"', line)
    return str(json.loads(line).get("key", "")), line


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    """Where two JSON values first differ, with both values (clipped)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(dict.fromkeys([*a, *b])):
            if k not in a or k not in b:
                return f"{path}.{k}: only in {'candidate' if k not in a else 'base'}"
            if a[k] != b[k]:
                return _first_difference(a[k], b[k], f"{path}.{k}")
        if list(a) != list(b):
            return f"{path}: key order {list(a)} != {list(b)}"
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)}"
    if isinstance(a, str) and isinstance(b, str):
        i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        a, b = a[max(0, i - 40) : i + 80], b[max(0, i - 40) : i + 80]  # around the first character that differs
    return f"{path or '.'}: base {json.dumps(a, ensure_ascii=False)[:160]} != candidate {json.dumps(b, ensure_ascii=False)[:160]}"


def _uninterleaved(name: str, line: str) -> Any:
    """The line's JSON with its concurrent agents' entries (INTERLEAVED) in a canonical order."""
    value = json.loads(line)
    *parents, leaf = INTERLEAVED[name].split(".") if name in INTERLEAVED else ["", ""]
    node = value
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict) and isinstance(node.get(leaf), list):
        entries = node[leaf]
        if name == "transcripts.jsonl":  # stable: each agent's events in their own order
            node[leaf] = sorted(entries, key=lambda e: str(e.get("agent")) if isinstance(e, dict) else "")
        else:
            node[leaf] = sorted(entries, key=lambda e: json.dumps(e, sort_keys=True))
    return value


def _compare_jsonl(name: str, base: str, cand: str, out: list[str]) -> None:
    a = dict(_jsonl_line(line) for line in base.splitlines())
    b = dict(_jsonl_line(line) for line in cand.splitlines())
    if sorted(a) != sorted(b):
        out.append(f"{name}: problems {sorted(a)} != {sorted(b)}")
    for key in sorted(set(a) & set(b)):
        if a[key] == b[key]:
            continue
        x, y = _uninterleaved(name, a[key]), _uninterleaved(name, b[key])
        if x == y and len(a[key]) == len(b[key]):
            continue  # the same entries, finished in another order
        how = _first_difference(x, y) if x != y else "same JSON, other bytes (formatting)"
        out.append(f"{name} {key}: {how}")
        return


def _rounded(value: Any, digits: int) -> Any:
    if isinstance(value, dict):
        return {k: _rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v, digits) for v in value]
    return float(f"{value:.{digits}g}") if isinstance(value, float) else value


def _compare_json(name: str, base: str, cand: str, out: list[str]) -> None:
    drop = (*TIMING, *STAMPS.get(name, ()), *CODE.get(name, ()))
    a, b = masked(json.loads(base), drop), masked(json.loads(cand), drop)
    if name in SUMMED:
        a, b = _rounded(a, SUMMED[name]), _rounded(b, SUMMED[name])
    if a != b or list(a) != list(b):
        out.append(f"{name}: {_first_difference(a, b)}")


def _compare_table(name: str, base: str, cand: str, out: list[str]) -> None:
    """An MLflow table (columns + rows): timing columns masked, rows in problem order."""

    def rows(text: str) -> tuple[list[str], list[list[Any]]]:
        t = json.loads(text)
        cols = list(t["columns"])
        masked = [[MASK if c in TIMING else v for c, v in zip(cols, row)] for row in t["data"]]
        return cols, sorted(masked, key=lambda r: json.dumps(r[:2]))

    (ca, ra), (cb, rb) = rows(base), rows(cand)
    if ca != cb or ra != rb:
        out.append(f"{name}: {_first_difference({'columns': ca, 'rows': ra}, {'columns': cb, 'rows': rb})}")


def compare_files(name: str, base: str, cand: str, out: list[str]) -> None:
    if name.endswith(".jsonl"):
        _compare_jsonl(name, base, cand, out)
    elif name == "problems.json":
        _compare_table(name, base, cand, out)
    elif name.endswith(".json"):
        _compare_json(name, base, cand, out)
    elif base != cand:
        lines = [f"{i + 1}: {x!r} != {y!r}" for i, (x, y) in enumerate(zip(base.splitlines(), cand.splitlines())) if x != y]
        out.append(f"{name}: line {lines[0] if lines else 'count differs'}")


def cells(run: Path) -> dict[str, Path]:
    return {p.name: p for p in sorted((run / "outputs" / "cells").iterdir()) if p.is_dir()}


def tables(run: Path) -> dict[str, str]:
    """Each cell's MLflow table (problems.json), by the cell key its run's records carry."""
    out = {}
    cells_dir = run / "outputs" / "cells"
    for table in run.rglob("problems.json"):
        records = table.parent / "records.jsonl"
        if not table.is_relative_to(cells_dir) and records.is_file():
            first = records.read_text(encoding="utf-8").splitlines()[:1]
            out[str(json.loads(first[0])["cell"]) if first else ""] = table.read_text(encoding="utf-8")
    return out


def compare(base_run: Path, cand_run: Path, topologies: list[str]) -> list[Outcome]:
    a, b = cells(base_run), cells(cand_run)
    ta, tb = tables(base_run), tables(cand_run)
    results = []
    for topo in topologies:
        res = Outcome(topo)
        fa = [n for n in a if f"-{topo}-" in n]
        fb = [n for n in b if f"-{topo}-" in n]
        if fa != fb or len(fa) != 1:
            res.differences.append(f"cell folder: base {fa} != candidate {fb}")
        if fa and fb:
            da, db = a[fa[0]], b[fb[0]]
            names = sorted({p.name for p in da.iterdir()} | {p.name for p in db.iterdir()})
            for name in names:
                pa, pb = da / name, db / name
                if not (pa.is_file() and pb.is_file()):
                    res.differences.append(f"{name}: only in {'base' if pa.is_file() else 'candidate'}")
                    continue
                compare_files(name, pa.read_text(encoding="utf-8"), pb.read_text(encoding="utf-8"), res.differences)
                res.compared.append(name)
            key_a, key_b = fa[0].rsplit("-", 1)[-1], fb[0].rsplit("-", 1)[-1]
            if key_a in ta or key_b in tb:
                if key_a not in ta or key_b not in tb:
                    res.differences.append(f"problems.json (MLflow): only in {'base' if key_a in ta else 'candidate'}")
                else:
                    compare_files("problems.json", ta[key_a], tb[key_b], res.differences)
                    res.compared.append("problems.json (MLflow)")
        results.append(res)
    extra = sorted(set(a) ^ set(b))
    if extra:
        res = Outcome("(other)", [f"cell folders in one run only: {extra}"])
        results.append(res)
    return results


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", type=Path, help="the reference tree (e.g. a worktree of b38b3ea)")
    ap.add_argument("candidate", type=Path, help="the tree to check")
    ap.add_argument("--limit", type=int, default=4, help="problems per runner (default 4)")
    ap.add_argument("--keep", type=Path, help="run in this new folder and keep it (default: a temporary one, removed)")
    ap.add_argument(
        "--reuse", type=Path, metavar="DIR", help="compare the two sweeps a --keep DIR run left there again, without running them"
    )
    ap.add_argument(
        "--rename", action="append", default=[], metavar="OLD=NEW", help="the candidate spells setting OLD as NEW (repeatable)"
    )
    args = ap.parse_args(argv)
    trees = [args.base.resolve(), args.candidate.resolve()]
    for tree in trees:
        if not (tree / "apps_bench" / "__init__.py").is_file():
            print(f"record_identity: {tree} holds no apps_bench package; give a source tree", file=sys.stderr)
            return 2
    if args.limit < 1:
        print(f"record_identity: --limit {args.limit}: give at least 1 problem per runner", file=sys.stderr)
        return 2
    bad = [r for r in args.rename if r.count("=") != 1 or not all(r.split("="))]
    if bad:
        print(
            f"record_identity: --rename {bad[0]}: give OLD=NEW, e.g. model.wrong_fraction=model.gold.wrong_fraction",
            file=sys.stderr,
        )
        return 2
    if args.reuse is not None and not all((args.reuse / side / "outputs" / "cells").is_dir() for side in ("base", "candidate")):
        print(f"record_identity: --reuse {args.reuse}: no sweeps there (give a folder a --keep run filled)", file=sys.stderr)
        return 2
    if args.keep is not None and args.keep.exists():
        print(f"record_identity: --keep {args.keep} exists; give a new folder", file=sys.stderr)
        return 2
    renames = dict(r.split("=") for r in args.rename)
    topologies = runners(trees[0])
    if not topologies:
        print(f"record_identity: {trees[0]} has no runners (apps_bench/conf/topology/*.yaml)", file=sys.stderr)
        return 2
    if runners(trees[1]) != topologies:
        print(f"runners differ: base {topologies}, candidate {runners(trees[1])}; comparing the base's")
    if args.reuse is not None:
        return report(compare(args.reuse / "base", args.reuse / "candidate", topologies))
    work = args.keep.resolve() if args.keep else Path(tempfile.mkdtemp(prefix="record_identity-"))
    try:
        work.mkdir(parents=True, exist_ok=True)
        rows = work / "rows.jsonl"  # one path for both trees: dataset.path is part of the cell key
        shutil.copyfile(ROWS, rows)
        print(f"{len(topologies)} runners x {args.limit} problems on gold, base {trees[0]}, candidate {trees[1]}", flush=True)
        base_run = run_sweep(trees[0], work / "base", rows, topologies, args.limit, {})
        cand_run = run_sweep(trees[1], work / "candidate", rows, topologies, args.limit, renames)
        outcomes = compare(base_run, cand_run, topologies)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return report(outcomes)


def report(outcomes: list[Outcome]) -> int:
    """Per runner SAME or its first differences; -> the exit status (1: a difference)."""
    width = max(len(o.runner) for o in outcomes)
    for o in outcomes:
        if o.differences:
            print(f"{o.runner:<{width}}  DIFFERENT")
            for d in o.differences[:5]:
                print(f"{'':<{width}}    {d[:400]}")
        else:
            print(f"{o.runner:<{width}}  SAME ({', '.join(o.compared)})")
    n_diff = sum(bool(o.differences) for o in outcomes)
    print(
        f"{'all SAME' if not n_diff else f'{n_diff} runner(s) DIFFERENT'}; masked: timing {', '.join(TIMING)}; "
        f"scheduling {', '.join(SCHEDULING)} and the order concurrent agents finish in; counts.json's file stamp; "
        "provenance's git_sha, git_dirty"
    )
    return 1 if n_diff else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
