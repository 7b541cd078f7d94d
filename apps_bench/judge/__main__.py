"""`python -m apps_bench.judge ROWS --predictions PRED.jsonl --out VERDICTS.jsonl` (see cli.py)."""

import sys

from apps_bench.judge.cli import main

if __name__ == "__main__":
    sys.exit(main())
