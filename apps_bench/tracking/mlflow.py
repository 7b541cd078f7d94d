"""MLflow logging (mlflow itself is imported lazily, through mlflow_internals.load_mlflow).

Mapping: experiment = the study (`tracking.experiment`); run = one cell, found again by
its `cell_key` tag so a resumed cell continues its own run; a multirun sweep gets a
parent run for each launch (created by the Hydra callback before any cell starts) and each cell's run
nests under it (a run that existed before the sweep is a member all the same: the parent
lists its members, tracking/membership.py). An optimizer cell's final evaluation is a
child of the cell's run, found again by its own tag (`key_tag="final_eval_of"`, `parent_run_id`). Params are the flattened identity of the cell (settings that change
results), which is the same on every resume, so MLflow's immutable params never clash.

Store: `MLFLOW_TRACKING_URI` if set, else an absolute-path SQLite file
`<cwd>/outputs/mlflow.db`. A new SQLite store is created atomically under a file lock
(`sqlite_store.py`: a kill at any moment leaves none or a complete one; parallel cells never
race on its migrations); a sweep creates it in the parent process.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, TypeVar

from apps_bench.tracking import sqlite_store
from apps_bench.tracking.mlflow_internals import forget_engine, load_mlflow
from apps_bench.tracking.sqlite_store import ELSEWHERE, StoreError
from apps_bench.types import JsonObject

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

T = TypeVar("T")

PARENT_RUN_ENV = "APPS_BENCH_PARENT_RUN_ID"
DIGESTS_TAG = "artifact_digests"  # {artifact path: sha256 of what was uploaded}: a rerun uploads only what changed
MAX_PARAM_CHARS = 6000  # MLflow's limit on a param value
TABLE_ARTIFACT = "problems.json"


def default_tracking_uri(cwd: Path | None = None) -> str:
    db = (cwd or Path.cwd()).resolve() / "outputs" / "mlflow.db"
    return f"sqlite:///{db}"


def tracking_uri(cwd: Path | None = None) -> str:
    """MLFLOW_TRACKING_URI, else the embedded default; a relative sqlite path is made absolute."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if not uri:
        return default_tracking_uri(cwd)
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        rel = uri[len("sqlite:///") :]
        return f"sqlite:///{((cwd or Path.cwd()) / rel).resolve()}"
    if "://" not in uri:  # a bare path: MLflow would make it a file store, which now raises
        return f"sqlite:///{((cwd or Path.cwd()) / uri).resolve()}"
    return uri


_mlflow = load_mlflow


_CLIENTS: dict[str, MlflowClient] = {}


def client(uri: str) -> MlflowClient:
    """An MlflowClient for `uri` (one per process and URI); a local SQLite store is created
    atomically, or repaired, first (sqlite_store.py: StoreError says how when it cannot be)."""
    if uri in _CLIENTS:
        return _CLIENTS[uri]
    c = _new_client(uri)
    _CLIENTS[uri] = c
    return c


def _new_client(uri: str) -> MlflowClient:
    mlflow = _mlflow()
    if uri.startswith(("http://", "https://")):
        return _server_client(mlflow, uri)
    if not uri.startswith("sqlite:///"):
        return mlflow.MlflowClient(tracking_uri=uri)
    from filelock import FileLock

    db = Path(uri[len("sqlite:///") :])
    sqlite_store.ensure_store(db)  # absent -> created atomically; half-made -> remade or StoreError

    def open_store() -> Any:
        with FileLock(sqlite_store.lock_path(db)):
            c = mlflow.MlflowClient(tracking_uri=uri)
            c.search_experiments(max_results=1)  # MLflow checks the schema revision here
        return c

    try:
        return open_store()
    except mlflow.exceptions.MlflowException as exc:
        forget_engine(uri)
        sqlite_store.diagnose(db, exc)  # remade, or StoreError with the fix (or exc again)
    return open_store()


