#!/usr/bin/env bash
# Serve Qwen3.5 with vLLM as an OpenAI-compatible endpoint for apps-bench cells.
#
#   launchers/serve_vllm.sh                 # Qwen/Qwen3.5-9B, thinking off          (model=qwen)
#   launchers/serve_vllm.sh qwen_122b       # Qwen/Qwen3.5-122B-A10B, thinking off   (model=qwen_122b)
#   launchers/serve_vllm.sh qwen_thinking   # Qwen/Qwen3.5-9B, thinking on, 128K context (model=qwen_thinking)
#   launchers/serve_vllm.sh qwen --enable-log-requests   # arguments after the first go to `vllm serve`
#   VLLM_DRY_RUN=1 launchers/serve_vllm.sh  # print the command (and what was decided) instead of running it
#
# It prints what the cells need (VLLM_BASE_URL, MODEL_ID, OPENAI_API_KEY from the key file).
# Every choice below is explained in docs/models.md ("vLLM for the qwen presets").
#
# Knobs (environment):
#   VLLM_VERSION  (0.34.0) the vLLM release this script and the presets were checked against: its
#                 qwen3_coder tool parser and qwen3 reasoning parser were read against the project.
#                 Qwen3.5 needs >= 0.17 and both parsers were rewritten since, so another installed
#                 version is refused; set VLLM_VERSION=<that version> to accept it, then check tool calls.
#   HOST (127.0.0.1: this machine only), PORT (8000). A HOST other than loopback needs a key.
#   API_KEY       unset: the key in API_KEY_FILE (made, mode 600, if missing). API_KEY=<key>: that key.
#                 API_KEY=none: no key (loopback HOST only). The key reaches vLLM as VLLM_API_KEY in
#                 its environment, never on its command line (which `ps` shows to every user).
#   API_KEY_FILE  (~/.config/apps-bench/vllm-api-key) on a shared home, cells on other nodes read it.
#   TP            tensor-parallel size; default: the GPUs of this job (CUDA_VISIBLE_DEVICES, else
#                 SLURM_GPUS_ON_NODE, else `nvidia-smi -L`, which also lists GPUs not allocated).
#   MAX_NUM_SEQS  (256) requests vLLM runs at once = a cell's most requests in flight: concurrency 64
#                 problems x 4 agents at once (independent, decentralized). The presets' model.max_concurrency
#                 is the same number, so no request waits in vLLM's queue on its timeout; change both together.
#   MAX_MODEL_LEN (65536; thinking: 131072) prompt + reply tokens per request.
#   GPU_MEM_UTIL  (0.90)
#   TOOL_CALL_PARSER (qwen3_coder: Qwen3.5 writes tool calls as XML, <function=..><parameter=..>; hermes
#                 reads JSON calls only: Qwen2.5, Qwen3-2504). Required for a model other than the presets.
#   REASONING_PARSER (qwen3; none = off, refused with thinking on) moves <think> text into `reasoning`.
#                 Harmless with thinking off: vLLM gives it the request's enable_thinking.
#   THINKING      (0; 1 for qwen_thinking) the server's default enable_thinking, for requests that do
#                 not say (the presets always say).
#   TEXT_ONLY     (1) --language-model-only: the vision encoder is not loaded; its memory goes to KV cache.
set -euo pipefail

die() { echo "serve_vllm.sh: $*" >&2; exit 2; }

which_model="${1:-qwen}"
shift || true
PIN="${VLLM_VERSION:-0.34.0}"
THINKING="${THINKING:-0}"
case "$which_model" in
  qwen)          MODEL="${MODEL_ID:-Qwen/Qwen3.5-9B}"; family=qwen35 ;;
  qwen_thinking) MODEL="${MODEL_ID:-Qwen/Qwen3.5-9B}"; family=qwen35; THINKING=1 ;;
  qwen_122b)     MODEL="${MODEL_ID:-Qwen/Qwen3.5-122B-A10B}"; family=qwen35 ;;
  -*)            die "the first argument is the preset (qwen, qwen_122b, qwen_thinking) or a model id, not $which_model" ;;
  *)             MODEL="$which_model"; family=other ;;  # any Hugging Face model id
