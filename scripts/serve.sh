#!/usr/bin/env bash
# Serve a Llama model with the FA4 attention backend. With no model given, serve the embedded
# Llama-3.1-8B config (configs/llama-3.1-8b) with dummy weights. Extra arguments go to vllm serve.
#   scripts/serve.sh                                  # Llama-3.1-8B shapes, random weights
#   scripts/serve.sh meta-llama/Llama-3.1-8B-Instruct --max-model-len 32768
# FA4 runs on SM90 (Hopper) GPUs only: elsewhere this says so before installing anything.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_gpu.sh
if [ -n "$GPU_PROBLEM" ]; then
  echo "scripts/serve.sh: FA4 serving needs an NVIDIA Hopper GPU (SM90: H100, H200, GH200); $GPU_PROBLEM." >&2
  echo "Nothing was installed. Here, run the CPU tests with scripts/test.sh; on another GPU, serve with vLLM's --attention-backend FLASH_ATTN." >&2
  exit 1
fi
source scripts/_venv.sh
if [ $# -eq 0 ] || [[ "$1" == -* ]]; then
  set -- configs/llama-3.1-8b --load-format dummy "$@"
fi
exec "$VENV/bin/vllm" serve "$@" --attention-backend FA4
