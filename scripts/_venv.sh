# Shared by scripts/*.sh: make sure $VENV holds vllm-fa4 (editable) and its pinned stack.
# Usage: VENV=.venv EXTRAS="[dev]" FRESH=0 source scripts/_venv.sh
VENV="${VENV:-.venv}"
if [ "${FRESH:-0}" = 1 ]; then rm -rf "$VENV"; fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip uv
fi
if ! "$VENV/bin/python" -c "import vllm_fa4, vllm" 2>/dev/null || [ "${FRESH:-0}" = 1 ]; then
  echo "== installing vllm-fa4${EXTRAS:-} into $VENV (vllm==0.26.0 with CUDA torch: ~8 GB)"
  "$VENV/bin/uv" pip install -q -p "$VENV/bin/python" -e ".${EXTRAS:-}"
fi
