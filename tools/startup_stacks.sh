#!/usr/bin/env bash
# Where does a vLLM server's startup time go? Starts `vllm serve` (DIAG_BACKEND, default FA4)
# with faulthandler registered on SIGUSR2 in every Python process (a sitecustomize), and once the
# CUDA graphs are captured dumps all Python stacks every 8 s until the engine is ready, into
# $OUT/diag-server-$BACKEND.log; then stops the server. Only processes named python* get the
# signal (SIGUSR2 kills anything without the handler, e.g. a ninja build).
#   OUT=/tmp/out DIAG_BACKEND=FLASH_ATTN bash tools/startup_stacks.sh
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu-check}"; mkdir -p "$OUT"
source tools/kit_site.sh
kit_site_check || exit 1
DIAG=$(mktemp -d)  # private: a sitecustomize runs in every Python process started below
printf 'import faulthandler, signal\nfaulthandler.register(signal.SIGUSR2, all_threads=True)\n' \
  > "$DIAG/sitecustomize.py"
export PYTHONPATH=$DIAG:$KIT_SITE:$KIT_SITE/nvidia_cutlass_dsl/dsl_packages:$PWD/tests
export VLLM_FA4_CACHE_DIR="${VLLM_FA4_CACHE_DIR:-$HOME/.cache/vllm_fa4/kernels}"
B=${DIAG_BACKEND:-FA4}; LOG=$OUT/diag-server-$B.log
python3 -m vllm.entrypoints.cli.main serve configs/llama-3.1-8b --load-format dummy \
  --attention-backend "$B" --max-model-len 32960 --enable-prefix-caching --port 8012 > "$LOG" 2>&1 &
pid=$!
desc() { local p; for p in $(pgrep -P "$1"); do echo "$p"; desc "$p"; done; }
t0=$SECONDS
for _ in $(seq 1 240); do grep -q "Graph capturing finished" "$LOG" && break; sleep 1; done
echo "graphs captured after $((SECONDS - t0)) s"
for _ in $(seq 1 14); do
  grep -q "JIT monitor activated" "$LOG" && break
  sleep 8
  for p in $(desc $pid); do
    case "$(cat /proc/$p/comm 2> /dev/null)" in python*) kill -USR2 "$p" 2> /dev/null ;; esac
  done
done
echo "engine ready after $((SECONDS - t0)) s"
kill $pid; sleep 5; kill -9 $(desc $pid) $pid 2> /dev/null
