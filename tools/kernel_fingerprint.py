#!/usr/bin/env python3
"""Machine-code fingerprint of the prefill kernel: compile a set of (key, config, lse) cases for
sm_90a on the CPU and hash their normalized PTX, so a refactor can prove it left the code alone.

    python tools/kernel_fingerprint.py --out /tmp/fp-before           # before the change
    python tools/kernel_fingerprint.py --out /tmp/fp-after --compare /tmp/fp-before

Writes one normalized PTX file per case and `hashes.txt` (case, sha256). `--compare` prints
`same` / `DIFF` per case and exits 1 on any difference (a refactor must print no DIFF). With
`--sass`, cuobjdump (where installed) disassembles the cubins too and hashes the SASS as well.

Normalization only removes what names the source, never what the GPU runs: comments, and the
entry's name (it embeds the Python module and class path) replaced by `KERNEL` everywhere.
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


# configs that do not build DEFAULT_KEY (mma_wgs=3: head dim 64 only) are built for this one
HD64_KEY = ("bfloat16", 64, 16, 4)


def _key_for(spec: str, key):
    from vllm_fa4.kernels.config import KernelConfig, KernelKey

    if KernelConfig.parse(spec).unsupported_reason(KernelKey(*key)) is None:
        return key
    return HD64_KEY


def _cases(which: str, specs: list[str], key=DEFAULT_KEY):
    for spec in specs:
        yield _key_for(spec, key), spec, False
    yield key, "base", True
    if which == "all":
        for key in OTHER_KEYS:
            yield key, "base", False


def _case_name(key, spec: str, has_lse: bool) -> str:
    dtype, hd, page, gqa = key
    return f"{dtype}-hd{hd}-p{page}-g{gqa}-{spec.replace('+', '_')}{'-lse' if has_lse else ''}"


def _compile(key, spec: str, has_lse: bool) -> None:
    from vllm_fa4.kernels.compile import compile_kernel
    from vllm_fa4.kernels.config import KernelConfig, KernelKey

    compile_kernel(KernelKey(*key), KernelConfig.parse(spec), has_lse)


def normalize_ptx(text: str) -> str:
    text = re.sub(r"//[^\n]*", "", text)
    m = re.search(r"\.entry\s+([A-Za-z0-9_$]+)", text)
    if m:
        text = text.replace(m.group(1), "KERNEL")
    return "\n".join(line.rstrip() for line in text.splitlines() if line.strip()) + "\n"


def _sass(cubin: Path) -> str | None:
    tool = shutil.which("cuobjdump")
    if tool is None:
        return None
    out = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True)
    m = re.search(r"Function\s*:\s*(\S+)", out.stdout)
    text = out.stdout.replace(m.group(1), "KERNEL") if m else out.stdout
    return "\n".join(line for line in text.splitlines() if "Function" in line or "/*" in line)


def fingerprint(case, out_dir: Path, sass: bool) -> dict[str, str]:
    """Compile one case with the DSL's dump options and return {artifact: sha256}."""
    key, spec, has_lse = case
    name = _case_name(key, spec, has_lse)
    # The DSL reads its dump folder once, at import: empty it before every case.
    dump = os.environ["CUTE_DSL_DUMP_DIR"]
    shutil.rmtree(dump, ignore_errors=True)
    os.makedirs(dump)
    _compile(key, spec, has_lse)
    hashes = {}
    ptx = sorted(Path(dump).rglob("*.ptx"))
    if len(ptx) != 1:
        raise RuntimeError(f"{name}: expected one PTX file, found {len(ptx)}")
    text = normalize_ptx(ptx[0].read_text())
    (out_dir / f"{name}.ptx").write_text(text)
    hashes["ptx"] = hashlib.sha256(text.encode()).hexdigest()
    cubins = sorted(Path(dump).rglob("*.cubin"))
    if sass and cubins:
        text = _sass(cubins[0])
        if text is not None:
            (out_dir / f"{name}.sass").write_text(text)
            hashes["sass"] = hashlib.sha256(text.encode()).hexdigest()
    return {f"{name} {kind}": h for kind, h in hashes.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="folder for PTX files and hashes.txt")
    ap.add_argument("--compare", type=Path, help="an earlier --out folder to compare against")
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
    args = ap.parse_args(argv)

    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    os.environ["CUTE_DSL_KEEP"] = "ptx,cubin" if args.sass else "ptx"
    os.environ["CUTE_DSL_DUMP_DIR"] = tempfile.mkdtemp(prefix="kernel-fingerprint-")
    sys.path.insert(0, str(REPO))
    if args.configs:
        specs = args.configs.split()
    else:
        from vllm_fa4.testing.variants import ALL_CONFIGS

        specs = [c.spec for c in ALL_CONFIGS]
    args.out.mkdir(parents=True, exist_ok=True)
    hashes: dict[str, str] = {}
    dtype, *dims = args.key.split(",")
    cases = list(_cases(args.keys, specs, (dtype, *map(int, dims))))
    for i, case in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] {_case_name(*case)}", flush=True)
        hashes.update(fingerprint(case, args.out, args.sass))
    (args.out / "hashes.txt").write_text("".join(f"{k} {v}\n" for k, v in sorted(hashes.items())))
    if args.compare is None:
        return 0
    before = dict(
        line.rsplit(" ", 1) for line in (args.compare / "hashes.txt").read_text().splitlines()
    )
    differ = 0
    for k, v in sorted(hashes.items()):
        old = before.get(k)
        status = "same" if old == v else ("NEW" if old is None else "DIFF")
        differ += status == "DIFF"
        print(f"{status:4} {k}")
    print(f"{differ} of {len(hashes)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
