"""`python -m apps_bench.plan` on a half-finished sweep, through the real CLI: it names exactly the
finished, partial and new cells with their keys, the grid guard's verdict, estimates from finished
cells, and touches nothing: no model connection, no file written, no MLflow run."""

from __future__ import annotations

import json
import re
import socket
import threading
from pathlib import Path

import pytest
from conftest import cli_env, fresh_store, run_cli

pytestmark = pytest.mark.slow


class _Listener:
    """A loopback TCP port that counts the connections it is offered (a model endpoint nobody should call)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.stop = True
        self.thread.join()
        self.sock.close()


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_plan_on_a_half_finished_sweep(tmp_path: Path, mlflow_template: Path, apps_data_dir: Path):
    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")  # inside outputs/: the snapshot covers it
    env = cli_env(tmp_path)
    common = ["dataset=apps", f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}", "limit=4", "progress=false"]
    r = run_cli(["-m", "topology=single", "seed=0,1", *common], tmp_path, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    dirs = {json.loads((d / "cell.json").read_text())["axes"]["seed"]: d for d in (tmp_path / "outputs" / "cells").iterdir()}
    keys = {s: json.loads((d / "cell.json").read_text())["key"] for s, d in dirs.items()}
    lines = (dirs[1] / "records.jsonl").read_text().splitlines(keepends=True)
    (dirs[1] / "records.jsonl").write_text("".join(lines[:2]))  # seed 1 stopped after 2 of its 4 problems
    finished = [json.loads(x) for d in dirs.values() for x in (d / "records.jsonl").read_text().splitlines()]
    calls_pp = sum(x["usage"]["model_calls"] for x in finished) / len(finished)
    tokens_pp = sum(x["usage"]["total_tokens"] for x in finished) / len(finished)
    before = _snapshot(tmp_path / "outputs")

    model = _Listener()
    try:
        out = tmp_path / "plan.json"
        p = run_cli(
            [
                "-m",
                "topology=single,independent",
                "seed=0,1,7",
                *common,
                f"model.base_url=http://127.0.0.1:{model.port}/v1",
                "--json",
                str(out),
            ],
            tmp_path,
            env=env,
            module="apps_bench.plan",
        )
    finally:
        model.close()
    assert p.returncode == 2, p.stdout[-3000:] + p.stderr[-3000:]  # seed 7 is refused: a script must not go on
    assert "2 of 6 cells would be refused" in p.stderr
    assert model.accepted == 0  # no model was called
    assert _snapshot(tmp_path / "outputs") == before  # no record, folder or MLflow row written

    plan = json.loads(out.read_text())
    cells = {(c["axes"]["topology"], c["axes"]["seed"]): c for c in plan["cells"]}
    assert len(cells) == 6 and plan["n_cells"] == 6
    assert cells[("single", 0)]["key"] == keys[0] and cells[("single", 1)]["key"] == keys[1]
    assert cells[("single", 0)]["state"] == "done" and cells[("single", 0)]["n_recorded"] == 4
    s1 = cells[("single", 1)]
    assert (s1["state"], s1["n_recorded"], s1["n_selected"], s1["n_to_run"]) == ("partial", 2, 4, 2)
    assert s1["estimate"]["calls"] == pytest.approx(2 * calls_pp) and s1["estimate"]["tokens"] == pytest.approx(2 * tokens_pp)
    for seed in (0, 1):
        new = cells[("independent", seed)]
        assert (new["state"], new["n_to_run"], new["allowed"]) == ("new", 4, True)
        assert new["estimate"]["calls"] is None and "no finished cell of topology independent" in new["estimate"]["basis"]
    for topo in ("single", "independent"):
        refused = cells[(topo, 7)]
        assert not refused["allowed"] and "seed=7 is outside the experiment grid" in refused["guard"]
    assert plan["states"] == {"done": 1, "partial": 1, "new": 4, "unknown": 0, "invalid": 0}
    assert sorted(plan["blocked"]) == ["independent·gold·none·s7", "single·gold·none·s7"]
    assert plan["grid_guard"].startswith("refused")
    assert plan["estimated_model_calls"] == pytest.approx(2 * calls_pp)
    assert sorted(plan["cells_without_estimate"]) == ["independent·gold·none·s0", "independent·gold·none·s1"]

    table = p.stdout
    assert re.search(rf"^single·gold·none·s1\s+{keys[1]}\s+partial 2 of 4\s+2\s+allowed", table, re.M), table
    assert re.search(rf"^single·gold·none·s0\s+{keys[0]}\s+done\s+0\s+allowed", table, re.M), table
    assert re.search(r"^independent·gold·none·s7\s+\w+\s+new\s+4\s+REFUSED", table, re.M), table
    assert "REFUSED independent·gold·none·s7" in table and "no model is called" in table

    # the same without -m: one cell; an experiment's declared sweep expands like the real command
    one = run_cli([*common, "seed=1", "--json", "-"], tmp_path, env=env, module="apps_bench.plan")
    assert one.returncode == 0 and json.loads(one.stdout)["cells"][0]["key"] == keys[1]
    smoke = run_cli(["experiment=smoke", "--json", "-"], tmp_path, env=env, module="apps_bench.plan")
    assert sorted(c["axes"]["seed"] for c in json.loads(smoke.stdout)["cells"]) == [0, 1]
    bad = run_cli(["seed=0,1"], tmp_path, env=env, module="apps_bench.plan")
    assert bad.returncode == 2 and "--multirun" in bad.stderr


def test_plan_gates_a_script_on_invalid_settings_and_unreadable_data(tmp_path: Path, apps_data_dir: Path):
    """An invalid cell is never `done` and a cell whose data cannot be read is not runnable: exit 2,
    so `python -m apps_bench.plan ... && python -m apps_bench ...` stops where the command would."""
    env = cli_env(tmp_path)
    rows = f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}"
    bad = run_cli(["dataset=apps", rows, "limit=-1", "--json", "-"], tmp_path, env=env, module="apps_bench.plan")
    assert bad.returncode == 2, bad.stdout[-3000:] + bad.stderr[-3000:]
    [cell] = json.loads(bad.stdout)["cells"]
    assert cell["state"] == "invalid" and not cell["allowed"] and "limit" in cell["guard"]
    assert cell["n_selected"] is None and cell["n_to_run"] is None

    gone = run_cli(
        ["dataset=apps", f"dataset.path={tmp_path / 'no_such_rows.jsonl'}", "limit=3"],
        tmp_path,
        env=env,
        module="apps_bench.plan",
    )
    assert gone.returncode == 2, gone.stdout[-3000:] + gone.stderr[-3000:]
    assert "dataset not readable here" in gone.stdout and "cannot read their data" in gone.stderr

    ok = run_cli(["dataset=apps", rows, "limit=3"], tmp_path, env=env, module="apps_bench.plan")
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]
    assert not (tmp_path / "outputs").exists()  # a plan writes nothing


def test_plan_estimates_from_the_cells_seed_replicates_not_from_cells_differing_in_a_setting(
    tmp_path: Path, mlflow_template: Path, apps_data_dir: Path
):
    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    env = cli_env(tmp_path)
    common = [
        "topology=independent",
        "dataset=apps",
        f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}",
        "limit=2",
        "progress=false",
    ]
    r = run_cli(["-m", "topology.team_size=2,4", "seed=0", *common], tmp_path, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    calls: dict[int, list[int]] = {}
    for d in (tmp_path / "outputs" / "cells").iterdir():
        size = json.loads((d / "cell.json").read_text())["identity"]["topology"]["team_size"]
        calls[size] = [json.loads(x)["usage"]["model_calls"] for x in (d / "records.jsonl").read_text().splitlines()]
    assert sum(calls[4]) != sum(calls[2])  # the pooled figure would be neither cell's

    def plan_of(*extra: str) -> dict:
        out = tmp_path / f"plan{len(list(tmp_path.glob('plan*.json')))}.json"
        p = run_cli(["seed=1", *common, *extra, "--json", str(out)], tmp_path, env=env, module="apps_bench.plan")
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        [cell] = json.loads(out.read_text())["cells"]
        return cell["estimate"]

    est = plan_of("topology.team_size=4")
    assert est["calls_per_problem"] == pytest.approx(sum(calls[4]) / len(calls[4]))
    assert est["basis"].startswith("1 finished seed replicate(s) of this cell"), est
    est = plan_of("topology.team_size=8")  # no replicate: the topology and model's cells, and it says so
    assert est["calls_per_problem"] == pytest.approx((sum(calls[2]) + sum(calls[4])) / (len(calls[2]) + len(calls[4])))
    assert "settings may differ" in est["basis"], est
