"""A host model of an fp8 cache's pipelines (fp8_kv.py, fwd_sm90.produce_and_convert): the
TMA warp's loads into the staging ring, the converter warps' conversions into the 16-bit
stages, the consumers' GEMMs, over tiles of several blocks. With `converters=4` the TMA warp
converts too, one block behind its loads: two staging slots keep every agent live, one
deadlocks (so config.py refuses it), while today's three converters live with one."""

from __future__ import annotations

import random

import pytest

from vllm_fa4.kernels.config import KV_STAGES, KernelConfig, KernelKey


def converter_order(n: int) -> list[tuple[str, int]]:
    """The overlapped steps' order (convert): K_0, then K_i before V_(i-1), then the last V."""
    order = [("K", 0)]
    for i in range(1, n):
        order += [("K", i), ("V", i - 1)]
    return order + [("V", n - 1)]


def tma_warp_ops(n: int, converts: bool) -> list[tuple]:
    """The TMA warp's ops for a tile of n blocks (produce / produce_and_convert)."""
    ops = [("load", "K", 0)]
    for i in range(1, n):
        ops += [("load", "K", i), ("load", "V", i - 1)]
        if converts:
            ops.append(("convert", "K", i - 1))
            if i > 1:
                ops.append(("convert", "V", i - 2))
    ops.append(("load", "V", n - 1))
    if converts:
        ops.append(("convert", "K", n - 1))
        if n > 1:
            ops.append(("convert", "V", n - 2))
        ops.append(("convert", "V", n - 1))
    return ops


def consumer_ops(n: int) -> list[tuple]:
    """S_0 = Q K_0^T, then S_j with K_j and P V with V_(j-1), then the last P V."""
    ops = [("gemm", "K", 0)]
    for j in range(1, n):
        ops += [("gemm", "K", j), ("gemm", "V", j - 1)]
    return ops + [("gemm", "V", n - 1)]


def simulate(tiles: list[int], converters: int, staging_slots: int, seed: int) -> bool:
    """Runs every agent's ops in a random order of whichever is ready; True if all finish.
    Block indices run on across tiles, as the pipeline states do."""
    tma_converts = converters == 4
    walkers = converters - 1 if tma_converts else converters
    warps = ["tma"] + [f"w{r}" for r in range(walkers)]
    agents: dict[str, list[tuple]] = {name: [] for name in [*warps, "consumer"]}
    base = 0
    for n in tiles:

        def shift(op, base=base):
            return (op[0], op[1], op[2] + base)

        agents["tma"] += [shift(op) for op in tma_warp_ops(n, tma_converts)]
        for name in warps[1:]:
            agents[name] += [shift(("convert", t, j)) for t, j in converter_order(n)]
        agents["consumer"] += [shift(op) for op in consumer_ops(n)]
        base += n
    converting = [w for w in warps if tma_converts or w != "tma"]
    loaded: set = set()
    converted: dict = {}  # (tensor, block) -> warps done
    released: set = set()  # 16-bit stages the consumers freed

    def ready(op) -> bool:
        kind, t, j = op
        if kind == "load":  # the staging slot's previous tile converted by every converter
            return j < staging_slots or len(converted.get((t, j - staging_slots), ())) == len(
                converting
            )
        if kind == "convert":  # landed, and the 16-bit stage freed by the consumers
            return (t, j) in loaded and (j < KV_STAGES or (t, j - KV_STAGES) in released)
        return len(converted.get((t, j), ())) == len(converting)  # gemm: the stage is full

    def run(name, op) -> None:
        kind, t, j = op
        if kind == "load":
            loaded.add((t, j))
        elif kind == "convert":
            converted.setdefault((t, j), set()).add(name)
        else:
            released.add((t, j))

    rng = random.Random(seed)
    pos = dict.fromkeys(agents, 0)
    while True:
        live = [a for a in agents if pos[a] < len(agents[a])]
        if not live:
            return True
        runnable = [a for a in live if ready(agents[a][pos[a]])]
        if not runnable:
            return False
        name = rng.choice(runnable)
        run(name, agents[name][pos[name]])
        pos[name] += 1


TILES = [1, 2, 5, 1, 3, 7]


@pytest.mark.parametrize("seed", range(20))
def test_the_tma_warp_converting_never_deadlocks_with_two_staging_slots(seed):
    assert simulate(TILES, converters=4, staging_slots=2, seed=seed)


@pytest.mark.parametrize("seed", range(5))
def test_one_staging_slot_deadlocks_only_when_the_tma_warp_converts(seed):
    assert not simulate(TILES, converters=4, staging_slots=1, seed=seed)
    assert simulate(TILES, converters=3, staging_slots=1, seed=seed)  # head dim 256 today


def test_the_config_refuses_what_the_model_deadlocks_on():
    fp8 = dict(kv_dtype="float8_e4m3fn")
    config = KernelConfig.parse("queue+pv_wait_mid+lazy_max+converters=4")
    assert config.unsupported_reason(KernelKey("bfloat16", 128, 16, 4, **fp8)) is None
    assert config.staging_stages(KernelKey("bfloat16", 128, 16, 4, **fp8)) == 2
    hd256 = KernelKey("bfloat16", 256, 16, 4, **fp8)
    assert config.staging_stages(hd256) == 1
    assert "one fp8 staging slot" in KernelConfig.parse(
        "queue+overlap+converters=4"
    ).unsupported_reason(hd256)
