#!/usr/bin/env bash
# Start an MLflow tracking server for a team: a database backend and a shared artifact root.
# Cells on any machine then log there:  export MLFLOW_TRACKING_URI=http://<this host>:5000
#
#   launchers/mlflow_server.sh
#   BACKEND_URI=postgresql://mlflow:secret@db-host/mlflow ARTIFACT_ROOT=s3://bucket/apps-bench launchers/mlflow_server.sh
#
# Environment:
#   BACKEND_URI    run metadata store. Default: sqlite under ./mlflow-server/ (fine for one host;
#                  use PostgreSQL/MySQL for a team: pip install psycopg2-binary / pymysql).
#   ARTIFACT_ROOT  where artifacts (records, summaries, transcripts) go; the server proxies them
#                  (--serve-artifacts), so cells need no storage credentials. Default ./mlflow-server/artifacts;
#                  an NFS path, s3://..., gs://... all work (install the matching client library).
#   HOST (0.0.0.0), PORT (5000), WORKERS (4)
# Never put passwords in the command line of a shared machine: use ~/.pgpass or a secrets file.
set -euo pipefail
ROOT="${MLFLOW_SERVER_DIR:-$PWD/mlflow-server}"
mkdir -p "$ROOT/artifacts"
BACKEND_URI="${BACKEND_URI:-sqlite:///$ROOT/mlflow.db}"
ARTIFACT_ROOT="${ARTIFACT_ROOT:-$ROOT/artifacts}"
HOST="${HOST:-0.0.0.0}"
PORT="${PORT:-5000}"
export MLFLOW_DISABLE_TELEMETRY=true
echo "MLflow server on $HOST:$PORT; backend ${BACKEND_URI%%://*}://...; artifacts $ARTIFACT_ROOT" >&2
echo "For the cells:  export MLFLOW_TRACKING_URI=http://$(hostname -f 2>/dev/null || hostname):$PORT" >&2
PY="${PYTHON:-python}"
exec "$PY" -m mlflow server \
  --backend-store-uri "$BACKEND_URI" \
  --artifacts-destination "$ARTIFACT_ROOT" \
  --serve-artifacts \
  --host "$HOST" --port "$PORT" \
  --workers "${WORKERS:-4}"
