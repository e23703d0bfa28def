#!/usr/bin/env bash
# One GPU-machine session in one command (the lent H100/H200 has no network; its packages come
# from the gpu-kit unpacked under /tmp/site). Steps: see the case list at the bottom.
#   OUT=/path/for/logs bash tools/gpu_session.sh env tests bench serve
# Every step has its own time limit and log under $OUT; a failing step doesn't stop the others.
# `pack` tars $OUT into $PACK (the device tool returns at most 8 files per call).
# Multi-GPU runs: NVLink multicast is off on the lent machines, so vLLM's fused FlashInfer
# all-reduce (auto-picks `mnnvl`, which needs multicast) is turned off for TP > 1 (servetp).
# Serving soak (benchmarks/soak.py, docs/reliability.md), one backend per call (each call of
# the device tool is limited to 10 minutes); results gather in $SOAK_OUT (default /tmp/soak,
# kept while the machine stays warm) and the combined report is copied to $OUT:
#   bash tools/gpu_session.sh jitwarm                      # once per fresh machine, first
#   SOAK_BACKEND=FA4 bash tools/gpu_session.sh soak          # 5 min of load (SOAK_MINUTES)
#   SOAK_BACKEND=FLASH_ATTN bash tools/gpu_session.sh soak   # merged with FA4's: soak.md
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu-check}"; mkdir -p "$OUT"
source tools/kit_site.sh
kit_site_check || exit 1
export PYTHONPATH="$KIT_SITE:$KIT_SITE/nvidia_cutlass_dsl/dsl_packages:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 VLLM_FA4_CACHE_DIR="${VLLM_FA4_CACHE_DIR:-$HOME/.cache/vllm_fa4/kernels}"
PY=python3
VLLM="$PY -m vllm.entrypoints.cli.main"
MODEL=configs/llama-3.1-8b

provenance() {  # provenance CMD...: a log's first two lines: the commit (COMMIT, set by the
  # caller: the device copy has no .git), the machine, the date and the command
  echo "# commit=${COMMIT:-unknown} gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -1) date=$(date -u +%FT%TZ)"
  echo "# command: $*"
}

step() {  # step NAME SECONDS CMD...
  local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit}s)"
  local t0=$SECONDS
  provenance "$@" > "$OUT/$name.log"  # in every log
  timeout -k 10 "$limit" bash -c "$*" >> "$OUT/$name.log" 2>&1
  local rc=$?
  echo "=== $name rc=$rc in $((SECONDS - t0))s"
  tail -n "${TAIL:-25}" "$OUT/$name.log"
}

install() {
  $PY -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
  $PY -c "import vllm, cutlass, torch, vllm_fa4; print('vllm', vllm.__version__, 'cutlass',
cutlass.__version__, 'torch', torch.__version__, torch.cuda.get_device_name())"
}

serve_check() {
  $VLLM serve $MODEL --load-format dummy --attention-backend FA4 --max-model-len 8192 \
    --gpu-memory-utilization 0.85 --port 8011 > "$OUT/serve-server.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 150); do
    curl -sf localhost:8011/health > /dev/null && break
    kill -0 $pid 2> /dev/null || break
    sleep 2
  done
  local prompt; prompt=$($PY -c "print('The quick brown fox jumps over the lazy dog. ' * 60)")
  curl -s localhost:8011/v1/completions -H 'Content-Type: application/json' \
    -d "{\"model\": \"$MODEL\", \"prompt\": \"$prompt\", \"max_tokens\": 16}"
  echo
  kill $pid; wait $pid 2> /dev/null
  grep -E "FA4|fa4|Using .*backend|Traceback|Error" "$OUT/serve-server.log" | head -40
}

throughput_check() {
  $VLLM bench throughput --model $MODEL --load-format dummy --attention-backend FA4 \
    --dataset-name random --random-input-len 4096 --random-output-len 1 --num-prompts 100 \
    --max-model-len 8192 2>&1 | grep -E "Throughput|FA4 prefill|Using .*backend|Error|Traceback"
}

variant_tests() {  # the opt-in kernel variants on the bf16 hd 64/128 keys + edge cases
  VLLM_FA4_TEST_VARIANTS="${VARIANTS:-one_per_cta+serial queue+overlap}" $PY -m pytest tests/gpu/test_kernel.py \
    -q -p no:cacheprovider -n 4 -k "${VARIANT_TESTS_K-not 256 and not dtype1 and not gqa}"
}

soak_cleanup() {  # a server left behind by a killed soak: its process group id is in a file
  local f
  for f in "$SOAK_OUT"/server-*.pgid; do
    [ -f "$f" ] || continue
    kill -KILL -- "-$(cat "$f")" 2> /dev/null && echo "killed the leftover server group $(cat "$f")"
    rm -f "$f"
  done
}