def _server_client(mlflow: Any, uri: str) -> Any:
    """A client of an MLflow server, checked with one request: a server that refuses this
    address says so with the fix, not as a traceback at the cell's first record."""
    c = mlflow.MlflowClient(tracking_uri=uri)
    try:
        c.search_experiments(max_results=1)
    except mlflow.exceptions.MlflowException as exc:
        text = str(exc)
        if "403" in text or "Forbidden" in text or "Invalid Host header" in text:
            raise StoreError(_refused(uri, text)) from None
        raise
    return c


def _refused(uri: str, said: str) -> str:
    return (
        f"the MLflow server at {uri} refused this client (HTTP 403): MLflow's server accepts only the host "
        f"names it was told. Start it with MLFLOW_SERVER_ALLOWED_HOSTS including the host in this URI "
        f"(launchers/mlflow_server.sh sets it), or use the address it prints. Server said: {said[:500]}"
    )


# ----------------------------------------------------------------------------- the store, checked first


class StoreUnavailable(StoreError):
    """The store failed while a cell ran (a server gone, a disk full); the cell's folder keeps its records."""


class LoggingPending(StoreUnavailable):
    """The store failed once every problem of the cell was recorded: the cell is done, only its run is
    not logged; the next run of the same command logs it without solving anything."""


