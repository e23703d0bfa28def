"""run_prefill on CPU: validation, route selection, and the reference route's output."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from vllm_fa4 import envs
from vllm_fa4.kernels import launch as launch_mod
from vllm_fa4.kernels.config import DEFAULT_CONFIG, KernelConfig, KernelKey, KvBox
from vllm_fa4.kernels.launch import LaunchArgs
from vllm_fa4.paged_prefill import reference as reference_mod
from vllm_fa4.paged_prefill import route as route_mod
from vllm_fa4.paged_prefill import run as run_mod
from vllm_fa4.paged_prefill import run_prefill, select_route, split_kv_cache
from vllm_fa4.paged_prefill.policy import serving_configs
from vllm_fa4.testing.cases import make_paged_case

KEY = KernelKey("bfloat16", 128, 16, 4, True)
CONFIG = DEFAULT_CONFIG
CONFIGS = serving_configs(KEY, CONFIG)
ROUTE_ENV = envs.PREFILL_ROUTE


@pytest.fixture(autouse=True)
def _fresh_routes(monkeypatch):
    monkeypatch.delenv(ROUTE_ENV, raising=False)
    route_mod.clear_route_cache()
    run_mod._said.clear()
    yield
    route_mod.clear_route_cache()


def _setup(
    specs=((5, 40), (0, 7), (17, 17), (33, 100)), hq=8, hkv=2, d=64, page=16, dtype=torch.bfloat16
):
    case = make_paged_case(list(specs), hq, hkv, d, page, dtype, "cpu", seed=11)
    plan = case.plan()
    return case, plan


def test_reference_route_matches_reference(caplog):
    with caplog.at_level(logging.INFO, logger="vllm_fa4"):  # the plan decides the route
        case, plan = _setup()
    assert any("reference" in r.getMessage() for r in caplog.records)
    k, v = split_kv_cache(case.kv_cache_vllm, case.head_dim)
    out = case.new_out()
    lse = torch.full((case.num_q_heads, case.num_tokens), float("nan"))
    run_prefill(plan, case.q, k, v, out, softmax_scale=case.softmax_scale, lse=lse)
    ref, ref_lse = case.reference()
    assert torch.isfinite(out).all()
    assert torch.equal(out, ref.to(out.dtype))
    torch.testing.assert_close(lse, ref_lse)


def test_route_is_reference_on_cpu_and_logged_once(caplog):
    with caplog.at_level(logging.INFO, logger="vllm_fa4"):
        assert select_route(KEY, CONFIGS, torch.device("cpu")) == "reference"
        assert select_route(KEY, CONFIGS, torch.device("cpu")) == "reference"
    msgs = [r for r in caplog.records if r.name == "vllm_fa4"]
    assert len(msgs) == 1 and "not a CUDA GPU" in msgs[0].getMessage()


def test_forced_kernel_route_raises_without_gpu(monkeypatch):
    monkeypatch.setenv(ROUTE_ENV, "kernel")
    with pytest.raises(RuntimeError, match="VLLM_FA4_PREFILL_ROUTE=kernel.*not a CUDA GPU"):
        select_route(KEY, CONFIGS, "cpu")
    with pytest.raises(RuntimeError, match="no FA4 prefill kernel"):
        _setup()  # the plan's maker decides the route (the builder: once, at startup)


def test_bad_route_env(monkeypatch):
    monkeypatch.setenv(ROUTE_ENV, "fast")
    with pytest.raises(ValueError, match="expected one of"):
        select_route(KEY, CONFIGS, "cpu")


class _FakeLaunch:
    """Stands in for kernels.launch.prefill_forward on a pretend SM90 device."""

    def __init__(self):
        self.calls = []

    def prefill_forward(self, *args, **features):
        self.calls.append(args)
        self.features = features


@pytest.fixture
def fake_sm90(monkeypatch):
    fake = _FakeLaunch()
    monkeypatch.setattr(launch_mod, "prefill_forward", fake.prefill_forward)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    return fake


def test_kernel_route_when_available(fake_sm90, caplog):
    with caplog.at_level(logging.INFO, logger="vllm_fa4"):
        assert select_route(KEY, CONFIGS, "cuda:0") == "kernel"
    assert any("-> kernel" in r.getMessage() for r in caplog.records)


def test_forced_reference_warns_when_kernel_exists(fake_sm90, monkeypatch, caplog):
    monkeypatch.setenv(ROUTE_ENV, "reference")
    with caplog.at_level(logging.INFO, logger="vllm_fa4"):
        assert select_route(KEY, CONFIGS, "cuda:0") == "reference"
    warn = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warn and "although a compiled kernel exists" in warn[0].getMessage()


@pytest.mark.parametrize(
    "key, config, words",
    [
        (KernelKey("bfloat16", 96, 16, 4, True), CONFIG, "head dim 96"),
        (KernelKey("bfloat16", 128, 16, 256, True), CONFIG, "GQA group size 256"),
        (KEY, KernelConfig.parse("v_warp"), "'v_warp' needs 'queue_with_work'"),
    ],
)
def test_no_kernel_on_gpu_is_an_error_not_a_fallback(fake_sm90, key, config, words):
    """Route ``auto`` on a GPU: a key or config without a kernel raises (the builder asks at
    startup), naming the reason and both ways out; it never runs the slow reference."""
    with pytest.raises(RuntimeError, match="no prefill kernel") as err:
        select_route(key, serving_configs(key, config), "cuda:0")
    msg = str(err.value)
    assert words in msg and "FLASH_ATTN" in msg and f"{ROUTE_ENV}=reference" in msg


def test_auto_route_on_a_gpu_other_than_sm90_is_an_error(fake_sm90, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    with pytest.raises(RuntimeError, match="NVIDIA A100: compute capability 8.0 is not SM90"):
        select_route(KEY, CONFIGS, "cuda:0")


def test_reference_on_gpu_only_when_asked_for(fake_sm90, monkeypatch, caplog):
    key = KernelKey("bfloat16", 128, 16, 256, True)
    monkeypatch.setenv(ROUTE_ENV, "reference")
    with caplog.at_level(logging.INFO, logger="vllm_fa4"):
        assert select_route(key, CONFIGS, "cuda:0") == "reference"
    assert any("forced by" in r.getMessage() for r in caplog.records)


def test_kernel_route_passes_contract_arguments(fake_sm90, monkeypatch):
    case, plan = _setup(d=128)
    plan = dataclasses.replace(plan, route="kernel")  # as a builder on an SM90 GPU plans
    out, lse = case.new_out(), torch.empty(case.num_q_heads, case.num_tokens)
    run_prefill(plan, case.q, case.k_cache, case.v_cache, out, softmax_scale=0.5, lse=lse)
    (args,) = fake_sm90.calls
    assert args[0] == plan.key and args[1] == plan.config and args[2] is case.q
    assert args[5] is out and args[6] is lse and args[8] == 0.5
    launch = args[7]
    assert isinstance(launch, LaunchArgs) and launch is plan.args
    assert launch.cu_seqlens_q is case.cu_seqlens_q and launch.seqused_k is case.seqused_k
    assert launch.page_table is case.page_table and launch.work_tiles.shape == (plan.num_tiles, 4)
    assert fake_sm90.features == dict(window_left=None, softcap=None, sinks=None)


def test_kernel_route_passes_model_features(fake_sm90, monkeypatch):
    from vllm_fa4.testing.cases import make_paged_case

    case = make_paged_case(
        [(40, 300)], 8, 2, 64, 16, torch.float16, "cpu", window_left=31, softcap=5.0, sinks=True
    )
    plan = dataclasses.replace(case.plan(), route="kernel")
    run = dict(softmax_scale=0.5, softcap=5.0, sinks=case.sinks)
    run_prefill(plan, case.q, case.k_cache, case.v_cache, case.new_out(), **run)
    assert fake_sm90.features == dict(window_left=31, softcap=5.0, sinks=case.sinks)
    # a value without its key flag, or a flag without its value, is refused before launch
    for wrong, match in ((dict(softcap=None), "softcap"), (dict(sinks=None), "sinks")):
        with pytest.raises(ValueError, match=match):
            run_prefill(plan, case.q, case.k_cache, case.v_cache, case.new_out(), **run | wrong)
    with pytest.raises(ValueError, match="sinks must be float32"):
        bad_sinks = case.sinks.to(torch.float16)
        run_prefill(
            plan, case.q, case.k_cache, case.v_cache, case.new_out(), **run | dict(sinks=bad_sinks)
        )


def test_reference_route_applies_model_features():
    from vllm_fa4.testing.cases import make_paged_case

    case = make_paged_case(
        [(40, 300), (7, 7)],
        8,
        2,
        64,
        16,
        torch.float32,
        "cpu",
        window_left=31,
        softcap=5.0,
        sinks=True,
    )
    out = case.new_out()
    run_prefill(
        case.plan(),
        case.q,
        case.k_cache,
        case.v_cache,
        out,
        softmax_scale=case.softmax_scale,
        softcap=5.0,
        sinks=case.sinks,
    )
    ref, _ = case.reference()
    plain, _ = case.reference(window_left=None, softcap=None, sinks=None)
    assert torch.allclose(out, ref, atol=1e-5) and not torch.allclose(out, plain, atol=1e-2)


def test_validation_errors():
    case, plan = _setup()
    q, k, v, out = case.q, case.k_cache, case.v_cache, case.new_out()
    s = case.softmax_scale

    def bad(match, **kw):
        args = dict(q=q, k_cache=k, v_cache=v, out=out)
        args.update(kw)
        with pytest.raises(ValueError, match=match):
            run_prefill(
                plan,
                args["q"],
                args["k_cache"],
                args["v_cache"],
                args["out"],
                softmax_scale=kw.get("softmax_scale", s),
                lse=kw.get("lse"),
            )

    bad(r"q has shape \(54, 8, 64\), expected \(55, 8, 64\)", q=q[:-1])
    bad("q has dtype torch.float16", q=q.half())
    bad(r"out has shape", out=out[:, :4])
    bad("out has dtype", out=out.float())
    bad("k_cache has shape", k_cache=k[:, :8])
    bad(r"v_cache has shape .* expected", v_cache=v[:, :, :1])
    bad("k_cache must be", k_cache=k[0])
    bad("contiguous last dim", q=q.transpose(1, 2).contiguous().transpose(1, 2))
    bad("lse must be", lse=torch.empty(8, 3))
    bad("lse must be float32", lse=torch.empty(8, case.num_tokens, dtype=torch.float64))
    bad("softmax_scale must be positive", softmax_scale=0.0)


def _refuse(*args, **kwargs):
    raise AssertionError("an empty plan must launch nothing")


def test_empty_plan_is_a_no_op(monkeypatch):
    """No query rows: neither the kernel nor the reference runs, whatever the route."""
    monkeypatch.setattr(launch_mod, "prefill_forward", _refuse)
    monkeypatch.setattr(run_mod, "paged_attention_reference", _refuse)
    monkeypatch.setattr(reference_mod, "paged_attention_reference", _refuse)
    case, plan = _setup(specs=((0, 7),))
    assert plan.num_tiles == 0
    for route in ("reference", "kernel"):
        out = case.new_out()
        empty = dataclasses.replace(plan, route=route)
        run_prefill(empty, case.q, case.k_cache, case.v_cache, out, softmax_scale=1.0)
        assert out.shape[0] == 0


def test_run_follows_the_plans_route_without_deciding_again(monkeypatch, fake_sm90):
    """The route is decided once, when the plan is made (the builder: at startup); a run
    neither asks select_route nor reads the environment again."""
    case, plan = _setup(d=128)
    assert plan.route == "reference"  # CPU
    monkeypatch.setattr(route_mod, "select_route", _refuse)
    monkeypatch.setenv(ROUTE_ENV, "not-a-route")  # read per call, this would raise
    args = (case.q, case.k_cache, case.v_cache)
    run_prefill(plan, *args, case.new_out(), softmax_scale=0.5)
    assert fake_sm90.calls == []
    run_prefill(dataclasses.replace(plan, route="kernel"), *args, case.new_out(), softmax_scale=0.5)
    assert len(fake_sm90.calls) == 1


def _padded_views(case, pad: int):
    """The case's cache copied into vLLM's padded-page layout (each block ``pad`` elements
    longer: ``page_size_padded``), as split_kv_cache views."""
    nb, page, hkv, packed = case.kv_cache.shape
    block = page * hkv * packed + pad
    raw = torch.full((nb * block + 8,), float("nan"), dtype=case.dtype)
    phys = raw[8:].as_strided(case.kv_cache.shape, (block, hkv * packed, packed, 1))
    phys.copy_(case.kv_cache)
    return split_kv_cache(phys.permute(0, 2, 1, 3), case.head_dim)


def test_padded_pages_run_wide_box_configs_as_per_chunk(fake_sm90, monkeypatch, caplog):
    """A layout the spec did not announce (blocks that are not whole wide boxes) is served
    with per-chunk boxes, logged once; never an exception mid-request."""
    case, _ = _setup(d=128, hkv=3, hq=12)
    plan = case.plan()
    wide = dataclasses.replace(plan.config, kv_box=KvBox.WIDE)
    plan = dataclasses.replace(plan, config=wide, route="kernel")
    k, v = _padded_views(case, pad=8)  # 16 bytes: aligned, but not a whole 16-slot box
    with caplog.at_level(logging.WARNING, logger="vllm_fa4"):
        for _ in range(2):
            run_prefill(plan, case.q, k, v, case.new_out(), softmax_scale=0.5)
    assert [c[1] for c in fake_sm90.calls] == [
        dataclasses.replace(wide, kv_box=KvBox.PER_CHUNK)
    ] * 2
    said = [r.getMessage() for r in caplog.records if "wide_box" in r.getMessage()]
    assert len(said) == 1 and "not whole" in said[0]
    # the same config on vLLM's unpadded cache is launched as planned
    run_prefill(plan, case.q, case.k_cache, case.v_cache, case.new_out(), softmax_scale=0.5)
    assert fake_sm90.calls[-1][1] == wide


def test_unreadable_layout_runs_the_reference_not_an_exception(fake_sm90, monkeypatch, caplog):
    case, plan = _setup(d=64)
    plan = dataclasses.replace(plan, route="kernel")
    k, v = _padded_views(case, pad=2)  # 4 bytes: no TMA descriptor can address it
    out = case.new_out()
    with caplog.at_level(logging.ERROR, logger="vllm_fa4"):
        run_prefill(plan, case.q, k, v, out, softmax_scale=case.softmax_scale)
    assert fake_sm90.calls == []
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "block stride" in errors[0] and "FLASH_ATTN" in errors[0]
    ref, _ = case.reference()
    assert torch.equal(out, ref.to(out.dtype))


def _shifted(t: torch.Tensor, elements: int) -> torch.Tensor:
    """``t``'s values in a view whose data pointer sits ``elements`` past a fresh buffer's."""
    flat = torch.full((t.numel() + elements,), float("nan"), dtype=t.dtype)
    view = flat[elements:].view(t.shape)
    view.copy_(t)
    return view


@pytest.mark.parametrize("which", ["q", "out"])
@pytest.mark.parametrize("how", ["pointer", "stride"])
def test_unaligned_rows_run_the_reference_not_the_kernel(fake_sm90, caplog, which, how):
    """The kernel is built for 16-byte aligned Q / O pointers and strides: views that break
    that go to the reference with one logged error, never to the kernel (a misaligned load
    would fault the GPU and kill every request in flight)."""
    case, plan = _setup(d=64)
    plan = dataclasses.replace(plan, route="kernel")
    q, out = case.q, case.new_out()
    if how == "pointer":  # 1 element = 2 bytes past a 16-byte boundary
        q, out = (_shifted(q, 1), out) if which == "q" else (q, _shifted(out, 1))
    else:  # a token stride of Hq x D + 1 elements: not whole 16-byte units
        t = q if which == "q" else out
        wide = torch.full((t.shape[0], t.shape[1] * t.shape[2] + 1), float("nan"), dtype=t.dtype)
        view = wide[:, : t.shape[1] * t.shape[2]].view(t.shape)
        view.copy_(t)
        q, out = (view, out) if which == "q" else (q, view)
    with caplog.at_level(logging.ERROR, logger="vllm_fa4"):
        run_prefill(plan, q, case.k_cache, case.v_cache, out, softmax_scale=case.softmax_scale)
    assert fake_sm90.calls == []
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and which in errors[0] and "FLASH_ATTN" in errors[0], errors
    ref, _ = case.reference()
    assert torch.equal(out, ref.to(out.dtype))
    # the aligned views of the same case are launched
    run_prefill(plan, case.q, case.k_cache, case.v_cache, case.new_out(), softmax_scale=0.5)
    assert len(fake_sm90.calls) == 1
