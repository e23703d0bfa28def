#!/usr/bin/env python3
"""Machine-code fingerprint of the prefill kernel: compile a set of (key, config, lse) cases for
sm_90a on the CPU and hash their normalized PTX, so a refactor can prove it left the code alone.

    python tools/kernel_fingerprint.py --out /tmp/fp-before           # before the change
    python tools/kernel_fingerprint.py --out /tmp/fp-after --compare /tmp/fp-before
    python tools/kernel_fingerprint.py --served --sass --out /tmp/fp-before  # what serving runs

`--served` builds every config serving can launch (``serving_configs(key).all`` over every
supported dtype x head dim x page size x GQA group in SERVED_GROUPS x model-feature set in
SERVED_FEATURES), once per key class that changes the code: head dim, page size class (below
128 or not) and feature set; the representative key of each (class, config) rotates through
the class's dtypes, page sizes and groups. Cases are named by that key and the config's role
there (long / short / both batches), not by the config's spelling, so a refactor that renames
configs still compares case by case.

Both sets end with every config serving launches on an FP8 cache, once per head dim
(`fp8_cases`).

Writes one normalized PTX file per case and `hashes.txt` (case, sha256). `--compare` prints
`same` / `DIFF` per case and exits 1 on any difference (a refactor must print no DIFF). With
`--sass`, cuobjdump (where installed) disassembles the cubins too and hashes the SASS as well.

Normalization only removes what names the source, never what the GPU runs: comments, the
entry's name (it embeds the Python module and class path) replaced by `KERNEL` everywhere, and
the virtual registers' numbers, renumbered in order of first appearance (a one-to-one renaming;
the DSL's numbering can depend on the process's earlier compiles). `--sass` compares what
ptxas made of them.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from itertools import product
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# (dtype, head_dim, page_size, qhead_per_kvhead) x config spec x has_lse
DEFAULT_KEY = ("bfloat16", 128, 16, 4)
OTHER_KEYS = (
    ("float16", 128, 16, 4),
    ("bfloat16", 64, 16, 3),
    ("bfloat16", 256, 16, 2),
    ("bfloat16", 128, 128, 4),
    ("bfloat16", 128, 32, 8),
    ("bfloat16", 64, 128, 1),
)


# `--served`: GQA groups and model-feature sets enumerated (softcap and sinks together: they
# change different code, the softmax and the epilogue)
SERVED_GROUPS = (1, 3, 4, 8)
SERVED_FEATURES = (
    {},
    {"sliding_window": True},
    {"softcap": True, "sinks": True},
    {"sliding_window": True, "softcap": True, "sinks": True},
)

# configs that do not build DEFAULT_KEY (mma_wgs=3: head dim 64 only) are built for this one
HD64_KEY = ("bfloat16", 64, 16, 4)


def _key_for(spec: str, key):
    from vllm_fa4.kernels.config import KernelConfig, KernelKey

    if KernelConfig.parse(spec).unsupported_reason(KernelKey(*key)) is None:
        return key
    return HD64_KEY


def _cases(which: str, specs: list[str], key=DEFAULT_KEY):
    from vllm_fa4.kernels.config import DEBUG_BASELINE

    for spec in specs:
        yield _key_for(spec, key), spec, False
    yield key, DEBUG_BASELINE.spec, True
    if which == "all":
        for key in OTHER_KEYS:
            yield key, DEBUG_BASELINE.spec, False


def _case_name(key, spec: str, has_lse: bool) -> str:
    dtype, hd, page, gqa = key
    return f"{dtype}-hd{hd}-p{page}-g{gqa}-{spec.replace('+', '_')}{'-lse' if has_lse else ''}"


def served_cases():
    """[(case name, KernelKey, KernelConfig)]: every config serving can launch, once per key
    class (head dim, page size class, feature set) it is served in; see the module doc."""
    from vllm_fa4.kernels.config import (
        SUPPORTED_DTYPES,
        SUPPORTED_HEAD_DIMS,
        SUPPORTED_PAGE_SIZES,
        KernelKey,
    )
    from vllm_fa4.paged_prefill.policy import serving_configs

    cases = []
    for head_dim in SUPPORTED_HEAD_DIMS:
        for long_page in (False, True):
            pages = [p for p in SUPPORTED_PAGE_SIZES if (p >= 128) == long_page]
            for features in SERVED_FEATURES:
                uses: dict = {}  # config -> [(key, role)], in the order first served
                # dtype varies fastest, then the page size: neighbouring picks differ in both
                for group, page, dtype in product(SERVED_GROUPS, pages, SUPPORTED_DTYPES):
                    key = KernelKey(dtype, head_dim, page, group, **features)
                    if key.unsupported_reason() is not None:
                        continue
                    configs = serving_configs(key)
                    for config in configs.all:
                        role = (
                            "both"
                            if configs.long == configs.short
                            else ("long" if config == configs.long else "short")
                        )
                        uses.setdefault(config, []).append((key, role))
                for config, keys in uses.items():
                    key, role = keys[len(cases) % len(keys)]
                    cases.append((_served_name(key, role), key, config))
    return cases


def fp8_cases():
    """[(case name, KernelKey, KernelConfig)]: every config serving launches on an FP8 cache,
    once per head dim (testing.variants.served_configs: the converters' code differs by head
    dim, not by page size or feature beyond what the 16-bit cases cover)."""
    from vllm_fa4.testing.variants import served_configs

    return [
        (f"{_served_name(key, 'fp8')}-{config.spec.replace('+', '_')}", key, config)
        for key, config in served_configs()
        if key.fp8_kv
    ]


def _served_name(key, role: str) -> str:
    feats = "".join(
        f"-{name}" for name in ("sliding_window", "softcap", "sinks") if getattr(key, name)
    )
    feats += f"-kv_{key.kv_dtype}" if key.kv_dtype else ""
    g = key.qhead_per_kvhead
    return f"{key.dtype}-hd{key.head_dim}-p{key.page_size}-g{g}{feats}-{role}"


def _compile(key, config, has_lse: bool, dump_dir: str) -> None:
    from vllm_fa4.kernels.compile import compile_kernel
    from vllm_fa4.kernels.config import KernelConfig, KernelKey

    if isinstance(key, tuple):
        key = KernelKey(*key)
    if isinstance(config, str):
        config = KernelConfig.parse(config)
    compile_kernel(key, config, has_lse, dump_dir=dump_dir)


# What normalize_ptx does, written as hashes.txt's first line: a --compare against a folder
# another version wrote would report every case as different (2: registers renumbered).
NORMALIZATION = "normalization 2"

# Virtual registers (%r12, %rd3, %f7, %p1, ...), not the declarations (%r<230>) or the special
# registers (%tid.x).
VIRTUAL_REGISTER = re.compile(r"%(rd|rs|r|fd|f|p|hh|h)(\d+)\b")


def renumber_registers(text: str) -> str:
    """Each class's virtual registers renumbered in order of first appearance: a one-to-one
    renaming, the same program. The DSL's numbering can depend on what the process compiled
    before (session 33: one config's PTX came out numbered differently in the tool's long-lived
    process, the same instructions, and byte-identical when compiled alone)."""
    numbers: dict[str, dict[str, int]] = {}

    def renumber(m: re.Match) -> str:
        seen = numbers.setdefault(m.group(1), {})
        return f"%{m.group(1)}{seen.setdefault(m.group(2), len(seen))}"

    return VIRTUAL_REGISTER.sub(renumber, text)


def normalize_ptx(text: str) -> str:
    text = re.sub(r"//[^\n]*", "", text)
    m = re.search(r"\.entry\s+([A-Za-z0-9_$]+)", text)
    if m:
        text = text.replace(m.group(1), "KERNEL")
    text = renumber_registers(text)
    return "\n".join(line.rstrip() for line in text.splitlines() if line.strip()) + "\n"


def cuobjdump() -> str | None:
    """cuobjdump: the copy Triton bundles (in this venv), else the one on PATH, else None."""
    try:
        import triton

        tool = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
        if tool.exists():
            return str(tool)
    except ImportError:
        pass
    return shutil.which("cuobjdump")


def _sass(cubin: Path) -> str:
    out = subprocess.run(
        [cuobjdump(), "-sass", str(cubin)], capture_output=True, text=True, check=True
    )
    m = re.search(r"Function\s*:\s*(\S+)", out.stdout)
    text = out.stdout.replace(m.group(1), "KERNEL") if m else out.stdout
    return "\n".join(line for line in text.splitlines() if "Function" in line or "/*" in line)


def fingerprint(name: str, case, out_dir: Path, sass: bool) -> dict[str, str]:
    """Compile one case (key, config, has_lse) with its PTX and cubin dumped and return
    {"<name> <artifact>": sha256}."""
    key, config, has_lse = case
    dump = tempfile.mkdtemp(prefix="kernel-fingerprint-")  # this compile's files only
    try:
        _compile(key, config, has_lse, dump)
        ptx = sorted(Path(dump).rglob("*.ptx"))
        if len(ptx) != 1:
            raise RuntimeError(f"{name}: expected one PTX file, found {len(ptx)}")
        text = normalize_ptx(ptx[0].read_text())
        (out_dir / f"{name}.ptx").write_text(text)
        hashes = {"ptx": hashlib.sha256(text.encode()).hexdigest()}
        if sass:
            cubins = sorted(Path(dump).rglob("*.cubin"))
            if len(cubins) != 1:
                raise RuntimeError(f"{name}: expected one cubin, found {len(cubins)}")
            text = _sass(cubins[0])
            (out_dir / f"{name}.sass").write_text(text)
            hashes["sass"] = hashlib.sha256(text.encode()).hexdigest()
    finally:
        shutil.rmtree(dump, ignore_errors=True)
    return {f"{name} {kind}": h for kind, h in hashes.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="folder for PTX files and hashes.txt")
    ap.add_argument("--compare", type=Path, help="an earlier --out folder to compare against")
    ap.add_argument(
        "--served",
        action="store_true",
        help="every config serving can launch, per key class (ignores --keys/--configs/--key)",
    )
    ap.add_argument(
        "--only",
        metavar="REGEX",
        help="build only the cases whose name matches (a quick check between full runs)",
    )
    ap.add_argument("--keys", choices=("default", "all"), default="all")
    ap.add_argument(
        "--configs",
        default=None,
        help="config specs separated by spaces (default: every config the test sweep uses)",
    )
    ap.add_argument(
        "--key",
        default=",".join(map(str, DEFAULT_KEY)),
        help="dtype,head_dim,page_size,qhead_per_kvhead the --configs are built for "
        "(default %(default)s)",
    )
    ap.add_argument("--sass", action="store_true", help="also hash SASS (needs cuobjdump)")
    ap.add_argument(
        "--retries",
        type=int,
        default=2,
        help="rebuilds of a case that differs from --compare before it counts (default 2)",
    )
    args = ap.parse_args(argv)
    if args.sass and cuobjdump() is None:
        ap.error("--sass needs cuobjdump (Triton's bundled copy or one on PATH)")

    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    sys.path.insert(0, str(REPO))
    if args.served:
        served = served_cases() + fp8_cases()
        cases = [(name, (key, config, False)) for name, key, config in served]
        distinct = len({case[1] for _, case in cases})
        print(f"{len(cases)} served builds, {distinct} distinct configs", flush=True)
    else:
        if args.configs:
            specs = args.configs.split()
        else:
            from vllm_fa4.testing.variants import ALL_CONFIGS

            specs = [c.spec for c in ALL_CONFIGS]
        dtype, *dims = args.key.split(",")
        cases = [
            (_case_name(*case), case) for case in _cases(args.keys, specs, (dtype, *map(int, dims)))
        ]
        if args.keys == "all":  # the FP8 cache's converter paths
            cases += [(name, (key, config, False)) for name, key, config in fp8_cases()]
    if args.only:
        cases = [(name, case) for name, case in cases if re.search(args.only, name)]
    args.out.mkdir(parents=True, exist_ok=True)
    hashes: dict[str, str] = {}
    before = {}
    if args.compare is not None:
        lines = (args.compare / "hashes.txt").read_text().splitlines()
        if not lines or lines[0] != NORMALIZATION:
            found = lines[0] if lines and lines[0].startswith("normalization") else "none"
            ap.error(
                f"{args.compare} was written with another PTX normalization ({found}, this tool: "
                f"{NORMALIZATION}); run this tool on the earlier commit again"
            )
        before = dict(line.rsplit(" ", 1) for line in lines[1:])
    rebuilt = []
    for i, (name, case) in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] {name}", flush=True)
        got = fingerprint(name, case, args.out, args.sass)
        # The compiler's output is not always the same for the same source (seen at head dim
        # 64, page 64, one head per group: 2 of ~200 builds, gone on a rebuild), so a case
        # that differs is rebuilt before it counts: a real change differs every time.
        for _ in range(args.retries):
            if all(before.get(k, v) == v for k, v in got.items()):
                break
            rebuilt.append(name)
            print(f"  differs; rebuilding {name}", flush=True)
            got = fingerprint(name, case, args.out, args.sass)
        hashes.update(got)
    lines = [NORMALIZATION] + [f"{k} {v}" for k, v in sorted(hashes.items())]
    (args.out / "hashes.txt").write_text("".join(line + "\n" for line in lines))
    if args.compare is None:
        return 0
    differ = new = 0
    for k, v in sorted(hashes.items()):
        old = before.get(k)
        status = "same" if old == v else ("NEW" if old is None else "DIFF")
        differ += status == "DIFF"
        new += status == "NEW"
        print(f"{status:4} {k}")
    # A served case that vanished or appeared means the served set itself changed.
    missing = 0 if args.only else len(before.keys() - hashes.keys())
    print(f"{differ} of {len(hashes)} differ ({new} new, {missing} of the earlier run missing)")
    if rebuilt:
        print(f"rebuilt after a first difference: {', '.join(rebuilt)}")
    return 1 if differ or (args.served and (new or missing)) else 0


if __name__ == "__main__":
    sys.exit(main())