def check_store(uri: str, settings: Any) -> None:
    """One cheap look at the store before a cell or a sweep creates anything, as the model endpoint
    gets: a server that does not answer or refuses this client, and a SQLite store this user cannot
    write, fail now with the fix (StoreError). MLflow's own HTTP retries are bounded by `settings`
    (conf/tracking/mlflow.yaml `store:`) unless the environment sets them, so a server that goes
    away mid-cell costs seconds, not minutes of retries."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(int(settings.http_retries)))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(settings.http_timeout_s)))
    if uri.startswith(("http://", "https://")):
        _probe_server(uri, float(settings.check_timeout_s))
    elif uri.startswith("sqlite:///"):
        _probe_sqlite(Path(uri[len("sqlite:///") :]))


_NO_SERVER_FIX = (
    "Start it (launchers/mlflow_server.sh prints the address to use), correct MLFLOW_TRACKING_URI, or unset "
    "it to log to the local SQLite store outputs/mlflow.db."
)


def _probe_server(uri: str, timeout_s: float) -> None:
    """One GET with MLflow's own credentials (MLFLOW_TRACKING_USERNAME/PASSWORD or _TOKEN); any
    answer but a refusal or a server error means the server is there."""
    import base64
    import ssl
    import urllib.error
    import urllib.request

    headers = {"User-Agent": "apps-bench-store-check"}
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user and password:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    elif os.environ.get("MLFLOW_TRACKING_TOKEN"):
        headers["Authorization"] = f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}"
    context = None
    if uri.startswith("https://"):
        if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true":
            context = ssl._create_unverified_context()  # noqa: S323 - what MLflow's client does with this setting
        else:
            context = ssl.create_default_context(cafile=os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH") or None)
    url = f"{uri.rstrip('/')}/api/2.0/mlflow/experiments/get-by-name?experiment_name=Default"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s, context=context):
            return
    except urllib.error.HTTPError as exc:
        said = exc.read(500).decode("utf-8", "replace").strip()
        if exc.code == 403:
            raise StoreError(_refused(uri, said or "403 Forbidden") + "; nothing was created.") from None
        if exc.code == 401:
            given = (
                "the credentials in MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) were refused"
                if "Authorization" in headers
                else "none were given"
            )
            raise StoreError(
                f"the MLflow server at {uri} requires a login (HTTP 401) and {given}; nothing was created. Export "
                f"MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) of a user of that "
                f"server. Server said: {said[:300]}"
            ) from None
        if exc.code < 500:
            return  # it answers (a 404 only says the experiment does not exist)
        raise StoreError(
            f"the MLflow server at {uri} answers HTTP {exc.code}: {said[:300]}; nothing was created. "
            f"Look at the server's log, or point MLFLOW_TRACKING_URI at a working store."
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise StoreError(
            f"the MLflow tracking server at {uri} does not answer ({reason}, after one request of at most "
            f"{timeout_s:g} s); nothing was created. {_NO_SERVER_FIX}"
        ) from None


def _probe_sqlite(db: Path) -> None:
    """A SQLite store must be writable (or creatable) by this user; nothing is created here."""
    if db.exists():
        bad = [str(p) for p in (db, db.parent) if not os.access(p, os.R_OK | os.W_OK)]
        if bad:
            raise StoreError(
                f"the MLflow store {db} cannot be written by this user ({' and '.join(bad)} not writable; "
                f"SQLite writes a journal beside it); nothing was created. Fix its permissions, {ELSEWHERE}"
            )
        return
    parent = db.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise StoreError(
            f"cannot create the MLflow store {db}: {parent} is not a folder this user can write; nothing "
            f"was created. Run from a writable folder, {ELSEWHERE}"
        )


def store_calls_failed(uri: str, exc: BaseException) -> StoreUnavailable | None:
    """`exc`, raised by a call to the store at `uri`, as a StoreUnavailable (None when it is not a store failure)."""
    mlflow = _mlflow()
    try:
        import requests

        transport: tuple[type[BaseException], ...] = (requests.exceptions.RequestException,)
    except ImportError:  # pragma: no cover - mlflow depends on requests
        transport = ()
    if isinstance(exc, StoreError):
        return None
    if isinstance(exc, (mlflow.exceptions.MlflowException, OSError, *transport)):
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        refused = re.search(r"\[Errno \d+\] [^\"')(]+|Read timed out|RemoteDisconnected", first)
        if refused:  # urllib3's retry chain says it in one phrase, a line of 400 characters around it
            return StoreUnavailable(f"the MLflow store at {uri} does not answer any more ({refused.group(0).strip()})")
        return StoreUnavailable(f"the MLflow store at {uri} failed: {type(exc).__name__}: {first[:400]}")
    return None


@contextmanager
def store_calls(uri: str) -> Iterator[None]:
    """Calls to the store at `uri`: a failure of the store itself surfaces as StoreUnavailable."""
    try:
        yield
    except Exception as exc:
        lost = store_calls_failed(uri, exc)
        if lost is None:
            raise
        raise lost from exc


def experiment_id(c: MlflowClient, name: str, uri: str) -> str:
    """Get or create the experiment (under the store's lock for SQLite)."""
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            c.restore_experiment(exp.experiment_id)
        return str(exp.experiment_id)
    lock = None
    if uri.startswith("sqlite:///"):
        from filelock import FileLock

        lock = FileLock(uri[len("sqlite:///") :] + ".lock")
        lock.acquire()
    try:
        exp = c.get_experiment_by_name(name)
        if exp is not None:
            return str(exp.experiment_id)
        try:
            return str(c.create_experiment(name))
        except Exception:
            exp = c.get_experiment_by_name(name)  # a server: another launch created it meanwhile
            if exp is None:
                raise
            return str(exp.experiment_id)
    finally:
        if lock is not None:
            lock.release()


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            text = json.dumps(v, default=str) if isinstance(v, (list, dict)) else str(v)
            if len(text) > MAX_PARAM_CHARS:
                text = text[: MAX_PARAM_CHARS - 20] + "...[truncated]"
            out[key] = text
    return out


def _batched(items: list[T], n: int) -> Iterable[list[T]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


# identity params that are also tags: what the report must compare on without reading params
IDENTITY_TAGS = {"judge.rules": "judge_rules"}


def identity_tags(params: Mapping[str, Any]) -> dict[str, str]:
    """The tags a cell's identity implies, e.g. `judge_rules` (its judge profile's rules version)."""
    flat = flatten(params)
    return {tag: flat[key] for key, tag in IDENTITY_TAGS.items() if key in flat}


class SweepSettingsMissing(StoreError):
    """A cell of a sweep did not receive the sweep's tracking settings: it must not log elsewhere."""


def sweep_settings_problem(multirun: bool = False) -> str | None:
    """Why this cell, part of a sweep (it sees the sweep's parent run id, or runs in a Hydra
    multirun), cannot log where its sweep does; None when it can."""
    parent = os.environ.get(PARENT_RUN_ENV, "").strip()
    uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if parent and uri:
        return None
    if not parent and not multirun:
        return None  # a cell on its own
    missing = " and ".join(k for k, v in (("MLFLOW_TRACKING_URI", uri), (PARENT_RUN_ENV, parent)) if not v)
    return (
        f"this cell is part of a sweep but did not receive {missing} from the command that launched it, so it would "
        "log to a private local store the sweep never sees; nothing was run. The sweep's callback "
        "(hydra.callbacks.tracking) forwards both through hydra.job.env_set to every launcher; if it was "
        f"removed, or the cell was started by hand, export them (MLFLOW_TRACKING_URI=<the sweep's store> "
        f"{PARENT_RUN_ENV}=<its parent run id>), or unset {PARENT_RUN_ENV} to run the cell on its own."
    )


@dataclass
class CellRun:
    """The MLflow run of one cell: created, or found again by its cell key on resume.

    What the run held when it was found (`status`, `tags`, `metrics`) is compared before writing:
    a rerun of a finished cell that changed nothing writes nothing (artifacts are compared by the
    digests in the `artifact_digests` tag)."""

    uri: str
    run_id: str
    experiment_id: str
    resumed: bool
    status: str = ""
    tags: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    @classmethod
    def open(
        cls,
        *,
        experiment: str,
        cell_key: str,
        run_name: str,
        params: Mapping[str, Any],
        tags: Mapping[str, str],
        uri: str | None = None,
        key_tag: str = "cell_key",
        parent_run_id: str | None = None,
        idle: bool = False,
    ) -> CellRun:
        """`key_tag`: the tag that finds the run again (an optimizer cell's final-eval child uses
        its own, so it never shadows the cell's run); `parent_run_id`: nest under this run
        instead of the sweep's; `idle`: nothing will be solved (a found run is not marked RUNNING).
        Tags the identity implies (`identity_tags`) are added here, so every kind of cell run
        (cell, final eval, re-scoring) carries them."""
        problem = sweep_settings_problem()
        if problem:  # before any store is touched: the local default is not the sweep's store
            raise SweepSettingsMissing(problem)
        tags = {**identity_tags(params), **tags}
        uri = uri or tracking_uri()
        with store_calls(uri):
            return cls._open(
                uri,
                experiment=experiment,
                cell_key=cell_key,
                run_name=run_name,
                params=params,
                tags=tags,
                key_tag=key_tag,
                parent_run_id=parent_run_id,
                idle=idle,
            )

    @classmethod
    def _open(
        cls,
        uri: str,
        *,
        experiment: str,
        cell_key: str,
        run_name: str,
        params: Mapping[str, Any],
        tags: Mapping[str, str],
        key_tag: str,
        parent_run_id: str | None,
        idle: bool = False,
    ) -> CellRun:
        c = client(uri)
        exp_id = experiment_id(c, experiment, uri)
        from mlflow.entities import Param, RunTag

        found: list[Run] = c.search_runs(
            [exp_id],
            filter_string=f"tags.{key_tag} = '{cell_key}'",
            order_by=["attributes.start_time DESC"],
            max_results=20,
        )
        if key_tag != "rescore_key":  # a re-scoring run carries the key of the cell it reads like; never continue it
            found = [r for r in found if r.data.tags.get("run_kind") != "rescore"][:1]
        flat = flatten(params)
        have_tags: dict[str, str] = {}
        have_metrics: dict[str, float] = {}
        if found:
            run_id = found[0].info.run_id
            status = str(found[0].info.status)
            have_tags, have_metrics = dict(found[0].data.tags), dict(found[0].data.metrics)
            if not idle and status != "RUNNING":
                c.update_run(run_id, status="RUNNING")
                status = "RUNNING"
            resumed = True
            parent = parent_run_id or os.environ.get(PARENT_RUN_ENV, "").strip()
            if parent and not found[0].data.tags.get("mlflow.parentRunId"):  # a cell first run alone: nest it in
                tags = {**tags, "mlflow.parentRunId": parent}  # the sweep's UI (its membership is the parent's list)
            have = found[0].data.params  # a run killed while its params were logged gets the rest now
            missing = [Param(k, v) for k, v in sorted(flat.items()) if k not in have]
        else:
            all_tags = dict(tags)
            parent = parent_run_id or os.environ.get(PARENT_RUN_ENV, "").strip()
            if parent:
                all_tags["mlflow.parentRunId"] = parent
            run = c.create_run(exp_id, run_name=run_name, tags=all_tags)
            run_id = run.info.run_id
            missing = [Param(k, v) for k, v in sorted(flat.items())]
            resumed, status = False, "RUNNING"
        for chunk in _batched(missing, 100):
            c.log_batch(run_id, params=chunk)
        changed = {k: str(v) for k, v in tags.items() if have_tags.get(k) != str(v)}
        if changed:
            c.log_batch(run_id, tags=[RunTag(k, v) for k, v in changed.items()])
        return cls(
            uri=uri,
            run_id=run_id,
            experiment_id=exp_id,
            resumed=resumed,
            status=status,
            tags={**have_tags, **changed},
            metrics=have_metrics,
        )

    def finish(
        self,
        *,
        metrics: Mapping[str, float],
        rows: list[JsonObject],
        files: Iterable[Path],
        complete: bool,
        tags: Mapping[str, str] | None = None,
        dirs: Mapping[str, Path] | None = None,
    ) -> None:
        with store_calls(self.uri):
            self._finish(metrics=metrics, rows=rows, files=files, complete=complete, tags=tags, dirs=dirs)

    def _finish(
        self,
        *,
        metrics: Mapping[str, float],
        rows: list[JsonObject],
        files: Iterable[Path],
        complete: bool,
        tags: Mapping[str, str] | None,
        dirs: Mapping[str, Path] | None,
    ) -> None:
        c = client(self.uri)
        from mlflow.entities import Metric, RunTag

        now = int(time.time() * 1000)
        ms = [
            Metric(k, float(v), now, 0)
            for k, v in sorted(metrics.items())
            if v is not None and not _same_value(self.metrics.get(k), float(v))
        ]
        for chunk in _batched(ms, 500):
            c.log_batch(self.run_id, metrics=chunk)
        digests = _still_there(c, self.run_id, _digests(self.tags.get(DIGESTS_TAG)))
        uploads: list[tuple[Path, str | None]] = [(f, None) for f in files if f.exists()]
        for name, d in (dirs or {}).items():
            for f in sorted(Path(d).glob("*")):  # e.g. optimizer/{result.json,prompts.yaml,manifest.json,events.jsonl}
                if f.is_file() and f.suffix in (".json", ".jsonl", ".yaml", ".txt"):
                    uploads.append((f, name))
        if rows:  # an optimizer cell's own run has no problems (its final-eval child has them)
            digest = _sha256(json.dumps(rows, sort_keys=True, default=str).encode())
            if digests.get(TABLE_ARTIFACT) != digest:
                log_table(c, self.run_id, rows, TABLE_ARTIFACT)
                digests[TABLE_ARTIFACT] = digest
        for f, under in uploads:
            path, digest = f"{under}/{f.name}" if under else f.name, _file_sha256(f)
            if digests.get(path) != digest:
                c.log_artifact(self.run_id, str(f), artifact_path=under)
                digests[path] = digest
        all_tags = {"complete": str(complete).lower(), **(tags or {}), DIGESTS_TAG: json.dumps(digests, sort_keys=True)}
        changed = {k: str(v) for k, v in all_tags.items() if self.tags.get(k) != str(v)}
        if changed:  # after the uploads: a digest is recorded once its artifact is there
            c.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in changed.items()])
            self.tags.update(changed)
        status = "FINISHED" if complete else "FAILED"
        if ms or changed or self.status != status:
            c.set_terminated(self.run_id, status=status)
            self.status = status
        # the sweep's comparison is the launching process's, once every cell has ended (report/sweep_run.py)

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        """Step metrics during a cell (e.g. an optimizer's progress, step = charged rollouts)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        ms = [Metric(k, float(v), now, int(step)) for k, v in metrics.items() if v is not None]
        if ms:
            client(self.uri).log_batch(self.run_id, metrics=ms)

    def fail(self, message: str) -> None:
        with store_calls(self.uri):
            c = client(self.uri)
            c.set_tag(self.run_id, "error", message[:5000])
            c.set_terminated(self.run_id, status="FAILED")


def _same_value(had: float | None, new: float) -> bool:
    return had is not None and (had == new or (math.isnan(had) and math.isnan(new)))


def _digests(tag: str | None) -> dict[str, str]:
    try:
        d = json.loads(tag or "{}")
        return {str(k): str(v) for k, v in d.items()} if isinstance(d, dict) else {}
    except ValueError:
        return {}


def _still_there(c: MlflowClient, run_id: str, digests: dict[str, str]) -> dict[str, str]:
    """The digests whose artifact the run's store still holds: one it lost is uploaded again, whatever the tag says."""
    if not digests:
        return digests
    folders = {path.rpartition("/")[0] for path in digests}
    there = {f.path for folder in folders for f in c.list_artifacts(run_id, folder or None)}
    return {path: h for path, h in digests.items() if path in there}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:32]


