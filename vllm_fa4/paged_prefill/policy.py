"""The serving policy: which kernel configs serving runs for a key, as data (host only).

One table maps what of a key decides the config (head dim, sliding window, page size of 128 or
more) to the config of long batches and the config of short ones; the plan picks between the
two per batch (``ServingConfigs.pick``); ``LONG_BY_PAGE`` replaces a row's long config for one
page size and soft cap. The comment above each group of rows names the
measurement that decided it (docs/perf-notes.md, H100 and H200, one process each). A key
the kernel cannot build gets the default config (its route is the reference or a startup
refusal; the plan still tiles it). ``VLLM_FA4_VARIANT`` fixes one config for every batch
instead (``configured_config``); ``VLLM_FA4_FP8_QUERY=e4m3`` trades an FP8 cache's 16-bit Q
for speed on long batches (``Fp8Query``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from vllm_fa4 import envs
from vllm_fa4.kernels.config import (
    DEFAULT_CONFIG,
    Epilogue,
    KernelConfig,
    KernelKey,
    TileGeometry,
)

LONG_BATCH_MIN_PAGE = 128  # pages this large run a different config for long batches
SHORT_BATCH_MAX_BLOCKS = 16  # mean KV tiles visited per work tile (2k tokens at tile_n 128)

# What head dim 64's picks add on a 16-bit cache (without a window below page 128; the
# window's short pick at every page): a block's page-table entries read a block ahead, V
# loaded by the producer's second warp (TABLE's rows say what each measured; FP8 caches keep
# the picks without them).
PAGED_READS_64 = "+pages_ahead+v_warp"

# Head dim 64 without a window, long and short batches (TABLE's rows).
HD64_LONG = "queue_with_work+overlap+q_tma+lazy_max+mma_wgs=3"
HD64_SHORT = "queue_with_work+pv_wait_mid+q_tma+lazy_max+mma_wgs=3"

# Head dim 64 with a window, short batches (every batch of gpt-oss's 128-key window): 64-key
# blocks, Q by TMA with the tile's TileWork, the P V wait; on a 16-bit cache, every page size,
# also PAGED_READS_64 (TABLE's and FP8_TABLE's rows say what each measured).
WINDOW_64_SHORT_FP8 = "queue_with_work+pv_wait_mid+q_tma+mma_wgs=3+block_n=64"
WINDOW_64_SHORT = WINDOW_64_SHORT_FP8 + PAGED_READS_64

# Head dim 128 with a window, every batch (TABLE's rows say what each measured): below page
# 128, and at page 128 and above.
WINDOW_128_PAGED = "queue_with_work+pv_wait_mid+q_tma+v_warp+wide_box+pages_ahead"
WINDOW_128_LONG_PAGE = "queue_with_work+pv_wait_mid+q_tma+v_warp"

# (head dim, sliding window, page >= LONG_BATCH_MIN_PAGE) -> (long batches, short batches).
# The numbers below were measured with lazy_max's old margin of 2^8; since 2026-11-26 the max
# moves on any rise (issue 27, FA3's accuracy), 0-5.5 % slower (docs/perf-notes.md).
# Head dim 256's short batches store O by TMA (`tma_epilogue`): staged in the warpgroup's rows
# of sQ, the stores left in flight under the next tile. Writing 64 KB of O from registers cost
# a tile 3.1-3.8 us (the LSU's global queue full: ncu lg_throttle), 1.4-1.9 us staged, where a
# short tile visits 4-9 key blocks of 1.4-1.6 us (2026-11-28, session 25, H200, Gemma-2-9B
# heads, 512x32 and 1kx16 over `queue+overlap`, two runs each: +11.4 to +19.3 % and +4.8 to
# +9.7 % over no cap and cap 50, pages 16 and 128, the 4k window with cap 50 at page 16, and
# the FP8 cache at page 16; FP8 page 128 one run, +11.8 and +6.9 %). Long batches keep their
# picks: the staging and the store's reads take shared-memory bandwidth from the other
# warpgroup's Q K^T (the block loop 2-8 % slower a block), -4.1 to +0.3 % at page 16.
HD256_SHORT = "queue+overlap+tma_epilogue"

# Head dim 128's short batches (16-bit caches, no window): O staged in the tile's Q stage and
# stored by TMA boxes, the stage freed for the tile after next once the boxes have read it
# (2026-11-28, session 27, H200, Llama-3.1-8B heads, 512x32, 1kx16, 2kx8 at pages 16 and 128,
# over the 16-byte row stores of `staged_epilogue`, two runs: +1.7 to +9.2 % in 12 of 12,
# page 128's 512x32 the most). Long batches lost with it (4kx4 to 2k after 64k, -2.7 to
# +1.4 %) and head dim 64's three-warpgroup short pick was mixed (-1.0 to +3.3 %): those keep
# their picks. The 4k window's page-128 row took it too (below), its page-16 row did not.
HD128_SHORT = "queue_with_work+pv_wait_mid+q_tma+tma_epilogue+lazy_max"
# The FP8 cache's head-dim-128 short batches (Q by cp.async, one Q stage): O staged in sQ as
# head dim 256's short pick does, stored by TMA (same session, GPU and cases, over
# `staged_epilogue`, two runs: +1.0 to +5.1 % in 12 of 12; FA3-FP8 geomean 1.10 -> 1.13).
# With the window (`queue+overlap` + the store) it lost 4-26 % (one run): the probe put the
# tile's Q phase at 5.3 us against 2.0 (one Q stage, its next load waits for the boxes' read).
HD128_SHORT_FP8 = "queue+pv_wait_mid+tma_epilogue+lazy_max"

TABLE: dict[tuple[int, bool, bool], tuple[str, str]] = {
    # Head dim 64: three consumer warpgroups (192-row tiles) for every batch and page, where
    # two cannot hide one's softmax under the other's GEMMs (2026-11-24: Llama-3.2-1B shape
    # 1.00-1.17 of FA3 at pages 16 and 128, two warpgroups 0.87-1.00). Q by TMA with the tile
    # handed over with its TileWork (sessions 9-10), lazy_max (session 7); short batches wait
    # for P V mid-softmax (session 14: short +1.5 % and +1.9 % on the H100, +1.6 % on the
    # H200; long page-128 batches -1.3 % and -1.6 %, so long ones keep the plain overlap).
    # Below page 128 both read a block's page-table entries a block ahead and load V on the
    # producer's second warp (2026-11-27, session 15, H100, page 16, two runs, Llama-3.2-1B
    # and gpt-oss-20b's global layers: long +1.9 to +5.6 %, 512x32 and 1kx16 +4.6 to +6.1 %
    # over these picks; pages 32 and 64 take it unmeasured). Session 14's -10 to -20 % with
    # pages ahead was the register split (40 / 152), fixed to 32 / 160 before this run.
    (64, False, False): (HD64_LONG + PAGED_READS_64, HD64_SHORT + PAGED_READS_64),
    (64, False, True): (HD64_LONG, HD64_SHORT),
    # Head dim 64 with a window. Short batches, which is every batch of gpt-oss's 128-key
    # window (a row visits two or three blocks): 64-key blocks (a 192-row tile is 24 tokens at
    # GQA 8, so a row's 128 keys span about 151; 128-key blocks compute 2-3x that, 64-key
    # ones 1.3-1.7x), Q by TMA with the tile's TileWork, the P V wait mid-softmax (2026-11-27,
    # session 12, H100, gpt-oss shape with sinks, pages 16 and 128, 512x32 to 16k and 2k after
    # 64k, over session 4's Q-prefetch pick: +16 to +26 % in three runs, 0.92-1.13x FA3 on
    # contiguous K/V, was 0.80-0.91x; 32-key blocks 9-20 % behind 64). Long batches, which
    # windows of more than about 2k keys make (Llama-3.2-1B shape, 4k window): session 4's
    # pick, Q prefetched a tile ahead, 1.00-1.06x FA3 (64-key blocks there: -8 to -11 %).
    # The short pick reads a block's page-table entries a block ahead and loads V on the
    # producer's second warp (gpt-oss shape, H100: page 16 +10.8 to +13.5 % in 5 of 5, 1.14-
    # 1.21x FA3c, session 15; page 128 -0.5 to +4.7 %, two runs, 1.07-1.17x FA3c, session 16;
    # pages 32 and 64 +3.6 to +5.9 % and +0.4 to +4.7 %, 1.07-1.22x FA3c, session 17).
    (64, True, False): (
        "queue+overlap+q_prefetch+mma_wgs=3",
        WINDOW_64_SHORT,
    ),
    (64, True, True): (
        "queue+overlap+q_prefetch+mma_wgs=3",
        WINDOW_64_SHORT,
    ),
    # Head dim 128, long batches below page 128: V loaded by the producer's second warp
    # (session 12: page 16, 4k+ tokens +0.5-0.9 %), page table read a block ahead (session
    # 11), one TMA box per page for all of D (session 13: +0.8-1.1 %). Short batches: O
    # staged through the tile's Q stage (session 10: 512x32-1kx16 +4-10 %, 2kx8 0 to +2.4 %;
    # long batches -0.1 to -6 %). Both wait for P V mid-softmax (session 14, H100, 8 rounds:
    # page-16 4k+ 1.051 -> 1.111 of FA3, short 1.110 -> 1.139; 70B at TP 8 likewise).
    # Short batches store O from the Q stage by TMA since session 27 (HD128_SHORT).
    (128, False, False): (
        "queue_with_work+pv_wait_mid+q_tma+v_warp+wide_box+pages_ahead+lazy_max",
        HD128_SHORT,
    ),
    # Head dim 128 at page 128: the V warp without pages ahead or wide boxes (session 12:
    # -0.1 to +0.7 % over session 11's pages-ahead pick, which the V warp with pages ahead
    # did not beat; wide boxes -0.6 to +0.7 %, session 13); page-128 long 1.005 -> 1.043 with
    # the mid-softmax wait (session 14). One tile per CTA with the same step: -7.6 to -1.5 %
    # (session 19, H100; the queue starts a tile's loads under the previous one).
    (128, False, True): (
        "queue_with_work+pv_wait_mid+q_tma+v_warp+lazy_max",
        HD128_SHORT,
    ),
    # Head dim 128 with a window: the unwindowed long picks without lazy_max (not measured
    # with a window), for every batch: Q by TMA with the tile's TileWork, the P V wait
    # mid-softmax, V on the producer's second warp, and below page 128 one box per page and
    # the page table read a block ahead (2026-11-27, session 14, H100, Llama-3.1-8B heads, 4k
    # window, over session 4's picks: page 16, two runs, +10.7 to +17.1 % in 14 of 14 from
    # 512x32 to 16kx1 and chunks after 16k and 64k, 1.00-1.15x FA3c; page 128, one run, +3.1
    # to +9.8 % in 6 of 6). The unwindowed short pick (`staged_epilogue`) stayed within a few
    # percent of session 4's, behind these.
    (128, True, False): (WINDOW_128_PAGED, WINDOW_128_PAGED),
    # At page 128 short batches store O from the Q stage by TMA since session 27 (H200,
    # Llama-3.1-8B heads, 4k window: 512x32 +5.7 / +3.1 %, 1kx16 +4.1 / +5.4 % in two runs,
    # 2kx8 +3.5 % in one; long 4kx4 and 16kx1 +0.4 and +0.2 %, so long batches keep theirs;
    # page 16's row gained nothing, +0.8 and -0.6 %).
    (128, True, True): (WINDOW_128_LONG_PAGE, WINDOW_128_LONG_PAGE + "+tma_epilogue"),
    # Head dim 256 below page 128: the persistent grid (H200 page 16: 0.99-1.04 of FA3, one
    # tile per CTA 0.86-1.02); lazy_max for long batches only (512x32 lost 1.5-2.6 % with it),
    # not with a window. Long batches without a window step without ping-pong turns
    # (2026-11-27, Gemma 2 shape page 16, with and without soft cap 50: +1.3 to +4.7 % in all 8
    # cases on the H100, +1.1 to +3.3 % on the H200; with the 4k window -1.3 and -2.9 %, so
    # windows keep the turns). Long batches read a block's page-table entries a block ahead
    # (`pages_ahead`; 2026-11-27, session 14, H100, page 16, two runs: +2.9 to +8.1 % in 8 of
    # 8, V had arrived late behind the page-table load; pages 32 and 64 take it unmeasured).
    # With a window (no cap below page 128; the capped page-16 key takes LONG_BY_PAGE's row):
    # the P V wait with lazy_max and pages ahead, +3.6 to +7.6 % over `queue+overlap` at page
    # 16 in two runs (session 20, H100, 4k window; sanitized in session 21); pages 32 and 64
    # take it unmeasured. Without the window the same step made +0.6 to +3.1 % over the row's
    # `overlap_free` pick in two runs (sessions 20-21): short of the +2 % rule, not taken;
    # page 16 without the cap takes it with 80-key blocks and the TMA store (LONG_BY_PAGE).
    (256, False, False): ("queue+overlap_free+lazy_max+pages_ahead", HD256_SHORT),
    (256, True, False): ("queue+pv_wait_mid+lazy_max+pages_ahead", HD256_SHORT),
    # Head dim 256 at page 128 (session 3): long batches one tile per CTA (0-3 % ahead on 16k
    # and chunks after 64k), short ones the persistent grid (the CTA start-up paid once per
    # SM lifts 512x32 from 0.85 to 0.99). Without turns (`one_per_cta+overlap_free`, H200, cap
    # 50): -0.4 to +1.7 %, not taken. Long batches wait for P V mid-softmax with lazy_max
    # (2026-11-27, session 18, H100, Gemma-2-9B heads, 4k-16k and 2k after 64k: cap 50 +1.6 to
    # +12.2 % in two runs, 8 of 8; no cap +1.2 to +3.5 %, one run; the persistent grid with
    # the same step lost to one tile per CTA in 4 of 4; pages ahead on top -2.2 to 0.0 %,
    # session 19). With a window (Gemma 2's local layers, 4k window, cap 50) the same step
    # (2026-11-28, session 20, H100: +0.8 to +3.9 % over `one_per_cta+overlap` in 8 of 8 over
    # two runs, no cap +0.6 to +4.3 % in one; 4kx4 0.99-1.01 -> 1.01x paged FA3); the P V
    # wait without lazy_max lost 1.2-3.2 % (session 19), lazy_max without it 1.7-2.4 %.
    (256, False, True): ("one_per_cta+pv_wait_mid+lazy_max", HD256_SHORT),
    (256, True, True): ("one_per_cta+pv_wait_mid+lazy_max", HD256_SHORT),
}

# The same rows for an FP8 cache (issue 30; fp8_kv.py), unmeasured: the 16-bit picks without
# what the fp8 kernel does not build (wide_box, q_prefetch). Head dim 128 trades q_tma (and
# with it queue_with_work and v_warp) for Q by cp.async: one Q stage leaves shared memory for
# two fp8 staging slots, so a tile's TMA overlaps the previous one's conversion (with q_tma
# only one fits; docs/perf-notes.md predicts the single slot serializes them). Head dims 64
# (two slots) and 256 (one: its 128 KB of K/V stages) keep their 16-bit picks.
FP8_TABLE: dict[tuple[int, bool, bool], tuple[str, str]] = {
    **TABLE,
    # Head dim 64 without a window: the 16-bit picks before session 15's pages ahead and V
    # warp (not measured on FP8, whose converter warps keep a 40 / 152 register split).
    (64, False, False): (HD64_LONG, HD64_SHORT),
    # Head dim 64 with a window: short batches (every gpt-oss batch: 128-key windows make
    # each tile's work short) on the 16-bit row's 64-key pick (session 13, H100, gpt-oss-20b
    # shape, pages 16 and 128, 4k-16k, chunks after 16k and 64k: 1.365-1.401x vLLM's FA3-FP8
    # call against 0.952-1.055x before, at our bf16 kernel's speed), without the 16-bit
    # pick's pages ahead and V warp (-1.3 to +1.4 %, session 16, H100: the converter warps
    # bound it). Long batches (4k windows) keep the pick measured with the 16-bit kernel's long
    # row in mind, unmeasured on FP8.
    (64, True, False): (
        "queue+overlap+mma_wgs=3",
        WINDOW_64_SHORT_FP8,
    ),
    (64, True, True): (
        "queue+overlap+mma_wgs=3",
        WINDOW_64_SHORT_FP8,
    ),
    # Head dim 128's long picks here are fp16 models' (and capped keys'); bf16 models split Q
    # on long batches (FP8_BF16_LONG below, windowed rows too since session 36).
    (128, False, False): ("queue+pv_wait_mid+pages_ahead+lazy_max", HD128_SHORT_FP8),
    (128, False, True): ("queue+pv_wait_mid+lazy_max", HD128_SHORT_FP8),
    (128, True, False): ("queue+overlap", "queue+overlap"),
    (128, True, True): ("queue+overlap", "queue+overlap"),
    # overlap_free (the 16-bit pick above) on an FP8 cache: -4.5 to +0.4 % (H200), the turns stay.
    # Pages ahead at page 16: -0.5 to +2.2 %, the P V wait with them -4.2 to +0.4 % (session 21,
    # H100, with and without cap 50): the converters bind, neither taken.
    (256, False, False): ("queue+overlap+lazy_max", HD256_SHORT),
    # Page 128: session 3's pick; the 16-bit row's P V wait on FP8: -3.2 to +3.3 % in three
    # runs (session 19, H100), not taken. O stored by TMA since session 26 (one tile per CTA:
    # the store drains as the CTA ends; 2026-11-28, H200, Gemma-2-9B heads, 4kx4, 8kx2,
    # 16kx1, 2k after 64k: no cap two runs +4.9/+5.1, +2.6/+1.5, +0.8/+1.6, 0.0/+1.1 %; cap
    # 50 +5.5, +3.1, +1.4, +0.1 %; the 4k window with cap 50 +6.4, +4.9, +3.5, +3.4 %).
    (256, False, True): ("one_per_cta+overlap+tma_epilogue", HD256_SHORT),
    (256, True, True): ("one_per_cta+overlap+tma_epilogue", HD256_SHORT),
    # With a window below page 128: the 16-bit row's pick, the P V wait with lazy_max and
    # pages ahead (session 21, H100, Gemma-2-9B heads, 4k window, page 16, over `queue+overlap`,
    # two runs each: no cap +1.3 to +5.2 %, cap 50 +1.4 to +4.4 %, 16 of 16 positive; the
    # global layers' FP8 row gained nothing from it, above).
    (256, True, False): ("queue+pv_wait_mid+lazy_max+pages_ahead", HD256_SHORT),
}

# FP8 head dim 128, long batches of a bfloat16 model, over FP8_TABLE's row: S = Q K^T on FP8
# wgmma straight from the staged e4m3 K with Q split into two e4m3 halves (`fp8_qk`). K's
# 16-bit stages go, so Q by TMA fits beside two staging slots (2026-11-27, session 11, H100,
# Llama-3.1-8B shape, pages 16 and 128, 4k-16k and 2k after 64k: +1.4 to +3.6 % in 6 of 6
# over the converted pick; the split alone, Q by cp.async, -0.5 to -1 %; with pages ahead at
# page 16 -1.6 to -0.1 %, with the V warp -4.7 to +2.4 %, session 21). fp16 models keep
# the converted pick: two e4m3 parts hold a bf16 value's 8 significant bits, not fp16's 11.
# The 4k window takes the same pick (session 36, H200, two runs with the order swapped, pages
# 16 and 128: +1.5 / +1.4 % geomean over `queue+overlap`, 15 of 16 cases positive, -0.8 to
# +3.5 %; `queue+overlap+fp8_qk`, the window's pick split, -2.6 to +2.3 %).
_FP8_QK_128 = "queue_with_work+pv_wait_mid+q_tma+lazy_max+fp8_qk"
FP8_BF16_LONG: dict[tuple[int, bool, bool], str] = {
    (128, False, False): _FP8_QK_128,
    (128, False, True): _FP8_QK_128,
    (128, True, False): _FP8_QK_128,
    (128, True, True): _FP8_QK_128,
}


class Fp8Query(enum.Enum):
    """How an FP8 cache's long prefill batches read Q for Q K^T (``VLLM_FA4_FP8_QUERY``)."""

    # 16-bit Q: K converted to fp16, or Q split exactly into two e4m3 parts (`fp8_qk`); the
    # error of 16-bit attention on the FP8 cache (issue 30's promise)
    EXACT = "exact"
    # Q rounded once to e4m3 under a power-of-two row scale (`fp8_qk_rounded`: one FP8 GEMM,
    # no K conversion); P V stays 16-bit. Opt-in: Q K^T is as coarse as FLASH_ATTN-FP8's
    E4M3 = "e4m3"


