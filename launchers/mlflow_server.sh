#!/usr/bin/env bash
# Start one MLflow tracking server for a team: a database backend and a shared artifact root.
# Cells on any machine, under any launcher (SLURM, Ray, joblib), then log to it over HTTP.
#
#   launchers/mlflow_server.sh                        # loopback only: http://127.0.0.1:5000
#   HOST=0.0.0.0 launchers/mlflow_server.sh           # the team server: reachable as http://<this host>:5000
#   HOST=0.0.0.0 BACKEND_URI=postgresql://mlflow@db-host/mlflow ARTIFACT_ROOT=s3://bucket/apps-bench \
#     launchers/mlflow_server.sh
#
# Its first line on stdout is what the cells need:  MLFLOW_TRACKING_URI=http://...  (export it).
#
# Environment:
#   BACKEND_URI    run metadata store. Default: sqlite under $MLFLOW_SERVER_DIR (fine for one server
#                  host; PostgreSQL/MySQL for many writers: pip install psycopg2-binary / pymysql).
#   ARTIFACT_ROOT  where artifacts (records, summaries, transcripts) go; the server proxies them
#                  (--serve-artifacts), so cells need no storage credentials. Default
#                  $MLFLOW_SERVER_DIR/artifacts; an NFS path, s3://..., gs://... all work (install the
#                  matching client library on the server host).
#   MLFLOW_SERVER_DIR  default ./mlflow-server
#   HOST (127.0.0.1: loopback only; 0.0.0.0 for a team), PORT (5000), WORKERS (4)
#   ALLOWED_HOSTS  extra Host headers to accept (comma-separated). MLflow 3.x answers 403 to a Host it
#                  does not know (DNS-rebinding guard; it knows localhost and private IPs): with a
#                  non-loopback HOST this script adds this host's names, so the printed address works.
# MLflow's GenAI job runner is turned off (MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false): a tracking
# server does not need it, and it costs ~8 processes and ~1.4 GB.
# Never put passwords in the command line of a shared machine: use ~/.pgpass or a secrets file.
set -euo pipefail
ROOT="${MLFLOW_SERVER_DIR:-$PWD/mlflow-server}"
mkdir -p "$ROOT/artifacts"
BACKEND_URI="${BACKEND_URI:-sqlite:///$ROOT/mlflow.db}"
ARTIFACT_ROOT="${ARTIFACT_ROOT:-$ROOT/artifacts}"
HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-5000}"
export MLFLOW_DISABLE_TELEMETRY=true
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false

allowed="${ALLOWED_HOSTS:-}"
case "$HOST" in
  127.*|localhost|::1) address="http://127.0.0.1:$PORT" ;;
  *)
    fqdn="$(hostname -f 2>/dev/null || hostname)"
    short="$(hostname -s 2>/dev/null || hostname)"
    address="http://$fqdn:$PORT"
    for name in "$fqdn" "$short"; do allowed="${allowed:+$allowed,}$name,$name:$PORT"; done
    [ "$HOST" = 0.0.0.0 ] || allowed="$allowed,$HOST,$HOST:$PORT"
    ;;
esac
security=()
if [ -n "$allowed" ]; then security=(--allowed-hosts "localhost,localhost:*,127.0.0.1,127.0.0.1:*,$allowed"); fi

echo "MLFLOW_TRACKING_URI=$address"
echo "MLflow server on $HOST:$PORT; backend ${BACKEND_URI%%://*}://...; artifacts $ARTIFACT_ROOT" >&2
PY="${PYTHON:-python}"
exec "$PY" -m mlflow server \
  --backend-store-uri "$BACKEND_URI" \
  --artifacts-destination "$ARTIFACT_ROOT" \
  --serve-artifacts \
  --host "$HOST" --port "$PORT" \
  --workers "${WORKERS:-4}" \
  "${security[@]}"
