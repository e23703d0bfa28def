# Shared by scripts/*.sh: make sure $VENV holds vllm-fa4 (editable) and its pinned stack.
# Usage: VENV=.venv EXTRAS="[dev]" FRESH=0 VLLM_VERSION=0.26.0 source scripts/_venv.sh
# VLLM_VERSION: 0.26.0, the version verified on the GPU, unless asked (README, Compatibility).
VENV="${VENV:-.venv}"
VLLM_VERSION="${VLLM_VERSION:-0.26.0}"
if [ "${FRESH:-0}" = 1 ]; then rm -rf "$VENV"; fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip uv
fi
if ! "$VENV/bin/python" -c "import vllm_fa4, vllm" 2>/dev/null || [ "${FRESH:-0}" = 1 ]; then
  echo "== installing vllm-fa4${EXTRAS:-} into $VENV (vllm==$VLLM_VERSION with CUDA torch: ~8 GB)"
  "$VENV/bin/uv" pip install -q -p "$VENV/bin/python" "vllm==$VLLM_VERSION" -e ".${EXTRAS:-}"
fi
