"""`python -m apps_bench` / `apps-bench`: the Hydra entrypoint that runs one cell (or a sweep with -m).

Nothing heavy is imported at module level (`--help` stays under a second): the pipeline,
frameworks and MLflow load only when a cell runs. Config comes from the package's own
`conf/` (an absolute path), so the command works from any directory; outputs go under
that directory's `outputs/`.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, NoReturn

from apps_bench.cell.pipeline import CellResult, evaluate, prepare
from apps_bench.config.overrides import check_overrides, config_dirs_of, with_range_problems
from apps_bench.config.schema import CONF_DIR, Config, ConfigDirMissing, config_dirs, name_options, register_configs
from apps_bench.config.validate import InvalidSettings, typed_cell
from apps_bench.errors import AppsBenchError
from apps_bench.optimizers.optimizer_cell import check_optimizer_cell, run_optimizer_cell
from apps_bench.tracking import faults
from apps_bench.tracking import mlflow as mlf
from apps_bench.tracking.sqlite_store import StoreError

if TYPE_CHECKING:
    from omegaconf import DictConfig

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
    # the seed's optimizer command (`python -m optimizers.protocol.run ...`; `python -m apps_bench.optimize` takes it as is)
    "--method": "optimizer=NAME (none, maspo, gepa)",
    "--dataset": "dataset=NAME",
    "--topology": "topology=NAME (seed's `sequential`: sequential_langgraph or sequential_crewai)",
    "--model": "model=NAME",
}


HELP = """\
apps-bench: the APPS coding benchmark against multi-agent LLM systems, one grid cell per run.
A cell = dataset x topology x model x optimizer x seed (+ settings); everything is a Hydra override.

Usage:
  python -m apps_bench [OVERRIDE ...]            run one cell (no overrides: the 2 demo problems, gold model)
  python -m apps_bench -m [OVERRIDE ...]         a sweep, e.g. topology=single,independent seed=0,1,2
  python -m apps_bench --cfg job [OVERRIDE ...]  print the composed cell config
  python -m apps_bench --config-dir DIR model=X  presets of your own (DIR/<group>/<name>.yaml), searched before conf/
  python -m apps_bench --hydra-help              Hydra's own options
  python -m apps_bench.report [--compare baseline=single]  pass@1 with 95% intervals, paired comparisons, cost
  python -m apps_bench.plan [-m] [OVERRIDE ...]  what that command would do (cells, state, grid, cost), no model call
  python -m apps_bench.optimize --method M ...   the seed's optimizer command, translated to overrides

Examples:
  python -m apps_bench dataset=apps limit=50 model=qwen topology=sequential_langgraph
  python -m apps_bench dataset=apps dataset.path=/data/apps/test.jsonl limit=50
  python -m apps_bench -m hydra/launcher=local_parallel model=qwen seed=0,1,2
  python -m apps_bench experiment=smoke

Config groups (conf/ in the package):
{groups}
Run options (top level): seed, limit (the first N rows after offset; a row that cannot be used still counts,
  so limit=50 on the test split is the 50 eval IDs, and each skipped row is named), offset, only=[ids], difficulty,
  max_tests_per_row (20; <=0 keeps all),
  concurrency (64), processes (auto), allow_any_cell (false), out_dir, verbose, progress, tool.timeout_s, tool.output_chars,
  tracking.experiment (MLflow experiment, default apps)

Seed flags -> overrides:
{flags}