# VLLM_FA4_FP8_QUERY=e4m3: long batches of bfloat16 models without a soft cap, over the rows
# above (H200, `benchmarks/fp8_ab.py`, 4kx4, 8kx2, 16kx1, 2k after 64k). Head dim 128
# (Llama-3.1-8B heads, pages 16 and 128): 1.114x FA3-FP8 geomean in two runs (session 33,
# lowest case 1.098) and 1.120x with Q's e4m3 buffer of one part (session 34, lowest 1.105),
# the exact pick 0.967; served 8B with it forced on every batch 1.074x FLASH_ATTN at 32k x 24,
# 1.098 / 1.101x at 64k x 10. Head dim 256 (Gemma-2-9B heads, no cap, session 34, two runs):
# page 16's row with it 1.616 / 1.622x (lowest 1.500; the exact pick 1.270 / 1.261), the
# same config at page 128 1.977 / 1.985x (page 128's row with it, one tile per CTA and O by
# TMA, 1.961 / 1.944x; the exact pick 1.514 / 1.510). Error against the 16-bit values
# (`fp8_ab.py --accuracy`): 0.875x FA3-FP8's at both head dims (exact: 0.71x). Head dim 128
# with the 4k window, the window's row with it (session 35, two runs, pages 16 and 128): 1.291
# / 1.291x (lowest 1.038; the exact pick 1.165 / 1.151, lowest 0.930), `queue+pv_wait_mid+
# lazy_max` with it a tie (1.294 / 1.297). Gemma 2's layers (head dim 256, cap 50; each row's
# Q scale rides in the cap's prescale): head dim 256's pick over the exact capped picks
# (session 36, H200, pages 16 and 128) 1.942x FA3-FP8 (exact 1.536) global, 1.898x (exact
# 1.560) with the 4k window, error 0.875x FA3-FP8's. fp16 models don't build it.
_E4M3_Q_128 = "queue_with_work+pv_wait_mid+q_tma+lazy_max+fp8_qk_rounded"
_E4M3_Q_128_WINDOW = "queue+overlap+fp8_qk_rounded"
_E4M3_Q_256 = "queue+overlap+lazy_max+fp8_qk_rounded"
# (head dim, sliding window, soft cap) -> long batches' pick, at every page size
FP8_E4M3_Q_LONG: dict[tuple[int, bool, bool], str] = {
    (128, False, False): _E4M3_Q_128,
    (128, True, False): _E4M3_Q_128_WINDOW,
    (256, False, False): _E4M3_Q_256,
    (256, False, True): _E4M3_Q_256,
    (256, True, False): _E4M3_Q_256,
    (256, True, True): _E4M3_Q_256,
}

