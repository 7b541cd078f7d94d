"""`python -m apps_bench.rescore`: a real cell (gold model, real APPS rows, real CLI, real SQLite
MLflow store) re-judged under profile `reference` with all tests, finished and interrupted,
with no model call; the old verdicts untouched; the MLflow child run readable like a cell's."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import APPS_DATA_DIR, cli_env, fresh_store, run_cli

from apps_bench.config.schema import JudgeConfig, typed

DATA = APPS_DATA_DIR / "train_mini150.jsonl"
CELL_ARGS = [
    "dataset=apps",
    f"dataset.path={DATA}",
    "dataset.split=train",
    "offset=36",
    "limit=8",
    "model=gold",
    "progress=false",
]
# An import hook that fails the command if re-scoring reached for a model or an agent runner, or composed a
# cell (Hydra: its import and a composition cost ~0.2 s; re-scoring reads conf/judge and conf/tracking files).
NO_MODELS = (
    "import sys\n"
    "class Refuse:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[:2] in (['apps_bench', 'models'], ['apps_bench', 'topologies']) or name == 'apps_bench.cell.solving' "
    "or name.split('.')[0] in ('openai', 'httpx', 'langgraph', 'crewai', 'autogen_agentchat', 'agents', 'hydra'):\n"
    "            raise ImportError(f're-scoring imported {name}')\n"
    "sys.meta_path.insert(0, Refuse())\n"
    "from apps_bench.rescore import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def rescore(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # no endpoint exists during re-scoring: a model call could only fail
    env = cli_env(cwd, OPENAI_BASE_URL="http://127.0.0.1:9/v1", VLLM_BASE_URL="http://127.0.0.1:9/v1")
    return subprocess.run(
        [sys.executable, "-c", NO_MODELS, *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, mlflow_template) -> Path:
    d = tmp_path_factory.mktemp("rescore")
    fresh_store(mlflow_template, d / "outputs" / "mlflow.db")
    proc = run_cli(CELL_ARGS, d)
    assert proc.returncode == 0, proc.stderr
    return d


@pytest.fixture(scope="module")
def cell_dir(workdir) -> Path:
    (found,) = (workdir / "outputs" / "cells").glob("apps-single-gold-none-s0-*")
    return found


def mlflow_client(workdir: Path):
    from apps_bench.tracking import mlflow as mlf

    return mlf.client(f"sqlite:///{workdir / 'outputs' / 'mlflow.db'}")


def test_finished_cell_is_rescored_beside_its_records_and_logged_as_a_child_run(workdir, cell_dir) -> None:
    from apps_bench.types import RECORD_SCHEMA, ProblemRecord

    before = {f.name: sha(f) for f in cell_dir.iterdir() if f.is_file()}
    proc = rescore([str(cell_dir), "judge=reference", "max_tests_per_row=0"], workdir)
    assert proc.returncode == 0, proc.stderr
    assert {f.name: sha(f) for f in cell_dir.iterdir() if f.is_file()} == before  # never overwritten

    (out,) = (cell_dir / "rescore").iterdir()
    assert out.name.startswith("reference-max0-")
    new_key = out.name.rsplit("-", 1)[1]
    old = {r["key"]: r for r in lines(cell_dir / "records.jsonl")}
    new = {r["key"]: r for r in lines(out / "records.jsonl")}
    assert new.keys() == old.keys() and len(new) == 8
    for k, r in new.items():
        assert r["program"] == old[k]["program"] and r["usage"] == old[k]["usage"]  # the same answers, not regenerated
        assert r["verdict"]["profile"] == "reference" and old[k]["verdict"]["profile"] == "seed"
        assert isinstance(r["verdict"]["reference_results"], list)
        assert r["verdict"]["n_tests"] >= old[k]["verdict"]["n_tests"]  # all tests now
        assert r["rescore_of"]["cell"] == old[k]["cell"] and r["cell"] == new_key
        assert ProblemRecord.from_json(r).to_json() == r and r["schema"] == RECORD_SCHEMA  # a record, as the cell's are
    summary = json.loads((out / "summary.json").read_text())
    assert summary["profile"] == "reference" and summary["complete"] is True and summary["n_problems"] == 8
    assert summary["n_passed"] == sum(r["passed"] for r in new.values())
    assert json.loads((out / "cell.json").read_text())["key"] == new_key

    c = mlflow_client(workdir)
    cell_run = c.search_runs([c.get_experiment_by_name("apps").experiment_id], filter_string="tags.run_kind = 'rescore'")
    (run,) = cell_run
    (parent,) = [r for r in c.search_runs([run.info.experiment_id]) if r.data.tags.get("cell_key") == old[k]["cell"]]
    tags = run.data.tags
    assert tags["mlflow.parentRunId"] == parent.info.run_id == tags["rescore_of"]
    assert {a: tags[a] for a in ("dataset", "topology", "model", "optimizer", "seed")} == {
        a: parent.data.tags[a] for a in ("dataset", "topology", "model", "optimizer", "seed")
    }
    assert (tags["judge_profile"], tags["max_tests_per_row"], tags["cell_key"], tags["complete"]) == (
        "reference",
        "0",
        new_key,
        "true",
    )
    assert tags["prov.sandbox.nice"] == str(os.nice(0)) and tags["prov.sandbox"].endswith(f"nice={os.nice(0)}")
    assert run.data.metrics["pass_at_1"] == pytest.approx(summary["pass_at_1"])
    assert run.info.status == "FINISHED"
    assert summary["mlflow"] == {"run_id": run.info.run_id, "parent_run_id": parent.info.run_id}

    # the key is the one a cell run with those settings gets, and that cell does not continue the re-scoring run
    proc = run_cli([*CELL_ARGS, "judge=reference", "max_tests_per_row=0"], workdir)
    assert proc.returncode == 0, proc.stderr
    real = workdir / "outputs" / "cells" / f"apps-single-gold-none-s0-{new_key}"
    assert real.is_dir()
    real_verdicts = {r["key"]: (r["passed"], r["verdict"]["reference_results"]) for r in lines(real / "records.jsonl")}
    assert real_verdicts == {k: (r["passed"], r["verdict"]["reference_results"]) for k, r in new.items()}
    runs = c.search_runs([run.info.experiment_id], filter_string=f"tags.cell_key = '{new_key}'")
    assert len(runs) == 2 and {r.data.tags.get("run_kind") for r in runs} == {"rescore", None}

    # a rerun resumes: nothing judged again
    proc = rescore([str(cell_dir), "judge=reference", "max_tests_per_row=0"], workdir)
    assert proc.returncode == 0, proc.stderr
    assert "8 already re-scored, 0 to judge" in proc.stderr
    assert [r["completed_at"] for r in lines(out / "records.jsonl")] == [r["completed_at"] for r in new.values()]


def test_interrupted_cell_is_rescored_on_what_it_recorded(workdir, cell_dir, tmp_path) -> None:
    # what kill -9 leaves: the first problems' records (one torn line after them), no summary yet
    cut = workdir / "outputs" / "cells" / "interrupted"
    shutil.copytree(cell_dir, cut, ignore=shutil.ignore_patterns("rescore", "summary.json"))
    recs = (cell_dir / "records.jsonl").read_text().splitlines()
    (cut / "records.jsonl").write_text("\n".join(recs[:3]) + "\n" + recs[3][:40])
    proc = rescore([str(cut), "judge=reference", "--no-mlflow"], workdir)
    assert proc.returncode == 3, proc.stderr  # incomplete, as the cell
    (out,) = (cut / "rescore").iterdir()
    new = lines(out / "records.jsonl")
    assert sorted(r["key"] for r in new) == sorted(json.loads(x)["key"] for x in recs[:3])
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["n_selected"], summary["n_recorded"], summary["n_missing"], summary["complete"]) == (8, 3, 5, False)
    assert "INCOMPLETE" in proc.stdout


def test_rescore_by_run_id(workdir, cell_dir) -> None:
    c = mlflow_client(workdir)
    key = json.loads((cell_dir / "cell.json").read_text())["key"]
    (run,) = [
        r for r in c.search_runs([c.get_experiment_by_name("apps").experiment_id], filter_string=f"tags.cell_key = '{key}'")
    ]
    proc = rescore([run.info.run_id, "max_tests_per_row=0", "--no-mlflow"], workdir)
    assert proc.returncode == 0, proc.stderr
    assert any(d.name.startswith("seed-max0-") for d in (cell_dir / "rescore").iterdir())


@pytest.mark.parametrize(
    "make,args,message",
    [
        (lambda d: d, [], "is not a cell folder: it has no cell.json or config.yaml"),
        (lambda d: d / "missing-folder", [], "neither a folder nor an MLflow run id"),
        (None, ["model=qwen"], "model cannot be re-scored"),
        (None, ["judge=nonesuch"], "no judge profile 'nonesuch'"),
        (None, [], "nothing to re-score"),
        (None, ["max_tests_per_row=all"], "max_tests_per_row must be an integer"),
        (None, ["judge.timeout_s=fast"], "bad judge setting"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(workdir, cell_dir, tmp_path, make, args, message) -> None:
    source = make(tmp_path) if make else cell_dir
    proc = rescore([str(source), *args, "--no-mlflow"], workdir)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr


def test_a_cell_with_a_record_from_a_newer_schema_is_refused_naming_the_versions(workdir, cell_dir) -> None:
    from apps_bench.types import RECORD_SCHEMA

    newer = workdir / "outputs" / "cells" / "newer-records"
    shutil.copytree(cell_dir, newer, ignore=shutil.ignore_patterns("rescore"))
    [first, *rest] = lines(cell_dir / "records.jsonl")
    (newer / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [{**first, "schema": RECORD_SCHEMA + 1}, *rest]))
    proc = rescore([str(newer), "judge=reference", "--no-mlflow"], workdir)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"is records schema version {RECORD_SCHEMA + 1}; this apps-bench reads versions 1 to {RECORD_SCHEMA}" in proc.stderr
    assert not (newer / "rescore").exists()  # refused before anything is written


def test_a_sandbox_limit_is_rescored_like_any_judge_setting(workdir, cell_dir) -> None:
    """judge.sandbox.<limit> (a dotted judge setting) re-judges the programs under the new limit."""
    proc = rescore([str(cell_dir), "judge.sandbox.output_cap_bytes=1", "--no-mlflow"], workdir)
    assert proc.returncode == 0, proc.stderr
    (out,) = [
        d
        for d in (cell_dir / "rescore").iterdir()
        if (d / "config.yaml").is_file() and "output_cap_bytes: 1\n" in (d / "config.yaml").read_text()
    ]
    new = lines(out / "records.jsonl")
    assert len(new) == 8 and not any(r["passed"] for r in new)
    assert all(r["verdict"]["results"][0]["outcome"] == "output_limit" for r in new if not r.get("error"))
    assert json.loads((out / "cell.json").read_text())["identity"]["judge"]["sandbox"]["output_cap_bytes"] == 1
    feats = json.loads((out / "summary.json").read_text())["provenance"]["sandbox"]  # what the new verdicts ran on
    assert feats["nice"] == os.nice(0) and feats["workers"] >= 1


def test_a_cell_recorded_before_the_sandbox_limits_were_config_is_told_how_to_rescore(workdir, cell_dir, tmp_path) -> None:
    import yaml

    old = workdir / "outputs" / "cells" / "before-limits"
    shutil.copytree(cell_dir, old, ignore=shutil.ignore_patterns("rescore"))
    cfg = yaml.safe_load((old / "config.yaml").read_text())
    del cfg["judge"]["sandbox"]
    (old / "config.yaml").write_text(yaml.safe_dump(cfg))
    from apps_bench.cell.key import cell_key, identity_of

    info = json.loads((old / "cell.json").read_text())
    (old / "cell.json").write_text(json.dumps({**info, "key": cell_key(identity_of(cfg))}))  # the key it had then
    proc = rescore([str(old), "max_tests_per_row=0", "--no-mlflow"], workdir)
    assert proc.returncode == 2 and "judge.sandbox" in proc.stderr and "pass judge=seed" in proc.stderr, proc.stderr
    proc = rescore([str(old), "judge=seed", "--no-mlflow"], workdir)
    assert proc.returncode == 0, proc.stderr


def test_a_cell_recorded_before_profiles_named_their_rules_is_rescored_by_its_profile_s_class(workdir, cell_dir) -> None:
    """Older config.yaml files have no judge._target_: the profile's file names the class, and the key is
    the one the same re-scoring of a newer cell gets (the class is not in it)."""
    import yaml

    old = workdir / "outputs" / "cells" / "before-targets"
    shutil.copytree(cell_dir, old, ignore=shutil.ignore_patterns("rescore"))
    cfg = yaml.safe_load((old / "config.yaml").read_text())
    assert cfg["judge"].pop("_target_") == "apps_bench.judge.rules.SeedRules"
    (old / "config.yaml").write_text(yaml.safe_dump(cfg))
    for d in (old, cell_dir):
        proc = rescore([str(d), "judge.timeout_s=5", "--no-mlflow"], workdir)
        assert proc.returncode == 0, proc.stderr
    (new,) = (old / "rescore").iterdir()
    (same,) = [d for d in (cell_dir / "rescore").iterdir() if d.name == new.name]  # one key for both
    assert yaml.safe_load((new / "config.yaml").read_text())["judge"]["_target_"] == "apps_bench.judge.rules.SeedRules"
    got = {r["key"]: (r["passed"], r["verdict"]["profile"], r["verdict"]["tests_run"]) for r in lines(new / "records.jsonl")}
    assert len(got) == 8 and got == {
        r["key"]: (r["passed"], r["verdict"]["profile"], r["verdict"]["tests_run"]) for r in lines(same / "records.jsonl")
    }


def test_a_judge_crash_while_re_scoring_is_that_record_s_error_not_the_command_s(tmp_path: Path):
    """The one rule of cell/step.py's judging (judge.core.judge_program) holds in re-scoring too: a judge that
    crashes on one program makes that record an infrastructure error; the other records are re-scored."""
    from conftest import compose_cell

    from apps_bench.data import load_problems
    from apps_bench.judge import Judge
    from apps_bench.rescore import judge_records
    from apps_bench.sandbox import SandboxPool
    from apps_bench.tracking.records import RecordStore, record_key
    from apps_bench.types import Problem, ProblemRecord, UsageRecord, Verdict

    [good, bad] = load_problems(
        compose_cell("dataset=apps_train", f"dataset.path={APPS_DATA_DIR / 'train_mini150.jsonl'}").dataset,
        only=("1", "9"),
        max_tests_per_row=3,
    ).problems
    crash_on = bad.id

    class CrashingJudge(Judge):
        def score(self, problem: Problem, program: str | None) -> Verdict:
            if problem.id == crash_on:
                raise RuntimeError("comparison blew up")
            return super().score(problem, program)

    (tmp_path / "cell").mkdir()
    store = RecordStore(tmp_path / "cell")
    key = {p.id: record_key(p.split, p.id) for p in (good, bad)}
    todo = [
        ProblemRecord(
            key=key[p.id],
            id=p.id,
            split=p.split,
            difficulty=p.difficulty,
            mode=p.tests.mode,
            cell="old",
            program=p.solutions[0],
            extracted=True,
            passed=True,
            verdict=None,
            usage=UsageRecord(),
            tool_calls_by_role={},
            latency_s=0.0,
            solve_s=0.0,
            judge_s=0.0,
            solver="main",
            error=None,
            stop_reason="done",
        )
        for p in (good, bad)
    ]
    judge_cfg = typed(JudgeConfig, compose_cell().judge)
    with SandboxPool.from_config(judge_cfg, workers=1) as pool:
        judge = CrashingJudge.from_config(pool, judge_cfg)  # the cell's judge settings, this one crashing on `bad`
        judge_records(
            store,
            todo,
            {key[p.id]: p for p in (good, bad)},
            judge,
            workers=2,
            new_key="new",
            old_key="old",
            old_cap=None,
            progress=False,
        )
    got = {r["key"]: r for r in lines(tmp_path / "cell" / "records.jsonl")}
    assert {k: ProblemRecord.from_json(r).to_json() for k, r in got.items()} == got  # what rescore writes is a record
    assert got[key[good.id]]["passed"] is True and not got[key[good.id]].get("error")
    assert got[key[bad.id]]["passed"] is False
    assert got[key[bad.id]]["error"] == "judge RuntimeError: comparison blew up (while re-scoring)"
    assert got[key[bad.id]]["rescore_of"] == {"cell": "old", "passed": True}
