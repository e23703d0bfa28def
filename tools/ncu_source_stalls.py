#!/usr/bin/env python3
"""Where warps wait, per SASS instruction, from Nsight Compute's source page.

On the GPU machine (SourceCounters section in the report):

    ncu --section SourceCounters ... -o rep python3 benchmarks/profile_case.py ...
    ncu -i rep.ncu-rep --page source --csv --print-source sass > source.csv

then, anywhere:

    python3 tools/ncu_source_stalls.py source.csv [--top 25]

Prints, for each kernel in the file: its warp-stall samples by reason (share of all samples)
and the instructions holding the most samples with their main reasons. ``--by-opcode``
instead prints each kernel's executed warp instructions by SASS opcode (the instruction mix
behind InstructionStats' total, to set two kernels' counts side by side); ``--stalls-by-opcode``
each opcode's share of the warp-stall samples and its main reasons.
"""

from __future__ import annotations

import argparse
import csv
import io
import lzma
import sys
from dataclasses import dataclass, field

SAMPLES = "Warp Stall Sampling (All Samples)"


@dataclass
class Kernel:
    name: str
    rows: list[dict] = field(default_factory=list)


def read_kernels(text: str) -> list[Kernel]:
    """The CSV holds one block per kernel: a "Kernel Name" line, a header, the rows."""
    kernels, header = [], None
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        if row[0] == "Kernel Name":
            kernels.append(Kernel(row[1]))
            header = None
        elif header is None:
            header = row
        elif kernels:
            kernels[-1].rows.append(dict(zip(header, row)))
    return kernels


def _num(value: str) -> float:
    try:
        return float(value.replace(",", ""))
    except (AttributeError, ValueError):
        return 0.0


def reasons_of(row: dict) -> dict[str, float]:
    return {
        k.removeprefix("stall_"): _num(v)
        for k, v in row.items()
        if k.startswith("stall_") and "(Not Issued)" not in k
    }


def report(kernel: Kernel, top: int) -> str:
    total = sum(_num(r.get(SAMPLES, "0")) for r in kernel.rows) or 1.0
    by_reason: dict[str, float] = {}
    for r in kernel.rows:
        for k, v in reasons_of(r).items():
            by_reason[k] = by_reason.get(k, 0.0) + v
    lines = [f"== {kernel.name[:60]}  samples {int(total)}"]
    lines.append(
        "   "
        + ", ".join(
            f"{k} {100 * v / total:.1f}%"
            for k, v in sorted(by_reason.items(), key=lambda kv: -kv[1])[:10]
            if v
        )
    )
    ranked = sorted(kernel.rows, key=lambda r: -_num(r.get(SAMPLES, "0")))[:top]
    for r in ranked:
        n = _num(r.get(SAMPLES, "0"))
        main = sorted(reasons_of(r).items(), key=lambda kv: -kv[1])[:3]
        why = ", ".join(f"{k}={int(v)}" for k, v in main if v)
        where, source = r.get("Address", "?"), r["Source"][:60]
        lines.append(f"   {where:>8} {100 * n / total:5.1f}%  {source:60s} {why}")
    return "\n".join(lines)


EXECUTED = "Instructions Executed"


def opcode_of(source: str) -> str:
    """``@!P0 BRA `(.L_x_1)`` -> ``BRA``; the opcode's modifiers are kept apart
    (``HGMMA.64x128x16.F32.BF16`` -> ``HGMMA``)."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def by_opcode(kernel: Kernel, top: int) -> str:
    counts: dict[str, float] = {}
    for r in kernel.rows:
        op = opcode_of(r.get("Source", ""))
        counts[op] = counts.get(op, 0.0) + _num(r.get(EXECUTED, "0"))
    total = sum(counts.values()) or 1.0
    lines = [f"== {kernel.name[:60]}  warp instructions executed {total / 1e6:.2f} M"]
    for op, n in sorted(counts.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"   {op:<10} {n / 1e6:9.3f} M  {100 * n / total:5.1f}%")
    return "\n".join(lines)


def stalls_by_opcode(kernel: Kernel, top: int) -> str:
    """Each opcode's share of all warp-stall samples and its main reasons (where a kernel's
    warps wait, by kind of instruction: session 16 set ours and FA3c's MUFU and FMNMX side
    by side this way)."""
    by_op: dict[str, dict[str, float]] = {}
    for r in kernel.rows:
        reasons = by_op.setdefault(opcode_of(r.get("Source", "")), {})
        for k, v in reasons_of(r).items():
            reasons[k] = reasons.get(k, 0.0) + v
    total = sum(sum(d.values()) for d in by_op.values()) or 1.0
    lines = [f"== {kernel.name[:60]}  samples {int(total)}"]
    ranked = sorted(by_op.items(), key=lambda kv: -sum(kv[1].values()))[:top]
    for op, reasons in ranked:
        main = sorted(reasons.items(), key=lambda kv: -kv[1])[:4]
        why = ", ".join(f"{k}={100 * v / total:.1f}" for k, v in main if v)
        lines.append(f"   {op:<10} {100 * sum(reasons.values()) / total:5.1f}%  {why}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu --page source --csv output (.xz accepted)")
    ap.add_argument("--top", type=int, default=25)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument(
        "--by-opcode", action="store_true", help="executed instructions by SASS opcode"
    )
    mode.add_argument(
        "--stalls-by-opcode",
        action="store_true",
        help="warp-stall samples by SASS opcode, with each opcode's main reasons",
    )
    args = ap.parse_args(argv)
    opener = lzma.open if args.csv.endswith(".xz") else open
    with opener(args.csv, "rt") as f:
        kernels = read_kernels(f.read())
    if not kernels:
        print(f"no kernel blocks in {args.csv}", file=sys.stderr)
        return 1
    for k in kernels:
        if args.by_opcode:
            print(by_opcode(k, args.top))
        elif args.stalls_by_opcode:
            print(stalls_by_opcode(k, args.top))
        else:
            print(report(k, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
