#!/usr/bin/env bash
# vLLM's own attention-backend tests as a lane for FA4: a vLLM release's
# tests/v1/attention/test_attention_backends.py (and the helpers it imports), from the release's
# sdist on PyPI, with tests/upstream/fa4-<version>.patch adding FA4 beside FLASH_ATTN in its
# backend lists. Batches and tolerances are upstream's; configurations FA4 does not support are
# turned away by vLLM's own selector (validate_configuration) inside the patched test, never
# skipped by hand. Releases with a patch: 0.26.0 and 0.33.0.
#
#   tools/upstream_lane.sh prepare [--models DIR]   # network (PyPI): download, check, extract,
#                                                   # patch -> .upstream-lane/ (git-ignored)
#   tools/upstream_lane.sh collect [pytest args]    # pytest --collect-only there (CPU is fine)
#   tools/upstream_lane.sh run [pytest args]        # no network; needs an SM90 GPU
#
# prepare writes everything `run` needs under .upstream-lane/ (a few hundred KB): carry that
# folder to the offline GPU machine. --models DIR copies DIR/ORG/NAME/config.json trees (the
# sliding-window and encoder tests' models) next to the Llama-3-8B config kept in the repo.
# Environment: PY (default .venv/bin/python if present, else python3); FA4_LANE_VLLM (the
# release whose tests prepare fetches; default: the vLLM installed for PY); FA4_LANE_BACKENDS
# (the backends each comparison runs: default FLASH_ATTN,FA4; "all" = upstream's list plus
# FA4); FA4_LANE_K (pytest -k, default "backend_correctness": the four correctness tests;
# "" = all).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
LANE=${FA4_LANE_DIR:-$REPO/.upstream-lane}
FILES=(
  tests/__init__.py
  tests/v1/__init__.py
  tests/v1/attention/test_attention_backends.py
  tests/v1/attention/utils.py
)
TEST=tests/v1/attention/test_attention_backends.py

if [ -z "${PY:-}" ]; then
  if [ -x "$REPO/.venv/bin/python" ]; then PY=$REPO/.venv/bin/python; else PY=python3; fi
fi

die() { echo "upstream_lane: $*" >&2; exit 1; }

installed_vllm() { "$PY" -c "import vllm; print(vllm.__version__)" 2>/dev/null; }

if [ -f "$LANE/MANIFEST" ] && [ "${1:-}" != prepare ]; then  # the release prepare fetched
  VLLM_VERSION=$(sed -n 's/^vllm \([^ ]*\) sdist .*/\1/p' "$LANE/MANIFEST")
else
  VLLM_VERSION=${FA4_LANE_VLLM:-$(installed_vllm || echo 0.26.0)}
fi
case $VLLM_VERSION in
  0.26.0)
    SDIST_URL=https://files.pythonhosted.org/packages/cd/72/fa30f8459d11ae206f1a20bd0ac7ed1b9e390b695fa3dfc9ef6056de0cfe/vllm-0.26.0.tar.gz
    SDIST_SHA256=23e9fa19d7e20ce7dcc1c074d41503e2116d23f19e688f5d5ea91b741f958502
    ;;
  0.33.0)
    SDIST_URL=https://files.pythonhosted.org/packages/f7/25/aa5684e9c59d6fc75f78926b7f15e8d9adc7de2d9e6e7575b80776ad8169/vllm-0.33.0.tar.gz
    SDIST_SHA256=f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112
    ;;
  *) die "no patch for vLLM $VLLM_VERSION's tests (have 0.26.0, 0.33.0); set FA4_LANE_VLLM" ;;
esac
SDIST=vllm-$VLLM_VERSION.tar.gz
PATCH=$REPO/tests/upstream/fa4-$VLLM_VERSION.patch

patch_sum() { sha256sum "$PATCH" "$REPO/tests/upstream/lane_conftest.py" | sha256sum | cut -c1-16; }

