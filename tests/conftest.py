"""Shared fixtures: where the real APPS rows live, and a scratch environment for frameworks."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
# The suite's own real APPS rows (MIT; tests/fixtures/apps/SOURCE.md says where they came from):
# train_mini150.jsonl, test_more.jsonl, test_0-49_partial.jsonl. Vendored, so no test skips on a fresh clone.
APPS_DATA_DIR = Path(__file__).resolve().parent / "fixtures" / "apps"


# Under `pytest -n N --dist loadgroup` (docs/contributing.md "Parallel workers"), tests that share one
# machine-wide thing run on one worker, one after another; every other test goes to whichever worker is free.
CLUSTER_FIXTURES = frozenset({"netns", "mlflow_server", "slurm_cluster"})  # tests/launchers/conftest.py


def xdist_group_of(item: pytest.Item) -> str | None:
    """The group a test must share a worker with, or None where it may run beside anything.

    - `local_model`: the real local model. Each such test starts its own llama.cpp server on one
      thread; two at once on 2 cores would halve both and double the time every cell waits.
    - `cluster`: the private network namespace and what runs in it (SLURM's daemons and MariaDB,
      one MLflow server, Ray): one namespace per worker session, so all of them on one worker.
    - `<module>:<params>`: the tests of a module that use one of its own module-scoped fixtures (a
      study, a sweep, a server it starts), per value of the fixtures' parameters. A fixture is built
      once per worker that needs it: spread over two workers, a 50-second study would be run twice.
    """
    if item.get_closest_marker("local_model"):
        return "local_model"
    names = set(getattr(item, "fixturenames", ()))
    if CLUSTER_FIXTURES & names:
        return "cluster"
    shared = sorted(_own_module_fixtures(item, names))
    if not shared:
        return None
    params = getattr(getattr(item, "callspec", None), "params", {})
    values = [f"{n}={params[n]}" for n in shared if n in params]
    # xdist reads the group after the nodeid's last "@", and only when no "]" follows it: no brackets here
    return f"{item.nodeid.split('::')[0]}:{','.join(values)}"


def _own_module_fixtures(item: pytest.Item, names: set[str]) -> set[str]:
    """The module-scoped fixtures of the test's own module among those it uses (not conftest's)."""
    module = getattr(item, "module", None)
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return {
        n
        for n in names
        if module is not None
        and defs.get(n)
        and defs[n][-1].scope == "module"
        and getattr(defs[n][-1].func, "__module__", None) == module.__name__
    }


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which turns the marker into the worker choice
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = xdist_group_of(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def apps_data_dir() -> Path:
    """The vendored APPS rows (`APPS_DATA_DIR`): part of the repository, never skipped."""
    assert (APPS_DATA_DIR / "train_mini150.jsonl").is_file(), f"the vendored APPS rows are missing from {APPS_DATA_DIR}"
    return APPS_DATA_DIR


# train_mini150 rows whose reference solution runs close to the 4 s per-test limit on this
# machine (problem 49: ~2.4 s alone, up to ~4 s under load): their verdict depends on load.
TIMING_MARGINAL_TRAIN_IDS = frozenset({"49"})


@pytest.fixture(scope="session")
def optimizer_pool_file(apps_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """train_mini150 without its timing-marginal rows, for optimizer pools.

    Optimizer tests compare a child prompt against its parent on the same problems and
    expect a tie when the model ignores the prompt (gold); a verdict that flips with
    machine load would make that comparison, and the test, flaky.
    """
    import json

    rows = (apps_data_dir / "train_mini150.jsonl").read_text().splitlines()
    kept = [r for r in rows if str(json.loads(r)["problem_id"]) not in TIMING_MARGINAL_TRAIN_IDS]
    assert len(kept) == len(rows) - len(TIMING_MARGINAL_TRAIN_IDS)
    path = tmp_path_factory.mktemp("pool") / "train_stable.jsonl"
    path.write_text("\n".join(kept) + "\n")
    return path


@pytest.fixture(scope="session", autouse=True)
def _framework_env(tmp_path_factory: pytest.TempPathFactory):
    """Offline, quiet frameworks for the whole session (docs/contributing.md).

    A scratch HOME (CrewAI writes a key and a kickoff database there), telemetry off,
    no interactive CrewAI prompt, loopback never proxied, and OPENAI_BASE_URL at a
    loopback gold server with no problems: a client some framework builds on its own
    (not through ModelClients) reaches loopback and gets a reply saying it cannot be
    placed, never the internet.
    """
    from apps_bench.models.gold import GoldServer

    stray = GoldServer([]).start()
    env = {
        "HOME": str(tmp_path_factory.mktemp("home")),
        "CREWAI_DISABLE_TELEMETRY": "true",
        "CREWAI_TESTING": "true",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "OPENAI_API_KEY": "x",
        "OPENAI_BASE_URL": stray.base_url,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        yield env
    stray.stop()


@pytest.fixture(scope="session", autouse=True)
def _ctrl_c_as_from_a_terminal():
    """Every CLI a test starts gets SIGINT as a terminal's foreground job has it.

    A suite started as a background job of a script (`pytest ... &`) has SIGINT ignored (POSIX), and
    an ignored signal stays ignored across fork and exec: the Ctrl-C tests' SIGINT then never reaches
    the cell, which finishes every problem and exits 0. Restored here once per (worker) process.
    """
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


# --- the real CLI, run as a subprocess (grid runner tests) ------------------------------


def cli_env(tmp: Path, **extra: str) -> dict[str, str]:
    """Environment for a CLI subprocess: this session's offline settings, a store under `tmp`."""
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("APPS_BENCH_PARENT_RUN_ID", None)
    env.update(
        MLFLOW_DISABLE_TELEMETRY="true",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        COLUMNS="160",
    )
    env.update(extra)
    return env


