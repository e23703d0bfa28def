#!/usr/bin/env bash
# Session 31, last job (about 3 minutes of device time left): the K/V multicast with a soft
# cap at head dim 128 (Llama-3.1-8B heads, cap 50; Gemma-2-27B's global layers are this kind
# with group 2), the served long picks with and without it, pages 16 and 128.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
L128=queue_with_work+pv_wait_mid+q_tma+v_warp+lazy_max
L16=queue_with_work+pv_wait_mid+q_tma+v_warp+wide_box+pages_ahead+lazy_max
run n31e-pre 60 bash -c "python3 tools/precompile.py --model llama-3.1-8b -j 8 --softcap --pages 128 --configs '$L128 $L128+kv_multicast' & python3 tools/precompile.py --model llama-3.1-8b -j 8 --softcap --pages 16 --configs '$L16 $L16+kv_multicast' & wait"
tail -3 $OUT/n31e-pre-$G-$COMMIT.log
run n31e-cap-p16 50 python3 benchmarks/variants_ab.py --softcap 50 --variants "$L16 $L16+kv_multicast" --pages 16 --cases 4kx4,8kx2,16kx1 --rounds 3
run n31e-cap-p128 50 python3 benchmarks/variants_ab.py --softcap 50 --variants "$L128 $L128+kv_multicast" --pages 128 --cases 4kx4,8kx2,16kx1 --rounds 3
grep -E "kv_multicast|lazy_max " $OUT/n31e-cap-p*-$G-$COMMIT.log | tail -12
