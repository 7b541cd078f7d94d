"""A private network namespace for cluster tests, and commands and daemons run inside it.

Cluster daemons do not all keep to loopback (slurmdbd binds 0.0.0.0; Ray rewrites
`--node-ip-address=127.0.0.1` to a routable address), so the tests run every daemon, and
every command that talks to one, in a network namespace they create: nothing listens
outside it. Inside, only `lo` and a veth pair with both ends in the namespace exist
(getaddrinfo(AI_ADDRCONFIG), which slurmdbd uses to bind, wants one non-loopback IPv4
address); it reaches nothing outside.

Commands enter with `nsenter --net` plus `unshare --mount` (not `ip netns exec`, which
remounts /sys without /sys/fs/cgroup: slurmd then cannot start its cgroup plugin and the
sandbox loses its pids cgroup), and bind-mount a hosts file over /etc/hosts in that private
mount namespace, so this host's name resolves to 127.0.0.1 inside only.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
APPS_TRAIN_MINI = REPO / "tests" / "fixtures" / "apps" / "train_mini150.jsonl"  # the vendored rows (conftest.APPS_DATA_DIR)

# the sweep every cluster test runs: 4 gold cells of 5 real APPS problems
N_PROBLEMS = 5
GOLD_CELLS = [
    "seed=0,1",
    "topology=single,sequential_langgraph",
    "model=gold",
    "dataset=apps",
    f"dataset.path={APPS_TRAIN_MINI}",
    f"limit={N_PROBLEMS}",
    "progress=false",
]


class NamespaceUnavailable(RuntimeError):
    """The namespace cannot be created here (not root, no `ip`, no CAP_SYS_ADMIN)."""


@dataclass
class Netns:
    """A network namespace this test session made; `run`/`popen` execute inside it."""

    name: str
    workdir: Path
    hosts: Path = field(init=False)

    def __post_init__(self) -> None:
        self.hosts = self.workdir / "hosts"

    @classmethod
    def create(cls, name: str, workdir: Path) -> Netns:
        for tool in ("ip", "nsenter", "unshare", "mount"):
            if not _which(tool):
                raise NamespaceUnavailable(f"`{tool}` is not installed")
        if os.geteuid() != 0:
            raise NamespaceUnavailable("creating a network namespace needs root")
        workdir.mkdir(parents=True, exist_ok=True)
        ns = cls(name, workdir)
        # this host's names first: `hostname -f` inside gives the real name, not "localhost"
        names = dict.fromkeys(
            n for n in (socket.getfqdn(), socket.gethostname(), socket.gethostname().split(".")[0]) if n != "localhost"
        )
        ns.hosts.write_text(f"127.0.0.1 {' '.join(names)} localhost\n")
        if Path(f"/run/netns/{name}").exists():  # a leftover of a killed session
            cls(name, workdir).destroy()
        add = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
        if add.returncode != 0:
            raise NamespaceUnavailable(f"`ip netns add {name}` failed: {add.stderr.strip()}")
        try:
            for cmd in (
                "ip link set lo up",
                "ip link add ab0 type veth peer name ab1",
                "ip addr add 10.255.0.1/30 dev ab0",
                "ip addr add 10.255.0.2/30 dev ab1",
                "ip link set ab0 up",
                "ip link set ab1 up",
            ):
                subprocess.run(["ip", "netns", "exec", name, *cmd.split()], check=True, capture_output=True, text=True)
            probe = ns.run(["sh", "-c", "test -d /sys/fs/cgroup && getent hosts $(hostname)"])
            if probe.returncode != 0 or not probe.stdout.startswith("127.0.0.1"):
                raise NamespaceUnavailable(f"namespace probe failed: {probe.stdout}{probe.stderr}")
        except (subprocess.CalledProcessError, NamespaceUnavailable) as exc:
            ns.destroy()
            detail = exc.stderr if isinstance(exc, subprocess.CalledProcessError) else exc
            raise NamespaceUnavailable(f"cannot set up namespace {name}: {detail}") from exc
        return ns

    def argv(self, cmd: list[str]) -> list[str]:
        """`cmd` wrapped to run inside the namespace (own mount namespace, this host -> 127.0.0.1)."""
        enter = f'mount --bind {shlex.quote(str(self.hosts))} /etc/hosts && exec "$@"'
        return [
            "nsenter",
            f"--net=/run/netns/{self.name}",
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            enter,
            "sh",
            *cmd,
        ]

    def run(self, cmd: list[str], *, timeout: float = 120, **kw) -> subprocess.CompletedProcess[str]:
        """Run `cmd` inside; output captured as text, stdin closed."""
        kw.setdefault("capture_output", True)
        return subprocess.run(self.argv(cmd), text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kw)

    def popen(self, cmd: list[str], log: Path, **kw) -> subprocess.Popen:
        """Start `cmd` inside in its own session (a daemon), stdout+stderr to `log`."""
        log.parent.mkdir(parents=True, exist_ok=True)
        out = log.open("ab")
        return subprocess.Popen(
            self.argv(cmd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **kw,
        )

    def pids(self) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def kill_all(self, grace: float = 3.0) -> None:
        """End every process in the namespace by PID (`ip netns pids`): never by name, which would
        match the same daemons elsewhere on the machine."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = self.pids()
            if not pids:
                return
            for p in pids:
                try:
                    os.kill(p, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and self.pids():
                time.sleep(0.1)

    def destroy(self) -> None:
        self.kill_all()
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)

    def wait_http(self, url: str, timeout: float = 120, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
        """Wait until `url` (as seen inside) answers 200; fail with the daemon's log tail if not."""
        deadline = time.monotonic() + timeout
        probe = f"import urllib.request,sys; sys.exit(0 if urllib.request.urlopen({url!r}, timeout=2).status == 200 else 1)"
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                break
            if self.run([_python(), "-c", probe], timeout=30).returncode == 0:
                return
            time.sleep(0.5)
        tail = log.read_text()[-3000:] if log and log.exists() else ""
        raise RuntimeError(f"{url} did not come up inside namespace {self.name}:\n{tail}")


@dataclass
class MlflowServer:
    """A real `mlflow server` (launchers/mlflow_server.sh) on the namespace's loopback.

    `uri` is for processes inside the namespace (the cells, over HTTP); `backend_uri` reads the
    same SQLite store from the test process, which is outside and cannot reach the port."""

    uri: str
    backend_uri: str
    artifact_root: Path
    root: Path
    proc: subprocess.Popen
    log: Path

    def client(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient(self.backend_uri)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def start_mlflow_server(ns: Netns, root: Path, port: int = 5055, workers: int = 2, host: str = "127.0.0.1") -> MlflowServer:
    """Start launchers/mlflow_server.sh inside `ns`; return once /health answers at the
    address it printed."""
    root.mkdir(parents=True, exist_ok=True)
    log = root / "server.log"
    env = {
        **os.environ,
        "MLFLOW_SERVER_DIR": str(root),
        "HOST": host,
        "PORT": str(port),
        "WORKERS": str(workers),
        "PYTHON": _python(),
    }
    proc = ns.popen(["bash", str(REPO / "launchers" / "mlflow_server.sh")], log, env=env)
    uri = _printed_uri(log, proc)
    ns.wait_http(f"{uri}/health", proc=proc, log=log)
    return MlflowServer(
        uri=uri,
        backend_uri=f"sqlite:///{root}/mlflow.db",
        artifact_root=root / "artifacts",
        root=root,
        proc=proc,
        log=log,
    )


def _printed_uri(log: Path, proc: subprocess.Popen, timeout: float = 30) -> str:
    """The address the script prints for the cells (`MLFLOW_TRACKING_URI=...`, its first line)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines() if log.exists() else []:
            if line.startswith("MLFLOW_TRACKING_URI="):
                return line.split("=", 1)[1].strip()
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError(f"launchers/mlflow_server.sh printed no MLFLOW_TRACKING_URI=:\n{log.read_text()[-2000:]}")


def _python() -> str:
    import sys

    return sys.executable


def _which(tool: str) -> bool:
    import shutil

    return shutil.which(tool) is not None


@dataclass
class SlurmCluster:
    """launchers/slurm_local.sh's cluster inside a namespace; `env` is its env file, parsed."""

    ns: Netns
    root: Path
    env: dict[str, str]

    def run(self, cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
        """A SLURM client command (squeue, scancel, sacct, sbatch) against this cluster."""
        return self.ns.run(cmd, env={**os.environ, **self.env}, **kw)

    def stop(self) -> None:
        self.ns.run(["bash", str(REPO / "launchers" / "slurm_local.sh"), "stop"], env=self._script_env(), timeout=60)

    def _script_env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_LOCAL_DIR": str(self.root)}


def skip_without_slurm(daemons: tuple[str, ...] = ("munged", "slurmctld", "slurmd", "slurmdbd", "mariadbd")) -> None:
    """Skip, naming the packages, where the SLURM daemons are not installed (.ci/run installs them as root)."""
    missing = [b for b in daemons if shutil.which(b) is None]
    if missing:
        pytest.skip(f"SLURM test needs {', '.join(missing)}: apt-get install slurm-wlm munge slurmdbd mariadb-server")


def start_slurm(ns: Netns, root: Path, **settings: str) -> SlurmCluster:
    """`launchers/slurm_local.sh start` inside `ns` (accounting on: a private namespace);
    `settings`: the script's environment knobs (e.g. ACCOUNTING="0")."""
    cluster = SlurmCluster(ns, root, {})
    env = {**cluster._script_env(), **settings}
    out = ns.run(["bash", str(REPO / "launchers" / "slurm_local.sh"), "start"], env=env, timeout=180)
    if out.returncode != 0:
        raise RuntimeError(f"launchers/slurm_local.sh start failed ({out.returncode}):\n{out.stderr[-4000:]}")
    assert out.stdout.strip() == f"source {root}/env", out.stdout
    for line in (root / "env").read_text().splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        cluster.env[key] = value
    return cluster


def cell_records(cwd: Path) -> dict[str, list[str]]:
    """A sweep's cells (run in `cwd`): cell dir name -> its record lines."""
    return {p.parent.name: p.read_text().splitlines() for p in (cwd / "outputs" / "cells").glob("*/records.jsonl")}


def sweep_runs(server: MlflowServer, experiment: str) -> tuple[list, list]:
    """(parent runs, cell runs) of `experiment` on the server."""
    client = server.client()
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment!r} on the server"
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("sweep") == "true"]
    cells = [r for r in runs if r.data.tags.get("sweep") != "true"]
    return parents, cells


def assert_sweep_logged(server: MlflowServer, experiment: str, n_cells: int, n_problems: int) -> None:
    """One FINISHED parent, one FINISHED child per cell under it, every problem solved (gold),
    and each child's records artifact in the server's artifact root."""
    parents, cells = sweep_runs(server, experiment)
    assert len(parents) == 1, [p.info.run_id for p in parents]
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert len(cells) == n_cells
    for run in cells:
        assert run.data.tags.get("mlflow.parentRunId") == parent.info.run_id, run.data.tags
        assert run.info.status == "FINISHED"
        assert run.data.metrics["pass_at_1"] == 1.0
        assert run.data.metrics["n_problems"] == n_problems
        art = server.artifact_root / run.info.experiment_id / run.info.run_id / "artifacts"
        records = art / "records.jsonl"
        assert records.is_file(), sorted(p.name for p in art.glob("*"))
        assert len(records.read_text().splitlines()) == n_problems
    assert len({r.data.tags["cell_key"] for r in cells}) == n_cells