# Long-batch picks for one page size and soft cap, over the table's row (16-bit caches only).
# (head dim, sliding window, page size, soft cap) -> long batches' config.
# Head dim 256 with a soft cap (Gemma 2's global layers) at page 16: 80-key blocks, five pages
# a block, where Q K^T's 64-key wgmmas wait on shared memory (2026-11-27, session 9, H100,
# cap 50, 4k-16k and 2k after 64k: +3.6 to +7.2 %). Without the cap -3.4 to +1.2 % and short
# batches -3 to -4 % then (on the turns' step; the uncapped key's row below has the P V wait
# and the TMA store), so long batches only; the plan tiles a short batch
# again with its own 64-key blocks (plan.py). With the 4k window too (Gemma 2's local layers),
# on the row's own step with turns: +0.5 to +6 % and +3.2 to +6.3 % in two H100 runs (sessions
# 9 and 10). The global layers wait for P V mid-softmax, so O's rescale runs under the next
# Q K^T (session 12, H100, two runs: +1.7 to +4.7 % and -0.8 to +3.7 % over the step without
# turns; session 14's -2 to -5 % was on 64-key blocks with the cap before the mask branch).
# 80 keys divide no larger page; the FP8 kernel's staging does not fit shared memory beside
# them. The global layers read a block's page-table entries a block ahead (`pages_ahead`): V
# arrived late, after a page-table load that sat between a stage's release and its refill
# (2026-11-27, session 14, H100, two runs, 4k-16k and chunks after 16k and 64k: +4.4 to
# +8.4 % in 9 of 9); the local layers gained nothing from it alone (-2.1 to +0.4 %) but do
# with the P V wait (their row below), the FP8 kernel's head dim 256 -0.2 to +3.5 %.
HD256_CAPPED_PAGE16_LONG = "queue+pv_wait_mid+lazy_max+block_n=80+pages_ahead"
# The global layers without the cap at page 16 since session 26: the same pick with O stored
# by TMA (`tma_epilogue`), over the table's `queue+overlap_free+lazy_max+pages_ahead`
# (2026-11-28, sessions 25-26, H200, Gemma-2-9B heads, four runs: 4kx4 +1.7 to +3.4 %, 8kx2
# +2.8 to +3.8 %, 16kx1 +1.8 to +2.7 %; 2k after 64k -0.7, +0.8, +0.1 % in three, a 66k-key
# tile whose epilogue is under 1 % of it). The 80-key blocks alone made +1.0 to +3.3 %, the
# TMA store alone -3.3 to +0.3 %; with the cap the TMA store lost (-4.1 to -0.6 %).
HD256_UNCAPPED_PAGE16_LONG = HD256_CAPPED_PAGE16_LONG + "+tma_epilogue"
LONG_BY_PAGE: dict[tuple[int, bool, int, bool], str] = {
    (256, False, 16, True): HD256_CAPPED_PAGE16_LONG,
    (256, False, 16, False): HD256_UNCAPPED_PAGE16_LONG,
    # The global layers without the cap at page 128 (Gemma 3's kind) since session 26: the
    # row's pick with O stored by TMA (one tile per CTA: the store drains as the CTA ends;
    # H200, three runs, 4kx4 +4.8/+5.5/+5.5 %, 8kx2 +2.5/+1.7/+1.0 %, 16kx1 +2.3/+0.9/+2.2 %,
    # 2k after 64k +0.2/+1.2 %). With the cap it did not hold (8kx2 -3.1 and -0.6 %, 2k
    # after 64k -0.5 and -0.6 % in two runs), so the capped and windowed rows keep the row's.
    (256, False, 128, False): "one_per_cta+pv_wait_mid+lazy_max+tma_epilogue",
    # The local layers since 2026-11-28 (session 20, H100, two runs, 4k-16k and 2k after 64k):
    # the global layers' pick, +2.9 to +7.3 % in 8 of 8 over `queue+overlap+block_n=80` (4kx4
    # 0.99 -> 1.02-1.03x paged FA3), where its P V wait with lazy_max alone made -1.7 to
    # +0.8 % and pages ahead alone -2.1 to +0.4 % (session 14).
    (256, True, 16, True): HD256_CAPPED_PAGE16_LONG,
}


