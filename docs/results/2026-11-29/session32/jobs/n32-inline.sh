#!/usr/bin/env bash
# Session 32's calls after n32a.sh / n32b.sh, typed in the calls (kept here as run), from the
# repository root on the same H200 (kit loaded, kernel cache /tmp/fa4-kernels warm), at 6c8f0ee.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1
# call 7: FLASH_ATTN alone at 32k (n32a's FLASH_ATTN half was cut off by its limit)
run n32-serve-8b-32k-fa 560 python3 benchmarks/serving.py throughput --model configs/llama-3.1-8b --backends FLASH_ATTN --cases 32768:24 --budget-s 550 --out $OUT/serving32k-fa
# call 8: the 32k pair in one call, FA4 first
run n32-serve-8b-32k-r2 560 python3 benchmarks/serving.py throughput --model configs/llama-3.1-8b --backends FA4,FLASH_ATTN --cases 32768:24 --budget-s 550 --out $OUT/serving32k-r2
# call 9: head dim 256 without a cap, today's picks
run n32-pre-gemma 120 python3 tools/precompile.py --model gemma-2-9b -j 12 --pages 16,128 --configs default
run n32-gemma-nocap-now 330 python3 benchmarks/variants_ab.py --variants default --rounds 3 --model gemma-2-9b --pages 16,128 --cases 4kx4,8kx2,16kx1,2k@64k
# call 10: the capped and windowed keys (a precompile with a wrong flag did nothing; the
# benchmark compiles what it needs before timing)
for m in "gemma-cap50:--model gemma-2-9b --softcap 50" "gemma-w4095-cap50:--model gemma-2-9b --softcap 50 --window-left 4095" "gptoss-w127:--model gpt-oss-20b --window-left 127 --sinks" "gemma-w4095:--model gemma-2-9b --window-left 4095"; do
  n=${m%%:*}; a=${m#*:}
  run n32-$n-now 100 python3 benchmarks/variants_ab.py --variants default --rounds 3 $a --pages 16,128 --cases 4kx4,8kx2,16kx1,2k@64k
done
# call 11: head dim 64 and 8B
run n32-llama1b-now 90 python3 benchmarks/variants_ab.py --variants default --rounds 3 --model llama-3.2-1b --pages 16,128 --cases 4kx4,8kx2,16kx1,2k@64k
run n32-llama8b-now 90 python3 benchmarks/variants_ab.py --variants default --rounds 3 --model llama-3.1-8b --pages 16,128 --cases 4kx4,8kx2,16kx1,2k@64k
