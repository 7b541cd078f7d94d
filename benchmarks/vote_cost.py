#!/usr/bin/env python
"""CPU per vote of an independent or decentralized team (`topologies/vote.most_common_program`): four
agents' programs, each the first reference solution of a train_mini150 row, once as four identical
texts (what agents given the same prompt often write, and what gold returns) and once as four texts
that differ by a line (each normalised on its own). Mean over the rows, CPU time of this process.

Usage (from anywhere):
  python benchmarks/vote_cost.py [--rows FILE] [--n 100] [--agents 4]
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

from apps_bench.topologies.vote import most_common_program
from apps_bench.types import Candidate

DEFAULT_ROWS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "apps" / "train_mini150.jsonl"


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rows", type=Path, default=DEFAULT_ROWS)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--agents", type=int, default=4)
    args = ap.parse_args()
    warnings.simplefilter("ignore", SyntaxWarning)  # some reference solutions have "1if" and the like
    rows = [json.loads(line) for line in args.rows.read_text().splitlines() if line.strip()]
    solutions = (json.loads(r["solutions"]) if r.get("solutions") else [] for r in rows)
    programs = [s[0] for s in solutions if s][: args.n]
    cases = {"identical": lambda p, i: p, "different": lambda p, i: f"{p}\n# agent {i}\nx_{i} = {i}\n"}
    print(f"{len(programs)} votes of {args.agents} programs (mean {sum(map(len, programs)) / len(programs):.0f} characters)")
    for name, text in cases.items():
        t0 = time.process_time()
        for p in programs:
            most_common_program([Candidate(f"agent{i}", text(p, i)) for i in range(args.agents)])
        print(f"  {name:<10} {(time.process_time() - t0) / len(programs) * 1000:6.2f} ms of CPU per vote")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