# Head dim 128's long batches on a 16-bit cache without a window, soft cap or sinks (Llama,
# Qwen, Mistral shapes) with an even GQA group: the two CTAs of a cluster share each K/V
# block by TMA multicast, each holding half the group's heads (`kv_multicast`; the cluster's
# rank 0 claims the next pair of rows and hands it over in shared memory). The L2 serves
# each block once a pair (16.95 -> 9.33 GB at 16kx1), which at the board's power cap buys
# clock (2026-11-29, sessions 29-30, H200, Llama-3.1-8B heads, three runs over the table's
# row: page 16 4kx4 +1.0 to +1.3 %, 8kx2 +3.9 to +5.3 %, 16kx1 +2.2 to +5.4 %, 16k after 48k
# +3.9 to +4.8 %, one run 2k after 16k +0.9 %, 16k+31x512 -0.8 %, 16k after 16k +3.2 %; page
# 128 4kx4 +1.2 to +2.5 %, 8kx2 +3.9 to +6.4 %, 16kx1 +2.8 to +8.7 %, 2k after 64k +1.3 /
# +2.4 %, 2k after 8k +1.4 %; 1.015-1.046x FA3c). Session 29's strided claims on another day
# gained +0.7 % on average: the gain moves with the board's power state. With soft cap 50
# (2026-11-29, session 31, H200, two runs, 4k-16k): page 16 -1.8 to +2.7 % (4kx4 lost in
# both), page 128 +0.3 to +1.5 % (the tanh's MUFU work likely sets those kernels' pace; not
# profiled), so the cap keeps the row's pick. Not measured on an H100, nor with sinks (kept
# off); pages 32 and 64 run page 16's code.
MULTICAST_LONG = "kv_multicast"