def log_table(c: MlflowClient, run_id: str, rows: list[JsonObject], artifact_file: str, columns: list[str] | None = None) -> None:
    """A table artifact holding exactly `rows`. `log_table` appends to an existing artifact, so
    once the artifact exists it is overwritten whole, in log_table's own format, instead."""
    import pandas as pd

    df = pd.DataFrame(rows, columns=columns)
    existing = {f.path for f in c.list_artifacts(run_id, path=os.path.dirname(artifact_file) or None)}
    if artifact_file not in existing:
        c.log_table(run_id, data=df, artifact_file=artifact_file)
        return
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / os.path.basename(artifact_file)
        df.to_json(path, orient="split", index=False, date_format="iso")
        c.log_artifact(run_id, str(path), artifact_path=os.path.dirname(artifact_file) or None)


def start_parent_run(
    *, experiment: str, run_name: str, tags: Mapping[str, str], uri: str | None = None, sweep_key: str = ""
) -> tuple[str, str, str | None]:
    """A new parent run for this launch of a sweep (not made 'active': cells nest by tag).
    -> (uri, run_id, the parent run of the latest earlier launch of the same cells, or None).

    A launch never reopens an earlier launch's parent: one that fails before any cell runs, or a
    second launch while the first runs, must leave it as it was. The earlier parent is linked by
    the tag `sweep_earlier_run`; every cell counts in the new parent all the same, whichever launch
    ran it, because the parent finds its cells by their keys (membership.py)."""
    uri = uri or tracking_uri()
    c = client(uri)
    exp_id = experiment_id(c, experiment, uri)
    earlier = None
    if sweep_key:
        found = c.search_runs(
            [exp_id], filter_string=f"tags.sweep_key = '{sweep_key}'", order_by=["attributes.start_time DESC"], max_results=1
        )
        earlier = found[0].info.run_id if found else None
    link = {"sweep_earlier_run": earlier} if earlier else {}
    run = c.create_run(exp_id, run_name=run_name, tags={**tags, "sweep": "true", "sweep_key": sweep_key, **link})
    return uri, run.info.run_id, earlier


def end_run(uri: str, run_id: str, status: str) -> None:
    client(uri).set_terminated(run_id, status=status)


def child_runs(uri: str, parent_run_id: str) -> list[Run]:
    c = client(uri)
    parent = c.get_run(parent_run_id)
    return list(c.search_runs([parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'"))