esac
case "$THINKING" in 0|1) ;; *) die "THINKING must be 0 or 1, not '$THINKING'" ;; esac

if [ "$family" = qwen35 ]; then
  TOOL_CALL_PARSER="${TOOL_CALL_PARSER:-qwen3_coder}"
  REASONING_PARSER="${REASONING_PARSER:-qwen3}"
elif [ -z "${TOOL_CALL_PARSER:-}" ]; then
  die "set TOOL_CALL_PARSER for $MODEL (its tool-call format decides: hermes for JSON <tool_call>{...}, qwen3_coder for Qwen3.5/Qwen3-Coder XML; vllm serve --help lists them), and REASONING_PARSER (or none)"
fi
REASONING_PARSER="${REASONING_PARSER:-none}"
if [ "$THINKING" = 1 ]; then
  [ "$REASONING_PARSER" != none ] || die "thinking on needs a reasoning parser (REASONING_PARSER=qwen3): without one the thinking stays in the reply's content, and a program is taken from its drafts"
  MAX_MODEL_LEN="${MAX_MODEL_LEN:-131072}"
  [ "$MAX_MODEL_LEN" -ge 65536 ] || die "thinking on needs MAX_MODEL_LEN >= 65536 (the qwen_thinking preset lets a reply run to 32768 tokens, on top of the conversation), not $MAX_MODEL_LEN"
else
  MAX_MODEL_LEN="${MAX_MODEL_LEN:-65536}"
fi

# --- the GPUs of this allocation
gpus_from="TP"
if [ -z "${TP:-}" ]; then
  if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
    gpus_from="CUDA_VISIBLE_DEVICES"
    TP=0
    IFS=',' read -r -a devices <<< "$CUDA_VISIBLE_DEVICES"
    for d in "${devices[@]}"; do
      case "$d" in ''|NoDevFiles|-1) ;; *) TP=$((TP + 1)) ;; esac
    done
    [ "$TP" -ge 1 ] || die "CUDA_VISIBLE_DEVICES='$CUDA_VISIBLE_DEVICES' leaves no GPU visible (ask the scheduler for one: sbatch --gres=gpu:1)"
  elif [ -n "${SLURM_GPUS_ON_NODE:-}" ]; then
    gpus_from="SLURM_GPUS_ON_NODE"
    TP="$SLURM_GPUS_ON_NODE"
  else
    gpus_from="nvidia-smi -L"
    TP="$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)"
    [ "$TP" -ge 1 ] || { TP=1; gpus_from="no GPU found; 1"; }
  fi
fi
case "$TP" in ''|*[!0-9]*|0) die "TP must be a whole number >= 1, got '$TP' (from $gpus_from)" ;; esac
if [ "$which_model" = qwen_122b ] && [ -z "${MODEL_ID:-}" ] && [ "$TP" -lt 4 ]; then
  echo "serve_vllm.sh: WARNING: Qwen3.5-122B-A10B in BF16 is ~244 GB of weights: 4 GPUs of 80 GB (you have TP=$TP)," \
       "or MODEL_ID=Qwen/Qwen3.5-122B-A10B-FP8 on 2" >&2
fi

# --- the key: required off loopback
HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-8000}"
case "$HOST" in 127.*|localhost|::1) loopback=1 ;; *) loopback=0 ;; esac
API_KEY_FILE="${API_KEY_FILE:-$HOME/.config/apps-bench/vllm-api-key}"
key_note=""
if [ "${API_KEY:-}" = none ]; then
  [ "$loopback" = 1 ] || die "API_KEY=none with HOST=$HOST: anyone who can reach this host could use the GPUs; keep a key (unset API_KEY), or serve on HOST=127.0.0.1"
  unset VLLM_API_KEY
  key_note="no key (loopback only)"
