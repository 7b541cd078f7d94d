#!/usr/bin/env bash
# Before a study spends GPU hours: one command on the GPU node that starts vLLM with the preset,
# runs the server check, then all eight runners on three problems, and prints a verdict.
#
#   launchers/first_gpu_run.sh              # model=qwen: launchers/serve_vllm.sh qwen, then the checks
#   launchers/first_gpu_run.sh qwen_122b    # another preset (qwen, qwen_122b, qwen_thinking)
#
# Everything lands in OUT (first-gpu-run/<date-time>): server.log, check.json, cells/<topology>/,
# cells/<topology>.log; the verdict is printed last (python -m apps_bench.launchers.first_run OUT).
# Exit 0: ready for a study. 1: not ready (each reason with what to change). 2: bad settings.
#
# Settings (environment):
#   SERVER_CMD     how the server starts (default: launchers/serve_vllm.sh PRESET, with HOST/PORT below);
#                  none: a server is already up at VLLM_BASE_URL, or the preset starts its own (gold, local)
#   PORT           (8000) the server's port on 127.0.0.1; VLLM_BASE_URL is set from it
#   READY_TIMEOUT_S (1800) how long the server may take to load the model
#   LIMIT          (3) problems per runner; DATASET_ARGS ("dataset=apps"): where they come from
#                  (no network on the node: DATASET_ARGS="dataset=apps dataset.path=/data/apps/test.jsonl")
#   TOPOLOGIES     (all eight) the runners to try
#   EXTRA          more overrides for the check and every cell (e.g. "model.max_tokens=1024")
#   KEEP_SERVER=1  leave the server running afterwards (its process group id is printed)
#   OUT, PYTHON    where results go; the Python with apps-bench installed (python)
set -euo pipefail

die() { echo "first_gpu_run.sh: $*" >&2; exit 2; }
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

MODEL="${1:-qwen}"
PYTHON="${PYTHON:-python}"
PORT="${PORT:-8000}"
LIMIT="${LIMIT:-3}"
READY_TIMEOUT_S="${READY_TIMEOUT_S:-1800}"
DATASET_ARGS="${DATASET_ARGS:-dataset=apps}"
TOPOLOGIES="${TOPOLOGIES:-single independent sequential_langgraph sequential_crewai centralized_langgraph centralized_autogen decentralized_langgraph decentralized_openai}"
OUT="${OUT:-first-gpu-run/$(date +%Y%m%d-%H%M%S)}"
read -r -a extra <<< "${EXTRA:-}"
read -r -a dataset <<< "$DATASET_ARGS"
[[ "$LIMIT" =~ ^[1-9][0-9]*$ ]] || die "LIMIT=$LIMIT is not a positive number of problems"
"$PYTHON" -c 'import apps_bench, pathlib, sys
sys.exit(not (pathlib.Path(apps_bench.__file__).parent / "conf" / "model" / (sys.argv[1] + ".yaml")).is_file())' "$MODEL" \
  || die "no model preset '$MODEL' (apps_bench/conf/model/), or no apps-bench in $PYTHON: use qwen, qwen_122b or qwen_thinking"

if [ -z "${SERVER_CMD+x}" ]; then
  SERVER_CMD="HOST=127.0.0.1 PORT=$PORT $here/serve_vllm.sh $MODEL"
fi
mkdir -p "$OUT/cells"
OUT="$(cd "$OUT" && pwd)"

# --- 1. the server
server_pgid=""
stop_server() {
  if [ -n "$server_pgid" ] && [ "${KEEP_SERVER:-0}" != 1 ]; then
    kill -TERM -- "-$server_pgid" 2>/dev/null || true
    for _ in $(seq 1 30); do kill -0 -- "-$server_pgid" 2>/dev/null || return 0; sleep 1; done
    kill -KILL -- "-$server_pgid" 2>/dev/null || true
  fi
}
trap stop_server EXIT
trap 'exit 130' INT TERM

if [ "$SERVER_CMD" != none ]; then
  export VLLM_BASE_URL="http://127.0.0.1:$PORT/v1"
  echo "first_gpu_run.sh: starting the server: $SERVER_CMD (log: $OUT/server.log)" >&2
  setsid bash -c "$SERVER_CMD" > "$OUT/server.log" 2>&1 < /dev/null &
  server_pgid=$!
  [ "${KEEP_SERVER:-0}" = 1 ] && echo "first_gpu_run.sh: the server's process group: $server_pgid (kill -- -$server_pgid stops it)" >&2
  key_file="${API_KEY_FILE:-$HOME/.config/apps-bench/vllm-api-key}"
  deadline=$((SECONDS + READY_TIMEOUT_S))
  until "$PYTHON" - "$VLLM_BASE_URL" "${OPENAI_API_KEY:-$( [ -s "$key_file" ] && cat "$key_file" || echo EMPTY)}" <<'EOF' 2>/dev/null
import sys, urllib.request
req = urllib.request.Request(sys.argv[1] + "/models", headers={"Authorization": "Bearer " + sys.argv[2]})
urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=5).read()
EOF
  do
    kill -0 "$server_pgid" 2>/dev/null || { tail -n 30 "$OUT/server.log" >&2; die "the server exited while starting (log above: $OUT/server.log)"; }
    [ "$SECONDS" -lt "$deadline" ] || { tail -n 30 "$OUT/server.log" >&2; die "the server did not answer $VLLM_BASE_URL/models within ${READY_TIMEOUT_S}s (READY_TIMEOUT_S)"; }
    sleep 5
  done
  if [ -z "${OPENAI_API_KEY:-}" ] && [ -s "$key_file" ]; then OPENAI_API_KEY="$(cat "$key_file")"; export OPENAI_API_KEY; fi
  echo "first_gpu_run.sh: the server answers at $VLLM_BASE_URL" >&2
fi

# --- 2. the server check (exit 1 = an item failed: the cells still run, the verdict says why)
set +e
"$PYTHON" -m apps_bench.check "model=$MODEL" "server_check.json=$OUT/check.json" "${extra[@]}" 2> "$OUT/check.log"
rc=$?
set -e
echo "$rc" > "$OUT/check.rc"
if [ "$rc" = 2 ]; then cat "$OUT/check.log" >&2; die "the check could not run (above): fix the settings, then rerun"; fi

# --- 3. every runner on LIMIT problems
for topology in $TOPOLOGIES; do
  echo "first_gpu_run.sh: $topology on $LIMIT problems ..." >&2
  set +e
  "$PYTHON" -m apps_bench "model=$MODEL" "topology=$topology" "${dataset[@]}" "limit=$LIMIT" allow_any_cell=true \
    tracking=none progress=false "out_dir=$OUT/cells/$topology" "${extra[@]}" > "$OUT/cells/$topology.log" 2>&1 < /dev/null
  echo "$?" > "$OUT/cells/$topology.rc"
  set -e
done

# --- 4. the verdict (not exec: the server is stopped on exit)
set +e
"$PYTHON" -m apps_bench.launchers.first_run "$OUT" $TOPOLOGIES
exit $?
