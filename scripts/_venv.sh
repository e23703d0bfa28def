# Shared by scripts/*.sh: make sure $VENV holds vllm-fa4 (editable) and its pinned stack.
# Usage: VENV=.venv EXTRAS="[dev]" FRESH=0 PYTHON=python3 VLLM_VERSION=0.26.0 source scripts/_venv.sh
# VLLM_VERSION: 0.26.0, the version verified on the GPU, unless asked (README, Compatibility).
# The package needs Python >= 3.11: an older one is refused before anything is made, and a
# venv made by another Python version (e.g. an earlier run with 3.10) is rebuilt, not reused.
# FRESH=1 rebuilds the venv whatever it holds.
VENV="${VENV:-.venv}"
VLLM_VERSION="${VLLM_VERSION:-0.26.0}"
MIN_PYTHON=3.11

# "X.Y.Z" of interpreter $1, or nothing when it does not run.
python_version() { "$1" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null; }
# True when version $1 (X.Y[.Z]) is at least $MIN_PYTHON.
new_enough() {
  local major minor want_major want_minor
  IFS=. read -r major minor _ <<<"$1"
  IFS=. read -r want_major want_minor <<<"$MIN_PYTHON"
  [ -n "$major" ] && { [ "$major" -gt "$want_major" ] ||
    { [ "$major" -eq "$want_major" ] && [ "$minor" -ge "$want_minor" ]; }; }
}

# The interpreter: $PYTHON if set, else the first of python3, python3.13, ... that is new enough.
if [ -n "${PYTHON:-}" ]; then
  candidates=("$PYTHON")
else
  candidates=(python3 python3.13 python3.12 python3.11)
fi
PYTHON_BIN="" PYTHON_VERSION="" first_found=""
for candidate in "${candidates[@]}"; do
  version=$(python_version "$candidate") || true
  [ -n "$version" ] && [ -z "$first_found" ] && first_found="$candidate is $version"
  if [ -n "$version" ] && new_enough "$version"; then
    PYTHON_BIN=$candidate PYTHON_VERSION=$version
    break
  fi
done
if [ -z "$PYTHON_BIN" ]; then
  echo "vllm-fa4 needs Python >= $MIN_PYTHON (${first_found:-no ${candidates[*]} runs here})." >&2
  echo "Install one and run again with PYTHON=/path/to/python$MIN_PYTHON $0" >&2
  exit 1
fi

if [ "${FRESH:-0}" = 1 ]; then rm -rf "$VENV"; fi
if [ -e "$VENV" ]; then
  venv_version=$(python_version "$VENV/bin/python") || true
  if [ "${venv_version%.*}" != "${PYTHON_VERSION%.*}" ]; then
    echo "== $VENV was made by Python ${venv_version:-that no longer runs}, not $PYTHON_VERSION" \
      "($PYTHON_BIN): rebuilding it"
    rm -rf "$VENV"
  fi
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV with Python $PYTHON_VERSION ($PYTHON_BIN)"
  "$PYTHON_BIN" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip uv
fi
if ! "$VENV/bin/python" -c "import vllm_fa4, vllm" 2>/dev/null || [ "${FRESH:-0}" = 1 ]; then
  echo "== installing vllm-fa4${EXTRAS:-} into $VENV (vllm==$VLLM_VERSION with CUDA torch: ~8 GB," \
    "about 3 minutes)"
  # uv draws its progress bars on a terminal; elsewhere (CI logs) it prints one line per phase,
  # and the list of installed packages is left out there.
  if [ -t 2 ]; then
    "$VENV/bin/uv" pip install -p "$VENV/bin/python" "vllm==$VLLM_VERSION" -e ".${EXTRAS:-}"
  else
    "$VENV/bin/uv" pip install -p "$VENV/bin/python" "vllm==$VLLM_VERSION" -e ".${EXTRAS:-}" 2>&1 |
      grep -v '^ [-+~] '
  fi
fi
