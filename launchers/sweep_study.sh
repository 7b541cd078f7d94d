#!/usr/bin/env bash
# The canonical sweeps of the study grid (conf/grid/study.yaml, conf/experiment/study.yaml):
# eight topologies x {qwen, qwen_122b} x seeds {0,1,2} on the 50 eval IDs, as one Hydra multirun
# (an MLflow parent run with one child per cell). Cells are resumable: rerun the same command
# after an interruption and finished problems are skipped.
#
#   launchers/sweep_study.sh local          # cells one after another on this machine
#   launchers/sweep_study.sh parallel       # a few cells at once (joblib)
#   launchers/sweep_study.sh slurm          # one SLURM job per cell (submitit)
#   launchers/sweep_study.sh ray            # cells as Ray tasks on a running cluster (RAY_ADDRESS)
#   launchers/sweep_study.sh local model=qwen seed=0     # any extra override narrows or changes the sweep
#
# Before: a model endpoint (launchers/serve_vllm.sh; export VLLM_BASE_URL=...). For slurm/ray, a shared
# tracking server (launchers/mlflow_server.sh; export MLFLOW_TRACKING_URI=http://...), since cells on
# several nodes must not share one SQLite file. Optimizer cells (optimizer=maspo,gepa) are added with
# OPTIMIZERS=none,maspo,gepa once the optimizer runner is available.
set -euo pipefail
mode="${1:-local}"; shift || true
PY="${PYTHON:-python}"
case "$mode" in
  local)    launcher=() ;;
  parallel) launcher=(hydra/launcher=local_parallel) ;;
  slurm)    launcher=(hydra/launcher=slurm) ;;
  ray)      launcher=(hydra/launcher=ray_cluster) ;;
  *) echo "usage: $0 local|parallel|slurm|ray [override ...]" >&2; exit 2 ;;
esac
if [ "$mode" = slurm ] || [ "$mode" = ray ]; then
  case "${MLFLOW_TRACKING_URI:-}" in
    http://*|https://*|postgresql*|mysql*) ;;
    *) echo "sweep_study.sh: set MLFLOW_TRACKING_URI to a tracking server (launchers/mlflow_server.sh) for $mode sweeps" >&2; exit 2 ;;
  esac
fi
: "${VLLM_BASE_URL:?set VLLM_BASE_URL to the vLLM endpoint (launchers/serve_vllm.sh)}"
extra=()
if [ -n "${OPTIMIZERS:-}" ]; then extra+=("optimizer=$OPTIMIZERS"); fi
set -x
exec "$PY" -m apps_bench experiment=study "${launcher[@]}" "${extra[@]}" "$@"