def _multicast_long(config: KernelConfig, key: KernelKey) -> KernelConfig:
    """The long pick with MULTICAST_LONG where it was measured and the kernel builds it."""
    measured = key.head_dim == 128 and not (key.fp8_kv or key.sliding_window)
    if not measured or key.softcap or key.sinks:
        return config
    shared = config.overlaid(MULTICAST_LONG)
    return shared if shared.unsupported_reason(key) is None else config


@dataclass(frozen=True)
class ServingConfigs:
    """The configs serving may launch for one key, picked per batch on the host (the plan):
    batches whose work tiles visit on average at most ``short_max_blocks`` K/V tiles run
    ``short``, the others ``long``. Warmup compiles every one of ``all``."""

    long: KernelConfig
    short: KernelConfig
    short_max_blocks: int = SHORT_BATCH_MAX_BLOCKS

    def __post_init__(self):
        # The plan tiles the batch with the long config's M tile to pick, so both share it
        # (a short pick with another N tile is tiled again, plan.py).
        if self.long.mma_wgs != self.short.mma_wgs:
            raise ValueError(
                f"serving configs {self.long.spec!r} and {self.short.spec!r} differ in "
                "mma_wgs (the M tile): one plan cannot serve both"
            )

    def geometry(self, key: KernelKey) -> TileGeometry:
        """The tile geometry the plan picks with: the long config's. The short config has
        the same M tile and may have another N tile, or (where the long pick packs half the
        GQA group, `kv_multicast`) twice the tiles of half the tokens; the pick compares the
        mean K/V tiles a tile visits, which neither changes much."""
        return self.long.geometry(key)

    def pick(self, num_tiles: int, total_work: int) -> KernelConfig:
        """The config of a batch of ``num_tiles`` tiles visiting ``total_work`` K/V tiles."""
        if num_tiles and total_work <= self.short_max_blocks * num_tiles:
            return self.short
        return self.long

    @property
    def all(self) -> tuple[KernelConfig, ...]:
        return (self.long,) if self.short == self.long else (self.long, self.short)