download() {  # download DEST: the pinned sdist, checked against its sha256
  local dest=$1 url=$SDIST_URL
  if ! curl -fsSL --retry 3 -o "$dest" "$url"; then
    # The pinned file URL moved: ask PyPI's simple index (JSON) for the same file name.
    url=$("$PY" - "$SDIST" <<'EOF'
import json, sys, urllib.request
req = urllib.request.Request(
    "https://pypi.org/simple/vllm/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
)
files = json.load(urllib.request.urlopen(req, timeout=60))["files"]
print(next(f["url"] for f in files if f["filename"] == sys.argv[1]))
EOF
    ) || die "cannot find $SDIST on PyPI"
    curl -fsSL --retry 3 -o "$dest" "$url" || die "download of $url failed"
  fi
  echo "$SDIST_SHA256  $dest" | sha256sum -c --quiet - || die "$SDIST: sha256 mismatch"
  echo "downloaded $url (sha256 ok)"
}

prepare() {
  local models=""
  while [ $# -gt 0 ]; do
    case $1 in
      --models) models=${2:?--models needs a folder}; shift 2 ;;
      *) die "prepare: unknown argument $1" ;;
    esac
  done
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  download "$tmp/$SDIST"
  # The sdist carries vLLM's tests/ tree (checked: 0.26.0 has 1906 files under tests/).
  tar -xzf "$tmp/$SDIST" -C "$tmp" "${FILES[@]/#/vllm-$VLLM_VERSION/}" \
    || die "$SDIST lacks one of: ${FILES[*]}"
  rm -rf "$LANE"
  mkdir -p "$LANE"
  for f in "${FILES[@]}"; do
    mkdir -p "$LANE/$(dirname "$f")"
    cp "$tmp/vllm-$VLLM_VERSION/$f" "$LANE/$f"
  done
  patch -s -p1 -d "$LANE" --no-backup-if-mismatch < "$PATCH" || die "$(basename "$PATCH") does not apply"
  cp "$REPO/tests/upstream/lane_conftest.py" "$LANE/tests/v1/attention/conftest.py"
  cp -r "$REPO/tests/upstream/models/." "$LANE/"
  rm -f "$LANE/README.md"
  if [ -n "$models" ]; then cp -r "$models/." "$LANE/"; fi
  cat > "$LANE/pytest.ini" <<'EOF'
[pytest]
addopts = -ra -p no:cacheprovider
EOF
  {
    echo "vllm $VLLM_VERSION sdist sha256 $SDIST_SHA256"
    echo "patch+conftest $(patch_sum)"
    echo "models $(cd "$LANE" && find . -name config.json | sort | tr '\n' ' ')"
  } > "$LANE/MANIFEST"
  echo "prepared $LANE:"
  cat "$LANE/MANIFEST"
}

pytest_in_lane() {  # pytest_in_lane ARGS...: pytest on the patched test, from the lane's root
  [ -f "$LANE/MANIFEST" ] || die "no lane at $LANE: run 'tools/upstream_lane.sh prepare' first"
  grep -q "patch+conftest $(patch_sum)" "$LANE/MANIFEST" \
    || die "tests/upstream changed since prepare: run 'tools/upstream_lane.sh prepare' again"
  local have
  have=$("$PY" -c "import vllm; print(vllm.__version__)") || die "vllm does not import with $PY"
  [ "$have" = "$VLLM_VERSION" ] \
    || echo "upstream_lane: WARNING: vllm $have here, the tests are $VLLM_VERSION's"
  cd "$LANE"  # model names such as meta-llama/Meta-Llama-3-8B resolve to folders here
  export PYTHONPATH="$LANE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
  local k=${FA4_LANE_K-backend_correctness}
  "$PY" -m pytest "$TEST" ${k:+-k "$k"} "$@"
}

run() {
  local log=${FA4_LANE_LOG:-$LANE/refusals.tsv} rc=0
  : > "$log"
  export FA4_LANE_LOG=$log VLLM_FA4_PREFILL_ROUTE=${VLLM_FA4_PREFILL_ROUTE:-kernel}
  echo "backends: ${FA4_LANE_BACKENDS:-FLASH_ATTN,FA4}; vLLM $VLLM_VERSION's batches and tolerances"
  (pytest_in_lane -q "$@") || rc=$?
  echo "FA4 turned away by vLLM's selector in $(wc -l < "$log") comparisons, by reason:"
  cut -f2 "$log" | sed 's/^Selected backend .* is not valid for this configuration. //' \
    | sort | uniq -c | sed 's/^/  /'
  return $rc
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
  prepare) prepare "$@" ;;
  collect) pytest_in_lane --collect-only -q "$@" ;;
  run) run "$@" ;;
  *) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 2 ;;
esac
