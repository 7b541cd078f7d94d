#!/usr/bin/env bash
# Serve Qwen with vLLM as an OpenAI-compatible endpoint for apps-bench cells (model=qwen / qwen_122b).
#
#   launchers/serve_vllm.sh            # Qwen/Qwen3.5-9B on port 8000 (model=qwen)
#   launchers/serve_vllm.sh qwen_122b  # Qwen/Qwen3.5-122B-A10B, tensor-parallel over all visible GPUs
#
# Then, in the shell that runs cells:
#   export VLLM_BASE_URL=http://<this host>:8000/v1
#   python -m apps_bench dataset=apps limit=50 model=qwen
#
# Needs a GPU machine with vLLM installed (`pip install vllm`; not a dependency of apps-bench).
# Knobs (environment): PORT (8000), HOST (0.0.0.0), TP (tensor parallel size; default: all GPUs),
# MAX_MODEL_LEN (32768), GPU_MEM_UTIL (0.90), TOOL_CALL_PARSER (hermes: Qwen's tool-call format),
# API_KEY (unset: no key required; set it and export OPENAI_API_KEY=<same> for the cells),
# MAX_NUM_SEQS (64: comfortably above a cell's concurrency=16 x team size), REASONING_PARSER (unset;
# qwen3 when Qwen's thinking is turned on).
# The seed of every request is honoured (cells pass it), so runs are reproducible per seed.
set -euo pipefail

which_model="${1:-qwen}"
case "$which_model" in
  qwen)      MODEL="${MODEL_ID:-Qwen/Qwen3.5-9B}" ;;
  qwen_122b) MODEL="${MODEL_ID:-Qwen/Qwen3.5-122B-A10B}" ;;
  *)         MODEL="$which_model" ;;  # any Hugging Face model id
esac

if ! command -v vllm >/dev/null 2>&1; then
  echo "serve_vllm.sh: vllm is not installed here; install it on the GPU machine: pip install vllm" >&2
  exit 2
fi

PORT="${PORT:-8000}"
HOST="${HOST:-0.0.0.0}"
if [ -z "${TP:-}" ]; then
  TP="$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' )"
  [ "$TP" -ge 1 ] || TP=1
fi

args=(serve "$MODEL"
  --host "$HOST" --port "$PORT"
  --tensor-parallel-size "$TP"
  --max-model-len "${MAX_MODEL_LEN:-32768}"
  --gpu-memory-utilization "${GPU_MEM_UTIL:-0.90}"
  --max-num-seqs "${MAX_NUM_SEQS:-64}"
  --enable-auto-tool-choice --tool-call-parser "${TOOL_CALL_PARSER:-hermes}"
  --generation-config vllm)
if [ -n "${API_KEY:-}" ]; then args+=(--api-key "$API_KEY"); fi
# Thinking on (model.extra_body.chat_template_kwargs.enable_thinking=true): REASONING_PARSER=qwen3 moves
# the <think> text out of `content` (into `reasoning`), so program extraction never reads the thinking.
if [ -n "${REASONING_PARSER:-}" ]; then args+=(--reasoning-parser "$REASONING_PARSER"); fi

echo "serving $MODEL on $HOST:$PORT (tp=$TP). For the cells:" >&2
echo "  export VLLM_BASE_URL=http://$(hostname -f 2>/dev/null || hostname):$PORT/v1 MODEL_ID=$MODEL" >&2
exec vllm "${args[@]}"
