"""The entry point, the enum member FA4, and how vLLM's own argument parsing sees it."""

import logging
import multiprocessing as mp
import pickle
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import pytest

import vllm_fa4


def _enum():
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return AttentionBackendEnum


def test_entry_point_resolves_to_register():
    (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "fa4"]
    assert ep.load() is vllm_fa4.register


def test_register_is_idempotent_and_adds_one_member():
    vllm_fa4.register()
    names = list(_enum().__members__)
    vllm_fa4.register()
    assert list(_enum().__members__) == names
    assert names.count("FA4") == 1
    member = _enum()["FA4"]
    assert member is _enum().FA4 is _enum()(vllm_fa4.BACKEND_CLASS_PATH)
    assert member.get_path() == "vllm_fa4.backend.FA4AttentionBackend"


def test_register_never_raises(monkeypatch, caplog):
    def broken():
        raise RuntimeError("registry moved")

    monkeypatch.setattr(vllm_fa4, "ensure_registered", broken)
    with caplog.at_level(logging.WARNING, logger="vllm_fa4"):
        vllm_fa4.register()  # logs a warning instead of taking vLLM down
    (said,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "could not register the FA4 attention backend" in said and "registry moved" in said


def test_unknown_backend_error_lists_fa4():
    vllm_fa4.register()
    with pytest.raises(ValueError, match="Valid options are: .*FA4"):
        _enum()["NOT_A_BACKEND"]


def _unpickle_in_child(payload, queue):
    # A spawned process has not loaded any plugin: unpickling must register FA4 by itself.
    obj = pickle.loads(payload)
    queue.put((obj["backend"].name, obj["backend"].value))


def test_member_survives_pickle_into_fresh_spawn_process():
    vllm_fa4.register()
    payload = pickle.dumps({"backend": _enum().FA4})
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_unpickle_in_child, args=(payload, queue))
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0
    assert queue.get(timeout=5) == ("FA4", vllm_fa4.BACKEND_CLASS_PATH)


def test_cli_flag_parses_through_engine_args():
    # vLLM's parser needs a platform; force the CPU one in a child so this process stays clean.
    # Both spellings in one child: importing vLLM's CLI is most of the test's time.
    script = textwrap.dedent("""
        import vllm.platforms as platforms
        from vllm.platforms.cpu import CpuPlatform
        platforms._current_platform = CpuPlatform()
        from vllm.config.attention import AttentionConfig
        from vllm.engine.arg_utils import EngineArgs
        from vllm.utils.argparse_utils import FlexibleArgumentParser
        parser = EngineArgs.add_cli_args(FlexibleArgumentParser())  # loads general plugins
        for flag in ("FA4", "fa4"):
            args = parser.parse_args(["--model", "m", "--attention-backend", flag])
            engine_args = EngineArgs.from_cli_args(args)
            member = AttentionConfig.validate_backend_before(engine_args.attention_backend)
            print("RESULT", flag, member.name, member.get_path())
    """)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    for flag in ("FA4", "fa4"):
        assert f"RESULT {flag} FA4 vllm_fa4.backend.FA4AttentionBackend" in out.stdout


def test_attention_config_accepts_member():
    from vllm.config.attention import AttentionConfig

    vllm_fa4.register()
    assert AttentionConfig(backend="FA4").backend is _enum().FA4
