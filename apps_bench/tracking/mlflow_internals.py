"""The one import point of mlflow, and the parts of MLflow this project needs that are not its public API.

MLflow offers no public way to list the tables its SQLite store must hold (a store missing one is
half-made, and MLflow would migrate it in place, not atomically), to read the newest schema
revision (a store behind it would be migrated the same way), or to drop its cached engine of a
URI (a store file remade at the same path must be opened afresh). Each is reached here and
nowhere else, and tests/tracking/test_mlflow_internals.py names every one: an MLflow upgrade that
moves one fails there, in one place, instead of deep inside a cell.
"""

from __future__ import annotations

import os
from typing import Any

PRIVATE = (  # what this module reaches into, as the test checks it
    "mlflow.store.db.base_sql_model.Base",
    "mlflow.store.tracking.sqlalchemy_store.SqlAlchemyStore._engine_map",
    "mlflow.store.db.utils._get_latest_schema_revision",
    "mlflow.tracking._tracking_service.registry.TrackingStoreRegistry._get_store_with_resolved_uri",
)


def load_mlflow() -> Any:
    """`import mlflow`, with this project's defaults (no telemetry; synchronous logging, so a
    record logged is a record stored) unless the environment says otherwise."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")
    import mlflow

    return mlflow


def store_tables() -> set[str]:
    """Every table this MLflow's SQL models define."""
    from mlflow.store.db.base_sql_model import Base
    from mlflow.store.tracking import sqlalchemy_store  # noqa: F401 - imports the models that define them

    return set(Base.metadata.tables)


def latest_schema_revision() -> str:
    """The newest schema revision (alembic head) this MLflow migrates a store to."""
    from mlflow.store.db.utils import _get_latest_schema_revision

    return str(_get_latest_schema_revision())


def forget_engine(uri: str) -> None:
    """Close and drop MLflow's cached engine of `uri` (a file moved or remade is then opened afresh).

    MLflow also caches each URI's store object, which holds the engine: left cached, a second
    creation at the same path in one process reused it, reconnected to the new empty file and
    skipped the migrations ("no such table: experiments"). That cache has no per-URI eviction, so
    it is cleared; other stores are rebuilt on their next use around their cached engines."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.tracking._tracking_service.registry import TrackingStoreRegistry

    engine: Any = SqlAlchemyStore._engine_map.pop(uri, None)
    if engine is not None:
        engine.dispose()
    TrackingStoreRegistry._get_store_with_resolved_uri.cache_clear()