Cells outside conf/grid are refused (allow_any_cell=true runs them anyway).
Outputs: ./outputs/cells/<cell>-<key>/ (records.jsonl, summary.json, config.yaml, transcripts.jsonl)
MLflow:  $MLFLOW_TRACKING_URI, else sqlite ./outputs/mlflow.db
"""


def _print_help() -> None:
    """Fast help (Hydra's own --help composes every group option: seconds, not milliseconds)."""
    conf = Path(CONF_DIR)
    lines = []
    for group in sorted(p for p in conf.iterdir() if p.is_dir() and p.name != "hydra"):
        opts = sorted(f.stem for f in group.glob("*.yaml"))
        lines.append(f"  {group.name + ':':<12} {', '.join(opts)}")
    launchers = sorted(f.stem for f in (conf / "hydra" / "launcher").glob("*.yaml"))
    lines.append(f"  {'hydra/launcher:':<12} {', '.join(launchers)} (+ the installed plugins' own)")
    flags = "\n".join(f"  {k:<22} {v}" for k, v in SEED_FLAGS.items())
    sys.stdout.write(HELP.format(groups="\n".join(lines), flags=flags))


def _refuse_seed_flags(argv: list[str]) -> None:
    """The seed's argparse flags are Hydra overrides here: say which one, instead of Hydra's generic error."""
    bad = [a.split("=", 1)[0] for a in argv if a.split("=", 1)[0] in SEED_FLAGS]
    if bad:
        lines = [f"  {flag:<22} ->  {SEED_FLAGS[flag]}" for flag in dict.fromkeys(bad)]
        sys.stderr.write(
            "apps-bench takes Hydra overrides, not flags. Use:\n" + "\n".join(lines) + "\n"
            "e.g. python -m apps_bench dataset=apps limit=50 out_dir=results/single\n"
            "The seed's optimizer command, flags and all: python -m apps_bench.optimize --method maspo ... (see its --help)\n"
        )
        raise SystemExit(2)


def _refuse_bad_overrides(argv: list[str]) -> None:
    """A misspelt option or setting, or a value of the wrong type, answered like every other bad
    setting (exit 2, the fix) before Hydra composes anything or makes its output folder."""
    bad = check_overrides(argv)
    if bad:
        sys.stderr.write(f"apps-bench: {InvalidSettings(with_range_problems(bad, argv))}\n")
        raise SystemExit(2)


@contextmanager
def command_config_dir(argv: list[str]) -> Iterator[None]:
    """The command's `--config-dir`, searched before the package's conf/ while it runs (config.config_dirs);
    a folder that does not exist is refused (exit 2)."""
    try:
        with config_dirs(config_dirs_of(argv)):
            yield
    except ConfigDirMissing as exc:
        sys.stderr.write(f"apps-bench: {exc}\n")
        raise SystemExit(2) from None


def _enter_sweep(config: Config, multirun: bool, launch_dir: str = "") -> None:
    """A cell works where the command was launched, whatever folder Hydra gave the job
    (`hydra.job.chdir=true`) or a sweep's worker started in (a Ray worker starts in the `ray start`
    directory), and a sweep's cell stops before it runs if it did not receive the sweep's tracking settings."""
    import os

    from apps_bench.tracking.callbacks import ROOT_ENV

    root = os.environ.get(ROOT_ENV, "") if multirun else ""
    root = root if root and Path(root).is_dir() else launch_dir
    if root and Path(root).is_dir():
        os.chdir(root)  # relative paths, outputs/ and the default store: the launching command's (Hydra goes back after the job)
    if config.tracking.backend == "none":
        return

    problem = mlf.sweep_settings_problem(multirun)
    if problem:
        raise mlf.SweepSettingsMissing(problem)


def run_cell(config: Config) -> CellResult:
    """Run (or resume) one cell: a plain one (cell/pipeline.py) or an optimizer cell, which optimizes
    its prompts first, then evaluates them on the same engine (optimizers/optimizer_cell.py). The cell's
    folder is locked from `prepare` until its run is finished (one writer per cell)."""
    optimized = config.optimizer.name != "none"
    prep = prepare(config, check=check_optimizer_cell if optimized else None)
    try:
        if optimized:
            return run_optimizer_cell(prep)
        return evaluate(prep)
    finally:
        prep.store.release()


def _task(cfg: DictConfig) -> float | None:
    """The Hydra job: the composed cell is typed once (validate.typed_cell); everything after reads the typed config."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    try:
        job = HydraConfig.get()
    except ValueError:
        job = None
    multirun = job is not None and job.mode == RunMode.MULTIRUN
    faults.quiet_log_files()
    if job is not None:
        name_options(cfg, job.runtime.choices)  # the cell is named by the options selected
    try:
        config = typed_cell(cfg)
        _enter_sweep(config, multirun, str(job.runtime.cwd) if job is not None else "")
        result = run_cell(config)
    except mlf.LoggingPending as exc:  # the cell is done and its records safe: only its MLflow run waits
        faults.say("apps-bench", faults.Fault(str(exc), ""), "", exc)
        if multirun:  # not a failed cell: the sweep goes on, and its end says what the rerun logs
            return None
        raise SystemExit(faults.EXIT_FAILED) from None
    except StoreError as exc:  # the store unreachable or lost: its message says what is safe and the fix
        if multirun:  # the fix, when the store's message (a start's: "Start it ...") does not say the rerun
            fix = "" if "rerun" in str(exc) else "Once the store answers again, rerun the same command."
            _stop_sweep(faults.Fault(str(exc), fix), "", exc, store_lost=True)
        _forget_run_dir()
        faults.say("apps-bench", faults.Fault(str(exc), ""), "")
        raise SystemExit(faults.EXIT_FAILED) from None
    except Exception as exc:
        fault = faults.fault_of(exc)  # a full disk, a read-only folder (whatever class carries it)
        if fault is None and isinstance(exc, AppsBenchError):  # refused, set up wrong, or the folder taken
            if multirun:  # fail this cell only; the sweep goes on and reports it
                raise
            _forget_run_dir()
            sys.stdout.flush()
            sys.stderr.write(f"apps-bench: {exc}\n")
            raise SystemExit(2) from None
        if fault is None:
            raise
        safe = faults.CELL_RECORDS_SAFE
        if multirun:
            _stop_sweep(fault, safe, exc, store_lost=False)
        _forget_run_dir()
        faults.say("apps-bench", fault, safe, exc)
        raise SystemExit(fault.code) from None
    if not multirun and not result.complete:
        raise SystemExit(3)  # recorded, but with errors to retry: scripts must see it
    return result.summary.get("pass_at_1")


def _stop_sweep(fault: faults.Fault, safe: str, exc: BaseException, *, store_lost: bool) -> NoReturn:
    """A sweep's cell whose surroundings failed stops the sweep (the next cells would fail the same way): its
    line said once, here; `faults.SweepStopped` carries it out of Hydra's launcher, whichever process ran the
    cell, to the launching process (`_run`), which ends the parent run as `callbacks.stop_sweep` says."""
    safe = f"{safe} {faults.SWEEP_STOPS}".strip()
    faults.say("apps-bench", fault, safe, exc)
    raise faults.SweepStopped(fault.line(safe), store_lost, fault.code) from None


def main() -> None:
    args = sys.argv[1:]
    if any(a in ("--help", "-h") for a in args):
        _print_help()
        return
    _refuse_seed_flags(args)
    with command_config_dir(args):
        _run(args)


def _run(args: list[str]) -> None:
    _refuse_bad_overrides(args)
    _refuse_unwritable_outputs(args)
    import hydra

    register_configs()
    try:
        hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")(_task)()
    except faults.SweepStopped as exc:  # said by the cell, in this process or a launcher's worker
        from apps_bench.tracking.callbacks import stop_sweep

        stop_sweep(exc.line, store_lost=exc.store_lost)
        raise SystemExit(exc.code) from None
    except KeyboardInterrupt:
        sys.stdout.flush()
        sys.stderr.write(
            "\napps-bench: interrupted. Every problem recorded so far is kept; rerun the same command to finish the rest.\n"
        )
        raise SystemExit(130) from None
    finally:
        from apps_bench.tracking.callbacks import end_unfinished_sweep

        end_unfinished_sweep()


def _refuse_unwritable_outputs(argv: list[str]) -> None:
    """Hydra's run folder goes under ./outputs/ (conf/config.yaml `hydra.run.dir`, `hydra.sweep.dir`): a folder
    this process cannot write is said in one line before Hydra fails on it with a chain of tracebacks."""
    if any(a.lstrip("+").startswith(("hydra.run.dir=", "hydra.sweep.dir=")) for a in argv):
        return
    if any(a in ("--cfg", "-c", "--info", "-i", "--hydra-help", "--shell-completion", "-sc") for a in argv):
        return  # prints, runs nothing
    why = faults.unwritable(Path("outputs"))
    if why:
        sys.stderr.write(
            f"apps-bench: cannot write outputs/ in {Path.cwd()}: {why}; nothing was run. Run from a folder "
            "this user can write (every path in the command may be absolute).\n"
        )
        raise SystemExit(faults.EXIT_FAILED)


def _forget_run_dir() -> None:
    """A refused command leaves nothing behind: drop the run folder Hydra made for it
    (only its own bookkeeping: the composed config and the job log)."""
    import shutil

    from hydra.core.hydra_config import HydraConfig

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= {".hydra", "apps_bench.log"}:
        shutil.rmtree(run_dir, ignore_errors=True)
        cwd = Path.cwd().resolve()
        for parent in run_dir.resolve().parents:  # outputs/hydra/<date>/, outputs/: when Hydra made them for this run
            if parent == cwd or cwd not in parent.parents:
                break
            try:
                parent.rmdir()  # only an empty folder
            except OSError:
                break


if __name__ == "__main__":
    main()