soak_copy() {  # the soak's report (and this backend's files) where the device tool returns them
  cp "$SOAK_OUT"/soak.md "$SOAK_OUT"/soak.json "$OUT"/ 2> /dev/null
  [ -n "${1:-}" ] && cp "$SOAK_OUT/soak-$1.json" "$SOAK_OUT/server-$1.log" "$OUT"/ 2> /dev/null
  ls "$OUT"
}

SOAK_OUT="${SOAK_OUT:-/tmp/soak}"
SOAK_MINUTES="${SOAK_MINUTES:-5}"  # whole minutes; over 5 needs a call longer than 10 minutes
SOAK_LIMIT="${SOAK_LIMIT:-$((SOAK_MINUTES * 60 + 290))}"
export OUT PY VLLM MODEL SOAK_OUT
race_shards() {  # race_shards N LOG ARGS...: racecheck over sanitize_served.py ARGS, N
  # processes side by side (--shard I/N), their logs joined into LOG
  local n=$1 log=$2 i t0=$SECONDS; shift 2
  local cmd="compute-sanitizer --tool racecheck --report-api-errors no --error-exitcode 3 --print-limit 20"
  for i in $(seq 0 $((n - 1))); do
    $cmd $PY tools/sanitize_served.py "$@" --shard "$i/$n" > "$log.shard$i" 2>&1 &
  done
  wait
  { provenance "$cmd $PY tools/sanitize_served.py $* --shard I/$n (I = 0..$((n - 1)), side by side)"
    for i in $(seq 0 $((n - 1))); do cat "$log.shard$i"; done
    echo "# wall $((SECONDS - t0)) s"; } > "$log"
  rm -f "$log".shard*
}
sanitize() {  # compute-sanitizer over every served config (tools/sanitize_served.py), 16-bit
  # and FP8 builds as separate runs (each fits the step's limit; together they may not: one
  # tool a call, e.g. SANITIZE_TOOLS=racewrap, about 4-5 minutes a set on an H100; one set:
  # SANITIZE_SETS=fp8-only; a part of a set by shape label: SANITIZE_ONLY='hd256 p16 .*w')
  local only=()
  [ -n "${SANITIZE_ONLY:-}" ] && only=(--only "$SANITIZE_ONLY")
  $PY tools/sanitize_served.py --precompile -j "${SANITIZE_JOBS:-14}" "${only[@]}" | tail -1
  local tool set
  for set in ${SANITIZE_SETS:-no-fp8 fp8-only}; do
    for tool in ${SANITIZE_TOOLS:-memcheck synccheck racecheck racewrap}; do
      echo "--- $tool --$set ${only[*]}"
      local log="$OUT/sanitize-$tool-$set.log"
      if [ "$tool" = racewrap ]; then  # ring wraps and tile changes: WRAP on 16 CTAs
        race_shards 16 "$log" --$set --wrap --ctas 16 "${only[@]}"
      elif [ "$tool" = racecheck ]; then  # ~40 s a short batch: the short ones
        race_shards 12 "$log" --$set --short-only "${only[@]}"
      else
        local cmd=(compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 3
          --print-limit 20 $PY tools/sanitize_served.py --$set "${only[@]}")
        { provenance "${cmd[@]}"; "${cmd[@]}" 2>&1; } > "$log"
        echo "rc=$?"
      fi
      grep -E "ERROR SUMMARY|RACECHECK SUMMARY|wrong|BAD" "$log" | sort | uniq -c
    done
  done
}