elif [ -n "${API_KEY:-}" ]; then
  export VLLM_API_KEY="$API_KEY"
  key_note="the key in \$API_KEY"
else
  if [ ! -s "$API_KEY_FILE" ]; then
    (umask 077; mkdir -p "$(dirname "$API_KEY_FILE")"
     od -An -N24 -tx1 /dev/urandom | tr -d ' \n' > "$API_KEY_FILE")
    echo "serve_vllm.sh: made a new API key in $API_KEY_FILE (mode 600)" >&2
  fi
  chmod 600 "$API_KEY_FILE"
  VLLM_API_KEY="$(cat "$API_KEY_FILE")"
  export VLLM_API_KEY
  key_note="the key in $API_KEY_FILE"
fi

# --- the pinned vLLM
if command -v vllm >/dev/null 2>&1; then
  installed="$(vllm --version 2>/dev/null | grep -Eo '^[0-9]+\.[0-9]+[^ ]*' | tail -n1 || true)"
  [ "$installed" = "$PIN" ] || die "vllm ${installed:-(version unknown)} is installed; this script and the qwen presets were checked against vLLM $PIN (its Qwen3.5 tool-call and reasoning parsers). Install it: pip install 'vllm==$PIN'. Or accept this one with VLLM_VERSION=${installed:-<version>}, then check that tool calls come back as tool_calls."
elif [ "${VLLM_DRY_RUN:-0}" != 1 ]; then
  die "vllm is not installed here; install it on the GPU machine: pip install 'vllm==$PIN'"
fi

args=(serve "$MODEL"
  --host "$HOST" --port "$PORT"
  --tensor-parallel-size "$TP"
  --max-model-len "$MAX_MODEL_LEN"
  --gpu-memory-utilization "${GPU_MEM_UTIL:-0.90}"
  --max-num-seqs "${MAX_NUM_SEQS:-256}"
  --enable-auto-tool-choice --tool-call-parser "$TOOL_CALL_PARSER"
  --generation-config vllm)  # sampling comes from the preset's requests alone, not the model's generation_config.json
if [ "$REASONING_PARSER" != none ]; then args+=(--reasoning-parser "$REASONING_PARSER"); fi
if [ "$family" = qwen35 ]; then
  if [ "$THINKING" = 1 ]; then thinking_json='{"enable_thinking": true}'; else thinking_json='{"enable_thinking": false}'; fi
  args+=(--default-chat-template-kwargs "$thinking_json")
fi
if [ "${TEXT_ONLY:-1}" = 1 ]; then args+=(--language-model-only); fi
args+=("$@")

cell_host="$HOST"
case "$HOST" in 0.0.0.0|::) cell_host="$(hostname -f 2>/dev/null || hostname)" ;; esac
{
  echo "serving $MODEL on $HOST:$PORT (tp=$TP from $gpus_from; thinking=$THINKING; tool parser $TOOL_CALL_PARSER; reasoning parser $REASONING_PARSER; $key_note)."
  echo "For the cells:"
  echo "  export VLLM_BASE_URL=http://$cell_host:$PORT/v1 MODEL_ID=$MODEL"
  if [ -n "${VLLM_API_KEY:-}" ] && [ -z "${API_KEY:-}" ]; then
    echo "  export OPENAI_API_KEY=\"\$(cat $API_KEY_FILE)\""
  elif [ -n "${VLLM_API_KEY:-}" ]; then
    echo "  export OPENAI_API_KEY=<the same key as API_KEY>"
  fi
} >&2
if [ "${VLLM_DRY_RUN:-0}" = 1 ]; then
  printf 'VLLM_API_KEY=%s' "$([ -n "${VLLM_API_KEY:-}" ] && echo '<set>' || echo '<unset>')"
  printf ' %q' vllm "${args[@]}"
  printf '\n'
  exit 0
fi
exec vllm "${args[@]}"