def run_cli(
    args: list[str], cwd: Path, *, env: dict[str, str] | None = None, timeout: float = 300, module: str = "apps_bench"
) -> subprocess.CompletedProcess[str]:
    """`python -m apps_bench ARGS` in `cwd`, stdin closed, output captured."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=env if env is not None else cli_env(cwd),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated, empty SQLite MLflow store, made once per session: tests copy it instead of
    paying MLflow's schema migrations (seconds) in every CLI run."""
    db = tmp_path_factory.mktemp("mlflow_template") / "mlflow.db"
    from apps_bench.tracking import mlflow as mlf

    mlf.client(f"sqlite:///{db}")
    return db


def fresh_store(template: Path, dest: Path) -> Path:
    """Copy the template store to `dest` (e.g. <cwd>/outputs/mlflow.db, the embedded default)."""
    import shutil

    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, dest)
    return dest


CONF_DIR = Path(__file__).resolve().parents[1] / "apps_bench" / "conf"


def compose_cell(*overrides: str, hydra_cfg: bool = False):
    """The cell config `python -m apps_bench OVERRIDES` composes (schema checked; a fresh
    object each call). The one compose helper of the suite."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from apps_bench.config.schema import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
            return compose("config", overrides=list(overrides), return_hydra_config=hydra_cfg)
    finally:
        GlobalHydra.instance().clear()


def config_dir_preset(
    config_dir: Path, name: str = "goldslow", base: str | None = "gold", group: str = "model", **settings: Any
) -> Path:
    """A preset of the user's own, as `--config-dir config_dir` finds it: `config_dir/<group>/<name>.yaml` holding
    `defaults: [<base>, _self_]` (None: no defaults, e.g. to overlay a packaged preset with its own full text)
    and `settings` (dotted keys nest); -> config_dir, to pass as `--config-dir`."""
    import yaml

    body: dict[str, Any] = {"defaults": [base, "_self_"]} if base else {}
    for dotted, value in settings.items():
        node = body
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    path = config_dir / group / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return config_dir


@functools.cache
def _model_preset(name: str):
    return compose_cell(f"model={name}").model


def model_preset(name: str = "gold", **over: Any):
    """conf/model/<name>.yaml as Hydra composes it (its shared/ defaults included; the schema's node, so a
    key it lacks fails), a fresh copy with `over` (dotted keys) set."""
    import copy

    from omegaconf import OmegaConf

    cfg = copy.deepcopy(_model_preset(name))
    for k, v in over.items():
        OmegaConf.update(cfg, k, v, merge=False)
    return cfg


def optimizer_params(method: str, **over: Any):
    """conf/optimizer/<method>.yaml's params as Hydra composes them, with `over` (nested dicts for the
    budget and pool) merged in: typed by the method's schema, so a key it lacks fails here too."""
    from omegaconf import OmegaConf

    from apps_bench.config.schema import OPTIMIZER_SCHEMAS, typed

    node = compose_cell(f"optimizer={method}").optimizer
    return typed(OPTIMIZER_SCHEMAS[method], OmegaConf.merge(node, {"params": over})).params


def optimizer_config(method: str, params: Any):
    """The optimizer config of `optimizer=<method>` (its name and its `_target_` as Hydra composes them)
    with `params` (from `optimizer_params`; optimizer=none runs the protocol with any method's params)."""
    from dataclasses import replace

    from apps_bench.config.schema import typed_config

    return replace(typed_config(compose_cell(f"optimizer={method}")).optimizer, params=params)


