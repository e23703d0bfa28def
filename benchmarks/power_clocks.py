"""Clocks and power while each contender runs back to back (issue 32): is a long case bound by
the GPU's power limit, and how many cycles does each kernel take at the clock it gets?

Run: python benchmarks/power_clocks.py [--model llama-3.1-8b] [--pages 16,128]
                                       [--cases 16kx1,4kx4] [--variants "default"]
                                       [--seconds 3] [--rounds 2] [--gemm 8192] [--fp8]

do_bench's back-to-back launches (variants_ab.py) run at the clock the power limit leaves;
single launches (tile_times.py) run faster. So two kernels that take the same time may do it
with different cycle counts at different clocks. Per contender (variants_ab.py's spelling for
ours; FA3 = vLLM's paged call, FA3c = FA3 on the same K/V contiguous; GEMM = a bf16 N^3
matmul, the tensor pipe's own ceiling under the same limit; --fp8: fp8_ab.py's contenders on
an e4m3 cache instead, ours-fp8, FA3-fp8 and both on the bf16 twin), each round runs it for
--seconds in chunks of launches timed by CUDA events while a thread samples NVML every 5 ms;
the first third of each window is dropped (clocks settle). Rows (medians over the rounds):
  ms       mean time a launch over the kept chunks
  TFLOP/s  the pairs a row sees (attention_flops), 2 N^3 for the GEMM
  MHz      mean SM clock over the kept samples; W mean power (board), of the limit
  Mcyc     ms x MHz: the launch's length in SM cycles at the clock it ran
  capped   share of kept samples with the software power cap among the clock-event reasons
  pJ/flop  W / (TFLOP/s): energy a counted FLOP
Contenders are interleaved, the order rotated each round. NVML is read with ctypes from the
driver's libnvidia-ml (no Python package needed).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from vllm_fa4.testing.cases import make_paged_case

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MODELS, attention_flops  # noqa: E402
from variants_ab import (  # noqa: E402
    CASES,
    DEFAULT_MODEL,
    DT,
    _pages,
    _softcap,
    _window_left,
    case_pages,
    fa3_call,
    fa3_contiguous_call,
    ours_call,
    parse_contender,
)

NVML_CLOCK_SM = 1
SW_POWER_CAP = 0x4  # nvmlClocksEventReasonSwPowerCap
THERMAL = 0x20 | 0x40  # software / hardware thermal slowdown


class Nvml:
    """The few NVML calls this tool needs, on the device torch runs on (matched by PCI bus)."""

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self._check(self.lib.nvmlInit_v2())
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        self.handle = ctypes.c_void_p()
        try:
            bus = f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
            rc = self.lib.nvmlDeviceGetHandleByPciBusId_v2(bus.encode(), ctypes.byref(self.handle))
        except AttributeError:  # a torch without the PCI fields
            rc = 1
        if rc:  # fall back to the first device (one-GPU machines)
            self._check(self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.handle)))
        limit = ctypes.c_uint()
        self._check(self.lib.nvmlDeviceGetEnforcedPowerLimit(self.handle, ctypes.byref(limit)))
        self.power_limit_w = limit.value / 1000
        # Renamed "clocks event reasons" in newer drivers; the old name stays exported.
        self._reasons = getattr(self.lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or (
            self.lib.nvmlDeviceGetCurrentClocksThrottleReasons
        )

    @staticmethod
    def _check(rc: int):
        if rc:
            raise RuntimeError(f"NVML call failed with code {rc}")

    def sample(self) -> tuple[float, float, int]:
        """(SM MHz, board W, clock-event reasons bitmask) now."""
        mhz, mw, reasons = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong()
        self._check(self.lib.nvmlDeviceGetClockInfo(self.handle, NVML_CLOCK_SM, ctypes.byref(mhz)))
        self._check(self.lib.nvmlDeviceGetPowerUsage(self.handle, ctypes.byref(mw)))
        self._check(self._reasons(self.handle, ctypes.byref(reasons)))
        return float(mhz.value), mw.value / 1000, int(reasons.value)


class Sampler:
    """NVML samples every ``period`` seconds on a thread, stamped with perf_counter."""

    def __init__(self, nvml: Nvml, period: float = 0.005):
        self.nvml, self.period = nvml, period
        self.samples: list[tuple[float, float, float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), *self.nvml.sample()))
            time.sleep(self.period)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def between(self, t0: float, t1: float):
        return [s[1:] for s in self.samples if t0 <= s[0] <= t1]

    def idle_watts(self, seconds: float = 2.0) -> float:
        """Board power with nothing launched: the mean over ``seconds`` after the first 0.5."""
        t0 = time.perf_counter()
        time.sleep(seconds)
        return statistics.fmean(s[1] for s in self.between(t0 + 0.5, time.perf_counter()))


@dataclass
class Window:
    """One contender's back-to-back run: time a launch, and the samples while it ran."""

    ms: float
    mhz: float
    watts: float
    capped: float  # share of samples with the software power cap set
    thermal: float  # share with a thermal slowdown set


def run_window(fn, sampler: Sampler, seconds: float, chunk: int) -> Window:
    """Launch ``fn`` in chunks of ``chunk`` for ``seconds``; summarize the last two thirds."""
    fn()
    torch.cuda.synchronize()
    chunks = []  # (host start, host end, ms a launch)
    t_start = time.perf_counter()
    while time.perf_counter() - t_start < seconds:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        h0 = time.perf_counter()
        begin.record()
        for _ in range(chunk):
            fn()
        end.record()
        end.synchronize()
        chunks.append((h0, time.perf_counter(), begin.elapsed_time(end) / chunk))
    return summarize(chunks, sampler.between, t_start, seconds)