export -f provenance install serve_check throughput_check variant_tests race_shards sanitize
for s in "$@"; do
  case $s in
    env) step install 300 install; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv ;;
    tests) step gpu-tests 420 $PY -m pytest tests/gpu -x -q -p no:cacheprovider ;;
    kernel) step kernel-tests 420 $PY -m pytest tests/gpu/test_kernel.py -x -q -p no:cacheprovider ;;
    sched) step sched-tests 300 $PY -m pytest tests/gpu/test_tile_scheduler.py -q -n 4 -p no:cacheprovider ;;
    backend) step backend-tests 300 $PY -m pytest tests/gpu/test_backend_gpu.py -x -q ;;
    bench) step bench-quick 300 $PY benchmarks/variants_ab.py ;;
    overhead) step launch-overhead 300 $PY benchmarks/launch_overhead.py ;;
    sweep) TAIL=80 step kernel-sweep 560 $PY benchmarks/kernels.py --out $OUT/sweep ${SWEEP_ARGS:-} ;;
    sweep8b) TAIL=40 step kernel-sweep-8b 420 $PY benchmarks/kernels.py --models llama-3.1-8b \
      --cases all --block-sizes 16,128 --out $OUT/k8b ;;
    sweepother) TAIL=40 step kernel-sweep-other 420 $PY benchmarks/kernels.py --block-sizes 16 \
      --models llama-3.2-1b,llama-3.1-70b-tp4,llama-3.1-70b-tp8 --cases all --out $OUT/kother ;;
    variants) step variant-tests 300 variant_tests
      step variant-bench 200 $PY benchmarks/variants_ab.py --pages 16,128 \
        --variants "'${VARIANTS_AB:-default one_per_cta+serial queue+overlap}'" ;;
    servebench) TAIL=60 step serve-bench 590 $PY benchmarks/serving.py serve --merge \
      --out "${SERVE_OUT:-/tmp/serving}" ${SERVE_ARGS:-} ;;
    servethr) TAIL=60 step serve-throughput 590 $PY benchmarks/serving.py throughput --merge \
      --out "${SERVE_OUT:-/tmp/serving}" ${SERVE_ARGS:-} ;;
    servetp) TAIL=60 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
      VLLM_FLASHINFER_ALLREDUCE_BACKEND=trtllm VLLM_ALLREDUCE_USE_SYMM_MEM=0 \
      step serve-tp2 590 $PY benchmarks/serving.py serve -tp 2 --out $OUT/tp2 \
      "'--extra-args=-cc.pass_config.fuse_allreduce_rms=false'" ${SERVE_ARGS:-} ;;
    ab) TAIL=80 step ab "${AB_LIMIT:-400}" $PY benchmarks/variants_ab.py --rounds "${AB_ROUNDS:-3}" \
      --pages "${AB_PAGES:-16,128}" --cases "'${AB_CASES:-4kx4,8kx2,16kx1,2k@4k x8,2k@64k}'" \
      --variants "'${VARIANTS_AB:-default}'" ;;
    ncu) TAIL=200 step ncu 400 ncu --clock-control none --profile-from-start off \
      -k "'regex:${NCU_KERNELS:-Sm90PagedPrefill|device_kernel}'" --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
      --metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct \
      $PY benchmarks/profile_case.py --case "'${NCU_CASE:-8kx2}'" --page "${NCU_PAGE:-128}" \
      --contenders "'${VARIANTS_AB:-default}'" ;;
    pack) tar -C "$OUT" -czf "${PACK:?}" . && ls -la "$PACK" ;;
    smollm2) TAIL=60 step smollm2 560 $PY tests/e2e/smollm2_accuracy.py --out $OUT/smollm2 ;;
    # issue 30: FA4 and FLASH_ATTN on an FP8 cache, each against the bf16 cache (about 4 min)
    smollm2fp8) TAIL=30 step smollm2-fp8 560 $PY tests/e2e/smollm2_accuracy.py --enforce-eager \
      --backends FLASH_ATTN,FA4-fp8,FLASH_ATTN-fp8 --out $OUT/smollm2-fp8 ;;
    fp8ab) TAIL=40 step fp8-ab 300 $PY benchmarks/fp8_ab.py --rounds 2 \
      --cases "'${FP8_CASES:-4kx4,16kx1,2k@64k}'" ;;
    # issue 30: each contender's error against float64 references at 32k-128k keys
    fp8acc) TAIL=40 step fp8-accuracy 420 $PY benchmarks/fp8_ab.py --accuracy \
      --models "${FP8_MODELS:-llama-3.1-8b,gemma-2-9b}" --pages 16 ;;
    serve) TAIL=60 step serve 420 serve_check ;;
    # FlashInfer JIT-builds its sampling module (~95 s, 16 cores) the first time any vLLM
    # server samples on a fresh machine (docs/reliability.md); build it once, outside the
    # soak's time budget, so neither backend's 5 minutes of load get shortened by it.
    jitwarm) step flashinfer-jit 300 $PY -c "'import flashinfer.sampling as s; s.get_sampling_module()'" ;;
    soak) TAIL=80 step "soak-${SOAK_BACKEND:=FA4}" "$SOAK_LIMIT" $PY benchmarks/soak.py \
        --backends "$SOAK_BACKEND" --minutes "$SOAK_MINUTES" --budget-s $((SOAK_LIMIT - 20)) \
        --drain-timeout 60 --merge --out "$SOAK_OUT" ${SOAK_ARGS:-}
      soak_cleanup; soak_copy "$SOAK_BACKEND" ;;
    soakreport) TAIL=80 step soak-report 60 $PY benchmarks/soak.py --report-only --out "$SOAK_OUT"
      soak_copy ;;
    throughput) step throughput 420 throughput_check ;;
    sanitize) TAIL=40 step sanitize "${SANITIZE_LIMIT:-580}" sanitize ;;
    *) echo "unknown step $s" ;;
  esac
done
