#!/usr/bin/env bash
# Session 30, second job: claim_cluster's fuzz, racecheck / synccheck, more cases, the board's
# power limit and clocks. The branch's tree (gpu_runs/kvmc, wip/kv-multicast at a1b746d).
set -u; source gpu_runs/env.sh
cd gpu_runs/kvmc; COMMIT=$(cat COMMIT)
export PYTHONPATH=$PWD:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
L128=queue_with_work+pv_wait_mid+q_tma+v_warp+lazy_max
L16=queue_with_work+pv_wait_mid+q_tma+v_warp+wide_box+pages_ahead+lazy_max
C128=$L128+kv_multicast+claim_cluster; C16=$L16+kv_multicast+claim_cluster
nvidia-smi -q -d POWER,CLOCK,PERFORMANCE,TEMPERATURE > $OUT/n30-smi-$G-$COMMIT.txt 2>&1
run n30b-pre 150 bash -c "python3 tools/precompile.py --model llama-3.1-8b -j 8 --pages 128 --configs '$L128 $C128' & python3 tools/precompile.py --model llama-3.1-8b -j 8 --pages 16 --configs '$L16 $C16' & wait"
run n30-fuzz-cc 150 env VLLM_FA4_FUZZ_SEED=98 VLLM_FA4_FUZZ_COUNT=150 VLLM_FA4_TEST_VARIANTS="$C128 $C16" python3 -m pytest tests/gpu/test_fuzz.py -m gpu -n 14 -q -x -p no:cacheprovider
tail -3 $OUT/n30-fuzz-cc-$G-$COMMIT.log
run n30-race-cc 130 env VLLM_FA4_VARIANT=$C16 compute-sanitizer --tool racecheck python3 tools/sanitize_served.py --wrap --ctas 16 --no-fp8 --only 'hd128 p16'
tail -4 $OUT/n30-race-cc-$G-$COMMIT.log
run n30-sync-cc 80 env VLLM_FA4_VARIANT=$C128 compute-sanitizer --tool synccheck python3 tools/sanitize_served.py --no-fp8 --only 'hd128 p128'
tail -4 $OUT/n30-sync-cc-$G-$COMMIT.log
run n30-ab-cc-more-p16 100 python3 benchmarks/variants_ab.py --variants "$L16 $C16" --pages 16 --cases "2k@16k x2,16k+31x512,16k@16k,512x32" --rounds 3
run n30-ab-cc-more-p128 80 python3 benchmarks/variants_ab.py --variants "$L128 $C128" --pages 128 --cases "2k@8k x4,2k@64k,1kx16" --rounds 3