_PARSED = {row: tuple(map(KernelConfig.parse, specs)) for row, specs in TABLE.items()}
_PARSED_FP8 = {row: tuple(map(KernelConfig.parse, specs)) for row, specs in FP8_TABLE.items()}
_PARSED_BY_PAGE = {row: KernelConfig.parse(spec) for row, spec in LONG_BY_PAGE.items()}
_PARSED_FP8_BF16_LONG = {row: KernelConfig.parse(spec) for row, spec in FP8_BF16_LONG.items()}
_PARSED_FP8_E4M3_Q_LONG = {row: KernelConfig.parse(s) for row, s in FP8_E4M3_Q_LONG.items()}


def serving_configs(
    key: KernelKey, fixed: KernelConfig | None = None, fp8_query: Fp8Query = Fp8Query.EXACT
) -> ServingConfigs:
    """What serving runs for ``key``: ``fixed`` (VLLM_FA4_VARIANT) for every batch, else the
    table's row of the key (on an FP8 cache with ``fp8_query`` E4M3, long batches with Q
    rounded to e4m3 where FP8_E4M3_Q_LONG has the row and the kernel builds the key)."""
    if fixed is not None:
        return ServingConfigs(long=fixed, short=fixed)
    row = (key.head_dim, key.sliding_window, key.page_size >= LONG_BATCH_MIN_PAGE)
    table = _PARSED_FP8 if key.fp8_kv else _PARSED
    long, short = table.get(row, (DEFAULT_CONFIG, DEFAULT_CONFIG))
    if key.fp8_kv and key.dtype == "bfloat16":
        if not key.softcap:
            long = _PARSED_FP8_BF16_LONG.get(row, long)
        if fp8_query is Fp8Query.E4M3:
            feats = (key.head_dim, key.sliding_window, key.softcap)
            rounded = _PARSED_FP8_E4M3_Q_LONG.get(feats)
            if rounded is not None and _fit_group(rounded, key).unsupported_reason(key) is None:
                long = rounded
    if not key.fp8_kv:
        by_page = (key.head_dim, key.sliding_window, key.page_size, key.softcap)
        long = _PARSED_BY_PAGE.get(by_page, long)
        long = _multicast_long(long, key)
    return ServingConfigs(long=_fit_group(long, key), short=_fit_group(short, key))


