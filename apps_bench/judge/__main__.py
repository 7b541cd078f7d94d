"""`python -m apps_bench.judge ROWS --predictions PRED.jsonl --out VERDICTS.jsonl` (see cli.py)."""

import os
import sys

from apps_bench.judge.cli import main

if __name__ == "__main__":
    rc = main()
    # Everything is written, closed and the sandbox is shut down by now: skip the
    # interpreter's teardown (freeing every object of every module: ~0.1 s).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
