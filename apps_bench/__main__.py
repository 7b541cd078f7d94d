"""`python -m apps_bench` / `apps-bench`: the Hydra entrypoint that runs one cell (or a sweep with -m).

Nothing heavy is imported at module level (`--help` stays under a second): the pipeline,
frameworks and MLflow load only when a cell runs. Config comes from the package's own
`conf/` (an absolute path), so the command works from any directory; outputs go under
that directory's `outputs/`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

CONF_DIR = str(Path(__file__).resolve().parent / "conf")

# the seed runner's flags -> the override that replaces each
SEED_FLAGS: dict[str, str] = {
    "--batch": "dataset=apps",
    "--limit": "limit=N",
    "--offset": "offset=N",
    "--only": "only=[ID,ID,...]",
    "--out-dir": "out_dir=PATH",
    "--out": "out_dir=PATH",
    "--max-tests-per-row": "max_tests_per_row=N",
    "--allow-any-cell": "allow_any_cell=true",
    "--seed": "seed=N",
    "--verbose": "verbose=true",
}


def _refuse_seed_flags(argv: list[str]) -> None:
    """The seed's argparse flags are Hydra overrides here: say which one, instead of Hydra's generic error."""
    bad = [a.split("=", 1)[0] for a in argv if a.split("=", 1)[0] in SEED_FLAGS]
    if bad:
        lines = [f"  {flag:<22} ->  {SEED_FLAGS[flag]}" for flag in dict.fromkeys(bad)]
        sys.stderr.write(
            "apps-bench takes Hydra overrides, not flags. Use:\n" + "\n".join(lines) + "\n"
            "e.g. python -m apps_bench dataset=apps limit=50 out_dir=results/single\n"
        )
        raise SystemExit(2)


def _task(cfg: Any) -> Any:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from apps_bench.cell import CellRefused
    from apps_bench.pipeline import CellSetupError, run_cell
    from apps_bench.tracking.records import CellDirConflict

    try:
        multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:
        multirun = False
    try:
        result = run_cell(cfg)
    except (CellRefused, CellSetupError, CellDirConflict) as exc:
        if multirun:  # fail this cell only; the sweep goes on and reports it
            raise
        sys.stdout.flush()
        sys.stderr.write(f"apps-bench: {exc}\n")
        raise SystemExit(2) from None
    if not multirun and not result.complete:
        raise SystemExit(3)  # recorded, but with errors to retry: scripts must see it
    return result.summary.get("pass_at_1")


def main() -> None:
    _refuse_seed_flags(sys.argv[1:])
    import hydra

    from apps_bench.config import register_configs

    register_configs()
    hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")(_task)()


if __name__ == "__main__":
    main()