def problem_record(i: int | str = 0, **over: Any):
    """A records.jsonl record of problem `i` (a passed, judged answer with no usage), with `over` set (in the
    line's JSON form), read as the record store reads a line: the type every reader of records takes."""
    from apps_bench.types import ProblemRecord

    base = dict(
        key=f"test/{i}",
        id=str(i),
        split="test",
        difficulty="interview",
        mode="stdio",
        cell="c",
        program="print(1)",
        extracted=True,
        passed=True,
        verdict=None,
        usage={},
        tool_calls_by_role={},
        latency_s=0.0,
        solve_s=0.0,
        judge_s=0.0,
        solver="main",
        error=None,
        stop_reason="done",
    )
    return ProblemRecord.from_json({**base, **over})


@pytest.fixture(scope="module")
def pool():
    """A sandbox pool with the `seed` judge profile's limits (2 workers), one per test module;
    a module that needs other limits defines its own."""
    from apps_bench.judge.profiles import judge_config
    from apps_bench.sandbox import SandboxPool

    with SandboxPool.from_config(judge_config("seed"), workers=2) as p:
        yield p


@pytest.fixture(scope="module")
def judge(pool):
    """The `seed` profile's judge on the module's pool."""
    from apps_bench.judge import Judge
    from apps_bench.judge.profiles import judge_config

    return Judge.from_config(pool, judge_config("seed"))


GOLD_SWEEP = ["seed=0,1", "topology=single,sequential_langgraph", "model=gold", "dataset=apps", "limit=5", "progress=false"]


def gold_sweep(
    cwd: Path, data_dir: Path, *extra: str, template: Path | None = None, env: dict[str, str] | None = None, timeout: float = 600
) -> str:
    """The small real sweep (2 topologies × 2 seeds × 5 APPS rows on gold) through the real CLI;
    -> its store's URI: a fresh SQLite store at <cwd>/outputs/mlflow.db copied from `template`, or
    the MLFLOW_TRACKING_URI of `env` (e.g. a server's)."""
    env = env if env is not None else cli_env(cwd)
    uri = env.get("MLFLOW_TRACKING_URI", "")
    if not uri:
        assert template is not None, "gold_sweep: give a store template or MLFLOW_TRACKING_URI in env"
        uri = f"sqlite:///{fresh_store(template, cwd / 'outputs' / 'mlflow.db')}"
    args = ["-m", *GOLD_SWEEP, f"dataset.path={data_dir / 'train_mini150.jsonl'}", *extra]
    r = run_cli(args, cwd, env=env, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return uri


# --- a real MLflow tracking server on loopback -------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def mlflow_server(root: Path):
    """launchers/mlflow_server.sh on a free loopback port (one worker, store and artifacts under `root`);
    yields its MLFLOW_TRACKING_URI once /health answers; stops it (its whole session) on exit."""
    import signal
    import time
    import urllib.request

    env = {**os.environ, "MLFLOW_SERVER_DIR": str(root), "PORT": str(free_port()), "WORKERS": "1", "PYTHON": sys.executable}
    log_path = root / "server.log"  # a file, not a pipe: a pipe nobody drains blocks the server once full
    log = log_path.open("w")
    proc = subprocess.Popen(
        [str(REPO / "launchers" / "mlflow_server.sh")],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not log_path.read_text().startswith("MLFLOW_TRACKING_URI="):  # the script's first line
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        uri = log_path.read_text().splitlines()[0].split("=", 1)[1].strip()
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.5)
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the script's own session: the server and its worker
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@dataclass(frozen=True)
class PlainMlflow:
    """A plain `mlflow server` on loopback that accepts only the host name 127.0.0.1:<port>."""

    url: str
    port: int
    access_log: Path  # uvicorn's access lines: '"PUT /api/2.0/mlflow-artifacts/artifacts/<exp>/<run>/artifacts/<file> ...'

    def artifact_writes(self, run_id: str, name: str) -> int:
        """How many times `name` was uploaded to run `run_id` through this server."""
        needle = '"PUT /api/2.0/mlflow-artifacts/artifacts/'
        tail = f"/{run_id}/artifacts/{name} HTTP"
        return sum(1 for line in self.access_log.read_text().splitlines() if needle in line and tail in line)


@contextlib.contextmanager
def plain_mlflow_server(root: Path):
    """`mlflow server` on 127.0.0.1 (SQLite and artifacts under `root`) that accepts only the host name
    127.0.0.1 (MLflow's DNS-rebinding guard: `localhost` gets a 403); yields a PlainMlflow once /health answers."""
    import signal
    import time
    import urllib.request

    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ALLOWED_HOSTS": f"127.0.0.1:{port}", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination",
            str(root / "artifacts"),
            "--workers",
            "1",
        ],
        cwd=root,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=open(root / "access.log", "w"),
        stderr=open(root / "server.log", "w"),
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("mlflow server did not start:\n" + (root / "server.log").read_text()[-3000:])
                time.sleep(0.5)
        yield PlainMlflow(url=url, port=port, access_log=root / "access.log")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
