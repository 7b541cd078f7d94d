"""Cluster-test fixtures: a private network namespace and one real MLflow server inside it.

Shared by the SLURM, Ray and joblib sweep tests (tests/launchers/). A test that needs a
daemon skips, with the reason, only where the namespace itself cannot be made (not root,
no `ip`); a daemon that does not start is a failure, not a skip.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from launchers.cluster_env import (
    MlflowServer,
    NamespaceUnavailable,
    Netns,
    SlurmCluster,
    skip_without_slurm,
    start_mlflow_server,
    start_slurm,
)


@pytest.fixture(scope="session")
def netns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Netns]:
    """A network namespace for this session (lo + an inner veth pair); every process in it is
    killed by PID at the end, then the namespace is deleted."""
    try:
        ns = Netns.create(f"apps-test-{os.getpid()}", tmp_path_factory.mktemp("netns"))
    except NamespaceUnavailable as exc:
        pytest.skip(f"cluster tests need a private network namespace, which cannot be made here: {exc}")
    try:
        yield ns
    finally:
        ns.destroy()


@pytest.fixture(scope="session")
def mlflow_server(netns: Netns, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """`launchers/mlflow_server.sh` on the namespace's loopback (SQLite + artifact root)."""
    server = start_mlflow_server(netns, tmp_path_factory.mktemp("mlflow_server"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def slurm_cluster(netns: Netns, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """`launchers/slurm_local.sh start` in the namespace (munge, slurmctld, slurmd, slurmdbd,
    MariaDB); stopped by the script, then whatever is left by the namespace's PIDs."""
    skip_without_slurm()
    cluster = start_slurm(netns, tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        cluster.stop()
