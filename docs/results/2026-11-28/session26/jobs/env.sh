# Sourced by the job scripts on the GPU machine: the kit's site, a log per command under $OUT.
export PYTHONPATH=$PWD:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages
COMMIT=$(cat gpu_runs/COMMIT 2>/dev/null || echo unknown)
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
  *H200*) G=h200 ;; *H100*) G=h100 ;; *) G=gpu ;;
esac
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
run() {  # run NAME LIMIT_S CMD...: $OUT/NAME-$G-$COMMIT.log with a header and the exit code
  local name=$1 limit=$2; shift 2
  local log=$OUT/$name-$G-$COMMIT.log t0=$SECONDS rc=0
  { echo "# commit=$COMMIT gpu=$GPU_NAME date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# command: $*"; } > "$log"
  timeout "$limit" "$@" >> "$log" 2>&1 || rc=$?
  echo "# rc=$rc in $((SECONDS - t0)) s" >> "$log"
  echo "$name rc=$rc $((SECONDS - t0))s"
}
