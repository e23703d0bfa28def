"""Energy a byte read from L2 and from HBM into the SMs (issue 32's energy levers, session 28).

Run: python benchmarks/byte_energy.py [--seconds 3]

At the board's power cap a kernel's time is its energy over the limit, so a lever that moves
fewer bytes is worth what those bytes cost. A persistent Triton kernel streams int32 words with
16-byte loads and one XOR a word (the least SM work a load can carry), in three settings:
  L1     each program re-reads a 16 KiB slice of its own (default caching: L1 hits)
  L2     each program re-reads its own slice of a 32 MiB buffer, loads marked ``.cg`` (L2 only)
  HBM    one pass over 8 GiB, ``.cg``
Each runs back to back for --seconds in power_clocks.py's window (NVML sampled, CUDA events
time the launches, the first third dropped). A row: bytes a second, board power, SM clock,
and the energy a byte over the L1 row's (the same loop and XORs, so what is left is the path
below L1) and over the idle board.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from power_clocks import Nvml, Sampler, chunk_for, run_window  # noqa: E402

BLOCK = 1024  # int32 words a program loads a step (4 KiB: 16 bytes a thread at 8 warps)


@triton.jit
def _stream(x_ptr, out_ptr, words_per_prog, passes, BLOCK: tl.constexpr, CG: tl.constexpr):
    pid = tl.program_id(0)
    base = x_ptr + pid.to(tl.int64) * words_per_prog
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for _ in range(passes):
        for off in range(0, words_per_prog, BLOCK):
            ptrs = base + off + tl.arange(0, BLOCK)
            if CG:
                acc ^= tl.load(ptrs, cache_modifier=".cg")
            else:
                acc ^= tl.load(ptrs)
    tl.store(out_ptr + pid * BLOCK + tl.arange(0, BLOCK), acc)


def stream_call(programs: int, words_per_prog: int, passes: int, cg: bool):
    x = torch.randint(0, 2**31 - 1, (programs * words_per_prog,), dtype=torch.int32, device="cuda")
    out = torch.empty(programs * BLOCK, dtype=torch.int32, device="cuda")

    def fn():
        _stream[(programs,)](x, out, words_per_prog, passes, BLOCK=BLOCK, CG=cg, num_warps=8)

    return fn, programs * words_per_prog * 4 * passes


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args(argv)
    nvml = Nvml()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    programs = 2 * sms  # two CTAs an SM (8 warps each)
    settings = {
        "L1": stream_call(programs, 4096, 2000, cg=False),  # 16 KiB a program
        "L2": stream_call(programs, (32 << 20) // 4 // programs // BLOCK * BLOCK, 40, cg=True),
        "HBM": stream_call(programs, (8 << 30) // 4 // programs // BLOCK * BLOCK, 1, cg=True),
    }
    with Sampler(nvml) as sampler:
        idle = sampler.idle_watts()
        print(
            f"device={torch.cuda.get_device_name()} idle={idle:.0f} W "
            f"limit={nvml.power_limit_w:.0f} W programs={programs}",
            flush=True,
        )
        # name -> (bytes a launch, power_clocks.py's window of it)
        rows = {
            name: (nbytes, run_window(fn, sampler, args.seconds, chunk_for(fn)))
            for name, (fn, nbytes) in settings.items()
        }
    rates = {name: nbytes / (w.ms * 1e-3) for name, (nbytes, w) in rows.items()}
    l1_pj = rows["L1"][1].watts / rates["L1"] * 1e12
    for name, (_, w) in rows.items():
        rate, watts, mhz = rates[name], w.watts, w.mhz
        pj = watts / rate * 1e12
        print(
            f"{name:4} {rate / 1e12:6.2f} TB/s {watts:5.0f} W ({watts / nvml.power_limit_w:4.0%}) "
            f"{mhz:5.0f} MHz  {pj:6.1f} pJ/B total, {pj - l1_pj:6.1f} over L1, "
            f"{(watts - idle) / rate * 1e12:6.1f} over idle",
            flush=True,
        )


if __name__ == "__main__":
    main()