def launchable_configs(key: KernelKey) -> tuple[KernelConfig, ...]:
    """Every config serving may launch for ``key`` without VLLM_FA4_VARIANT, under either
    VLLM_FA4_FP8_QUERY (what the compile checks, the sanitizers and the sweeps cover)."""
    picks = (c for query in Fp8Query for c in serving_configs(key, fp8_query=query).all)
    return tuple(dict.fromkeys(picks))


# The TMA-store picks that staged O in shared memory before (head dim 128's short picks until
# session 27), with their staged epilogue; the others stored it directly.
_STAGED_BEFORE_TMA = frozenset(
    replace(KernelConfig.parse(spec), epilogue=Epilogue.STAGED)
    for spec in (HD128_SHORT, HD128_SHORT_FP8)
)


def _fit_group(config: KernelConfig, key: KernelKey) -> KernelConfig:
    """``config`` without its TMA boxes where they cannot hold ``key``'s GQA group
    (`tma_epilogue` needs a warpgroup's 64 rows to be whole tokens: 64 % group == 0, not
    Qwen2.5-7B's 7): the epilogue the pick replaced, so such a key runs the kernel it ran
    before (staged row stores for head dim 128's short picks, direct stores otherwise)."""
    if config.epilogue is Epilogue.TMA and 64 % key.qhead_per_kvhead:
        staged = replace(config, epilogue=Epilogue.STAGED)
        return staged if staged in _STAGED_BEFORE_TMA else replace(config, epilogue=Epilogue.DIRECT)
    return config