def summarize(chunks, samples_between, t_start: float, seconds: float) -> Window:
    """The window's chunks that started after its first third (clocks settle under the power
    limit within a few hundred ms), and the samples taken while they ran."""
    keep_from = t_start + seconds / 3
    kept = [c for c in chunks if c[0] >= keep_from] or chunks[-1:]
    samples = samples_between(kept[0][0], kept[-1][1])
    if not samples:
        raise RuntimeError("no NVML samples inside the window (raise --seconds)")
    return Window(
        ms=statistics.fmean(c[2] for c in kept),
        mhz=statistics.fmean(s[0] for s in samples),
        watts=statistics.fmean(s[1] for s in samples),
        capped=sum(bool(s[2] & SW_POWER_CAP) for s in samples) / len(samples),
        thermal=sum(bool(s[2] & THERMAL) for s in samples) / len(samples),
    )


def chunk_for(fn, target_s: float = 0.05) -> int:
    """Launches a chunk so that one chunk takes about ``target_s`` (one sync each)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    return max(1, int(target_s / ((time.perf_counter() - t0) / 3)))


def gemm_call(n: int):
    a = torch.randn(n, n, dtype=DT, device="cuda")
    b = torch.randn(n, n, dtype=DT, device="cuda")
    out = torch.empty(n, n, dtype=DT, device="cuda")
    return lambda: torch.mm(a, b, out=out)


def measure(name, page, contenders, args, nvml: Nvml):
    shape = MODELS[args.model]
    specs = CASES[name][1]
    attn_flops = attention_flops(
        specs, shape.num_q_heads, shape.head_dim, window_left=args.window_left
    )
    if args.fp8:
        import fp8_ab

        case = fp8_ab.make_case(args.model, specs, page)
        fns = fp8_ab.contenders(case, [None], f"{name} p{page}")
    else:
        case = make_paged_case(
            specs,
            *(shape.num_q_heads, shape.num_kv_heads, shape.head_dim, page, DT, "cuda"),
            seed=0,
            window_left=args.window_left,
            softcap=args.softcap,
        )
        out = case.new_out()
        fns = {}
        for text in contenders:
            config, options = parse_contender(text)
            fns[text] = ours_call(case, case.plan(config, **options), out)
        fns["FA3"] = fa3_call(case)
        fns["FA3c"] = fa3_contiguous_call(case)
    flops = dict.fromkeys(fns, attn_flops)
    if args.gemm:
        fns[f"GEMM {args.gemm}^3"], flops[f"GEMM {args.gemm}^3"] = (
            gemm_call(args.gemm),
            2 * args.gemm**3,
        )
    chunks = {n: chunk_for(fn) for n, fn in fns.items()}
    names = list(fns)
    windows: dict[str, list[Window]] = {n: [] for n in names}
    with Sampler(nvml) as sampler:
        for r in range(args.rounds):
            for n in names[r % len(names) :] + names[: r % len(names)]:
                windows[n].append(run_window(fns[n], sampler, args.seconds, chunks[n]))
    label = f"{name} p{page}"
    for i, n in enumerate(names):
        ws = windows[n]

        def med(field, ws=ws):
            return statistics.median(getattr(w, field) for w in ws)

        ms, mhz, watts = med("ms"), med("mhz"), med("watts")
        tflops = flops[n] / (ms * 1e-3) / 1e12
        print(
            f"{label if i == 0 else '':>12} | {n:<32} {ms:8.3f} ms {tflops:6.1f} TFLOP/s "
            f"{mhz:6.0f} MHz {watts:5.0f} W ({watts / nvml.power_limit_w:4.0%}) "
            f"{ms * mhz / 1e3:7.3f} Mcyc  capped {med('capped'):4.0%} thermal "
            f"{med('thermal'):4.0%}  {watts / tflops:5.3f} pJ/flop",
            flush=True,
        )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, choices=list(MODELS))
    ap.add_argument("--pages", type=_pages, default=None, help="e.g. 16,128")
    ap.add_argument("--cases", default="4kx4,16kx1")
    ap.add_argument("--variants", default="default", help="ours, variants_ab.py's spelling")
    ap.add_argument("--seconds", type=float, default=3.0, help="each contender's window")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--gemm", type=int, default=8192, help="N of the bf16 GEMM (0: none)")
    ap.add_argument("--fp8", action="store_true", help="an e4m3 cache: fp8_ab.py's contenders")
    ap.add_argument("--window-left", type=_window_left, default=None, help="as variants_ab.py")
    ap.add_argument("--softcap", type=_softcap, default=None, help="as variants_ab.py")
    args = ap.parse_args(argv)
    if args.fp8 and (args.window_left is not None or args.softcap is not None):
        ap.error("--fp8 runs fp8_ab.py's plain causal cases; no --window-left / --softcap")
    if args.fp8:
        import fp8_ab

        pages = sorted({p for n in args.cases.split(",") for p in case_pages(n, args.pages)})
        fp8_ab.precompile([args.model], pages, [None], jobs=8)
    nvml = Nvml()
    print(
        f"device={torch.cuda.get_device_name()} model={args.model} power_limit="
        f"{nvml.power_limit_w:.0f} W kv={'fp8_e4m3' if args.fp8 else 'bf16'} "
        f"window_left={args.window_left} softcap={args.softcap} "
        f"seconds={args.seconds} rounds={args.rounds}",
        flush=True,
    )
    for name in args.cases.split(","):
        for page in case_pages(name, args.pages):
            measure(name, page, args.variants.split(), args, nvml)


if __name__ == "__main__":
    main()