def unreviewed_config_warning(key: KernelKey, fixed: KernelConfig | None) -> str | None:
    """A startup warning when ``fixed`` (VLLM_FA4_VARIANT) is not one of the configs the
    table picks for ``key``: it builds and the kernel tests run it, but the fuzz suite and
    compute-sanitizer cover the table's picks only (docs/reliability.md). None otherwise."""
    if fixed is None:
        return None
    picks = launchable_configs(key)
    if fixed in picks:
        return None
    return (
        f"FA4: {envs.VARIANT}={fixed.spec!r} serves every batch of {key} with a config the "
        f"serving table does not pick for it ({' / '.join(c.spec for c in picks)}): the fuzz "
        f"suite and compute-sanitizer have not covered it. For experiments; unset "
        f"{envs.VARIANT} in production."
    )


def configured_fp8_query() -> Fp8Query:
    """``VLLM_FA4_FP8_QUERY`` (unset: EXACT); a misspelling is a startup error naming it."""
    return Fp8Query(envs.fp8_query())


def configured_config() -> KernelConfig | None:
    """The config ``VLLM_FA4_VARIANT`` fixes for every batch, or None (the table); a spec
    that does not parse is a startup error naming the variable."""
    spec = envs.kernel_config_spec()
    if spec is None:
        return None
    try:
        return KernelConfig.parse(spec)
    except ValueError as e:
        raise ValueError(
            f"{envs.VARIANT}={spec!r}: {e}; or {envs.SERVING_DEFAULTS!r} (the per-batch "
            f"serving defaults, as when unset). Fix or unset {envs.VARIANT}, {envs.WAY_OUT}"
        ) from None
