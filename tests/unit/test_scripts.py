"""scripts/*.sh: serve.sh refuses a machine it cannot serve on, in a line or two and before
installing anything; _venv.sh refuses an old Python before making a venv and rebuilds a venv
made by another Python; test.sh runs the files it is given, or the README suite.

Each test runs the real scripts from a copy of scripts/ in an empty folder (so anything they
would make lands there) with fake ``nvidia-smi`` and ``python`` programs first on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PATH = "/usr/bin:/bin"


@pytest.fixture
def checkout(tmp_path):
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    (tmp_path / "bin").mkdir()
    return tmp_path


def fake(checkout: Path, name: str, script: str) -> Path:
    """An executable ``bin/name`` in ``checkout`` running the shell ``script``."""
    path = checkout / "bin" / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(script))
    path.chmod(0o755)
    return path


def fake_gpu(checkout: Path, *gpus: str) -> None:
    """nvidia-smi answering the query serve.sh makes with ``gpus`` ("name, compute cap")."""
    lines = "".join(f"echo '{gpu}'\n" for gpu in gpus)
    fake(checkout, "nvidia-smi", lines)


def run(checkout: Path, script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {"PATH": f"{checkout / 'bin'}:{SYSTEM_PATH}", "HOME": str(checkout), **env}
    return subprocess.run(
        [shutil.which("bash"), str(checkout / "scripts" / script), *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def made_nothing(checkout: Path) -> bool:
    return sorted(p.name for p in checkout.iterdir()) == ["bin", "scripts"]


def test_serve_without_nvidia_smi_says_what_is_needed_and_installs_nothing(checkout):
    if shutil.which("nvidia-smi", path=SYSTEM_PATH):
        pytest.skip("this machine has nvidia-smi in /usr/bin or /bin")
    out = run(checkout, "serve.sh")
    assert out.returncode == 1 and out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 2, out.stderr
    assert "needs an NVIDIA Hopper GPU (SM90: H100, H200, GH200)" in lines[0]
    assert "no NVIDIA GPU found (no nvidia-smi on PATH)" in lines[0]
    assert "scripts/test.sh" in lines[1] and "FLASH_ATTN" in lines[1]
    assert made_nothing(checkout)


def test_serve_on_another_gpu_names_it_and_installs_nothing(checkout):
    fake_gpu(checkout, "NVIDIA A100-SXM4-80GB, 8.0", "NVIDIA L4, 8.9")
    out = run(checkout, "serve.sh", "meta-llama/Llama-3.1-8B-Instruct")
    assert out.returncode == 1
    assert (
        "found NVIDIA A100-SXM4-80GB (compute capability 8.0); NVIDIA L4 (compute capability 8.9)"
        in out.stderr
    )
    assert len(out.stderr.splitlines()) == 2 and made_nothing(checkout)


def test_serve_when_nvidia_smi_fails_says_so(checkout):
    fake(checkout, "nvidia-smi", "echo 'NVIDIA-SMI has failed: no driver' >&2; exit 9\n")
    out = run(checkout, "serve.sh")
    assert out.returncode == 1 and "nvidia-smi failed: NVIDIA-SMI has failed" in out.stderr
    assert made_nothing(checkout)


def test_serve_on_hopper_refuses_an_old_python_before_making_a_venv(checkout):
    """Past the GPU check, the Python check: 3.10 (a real first run's) is refused in two lines."""
    fake_gpu(checkout, "NVIDIA H100 80GB HBM3, 9.0")
    old = fake(checkout, "python3", "echo 3.10.13\n")
    out = run(checkout, "serve.sh", PYTHON=str(old))
    assert out.returncode == 1
    assert f"needs Python >= 3.11 ({old} is 3.10.13)" in out.stderr
    assert "PYTHON=/path/to/python3.11" in out.stderr
    assert made_nothing(checkout)


def test_without_python_set_every_python3_on_path_is_tried(checkout):
    """PATH holds only the fakes and the tools the scripts use: python3 is 3.10, python3.12
    3.9, the others absent; the refusal quotes the first one found."""
    for tool in ("dirname", "grep", "sed", "head", "paste", "rm"):
        (checkout / "bin" / tool).symlink_to(shutil.which(tool))
    fake_gpu(checkout, "NVIDIA GH200 480GB, 9.0")
    fake(checkout, "python3", "echo 3.10.13\n")
    fake(checkout, "python3.12", "echo 3.9.2\n")
    out = run(checkout, "serve.sh", PATH=str(checkout / "bin"))
    assert out.returncode == 1, out.stderr
    assert "needs Python >= 3.11 (python3 is 3.10.13)" in out.stderr
    assert made_nothing(checkout)


def test_venv_made_by_another_python_is_rebuilt(checkout):
    """A .venv left by a Python 3.10 run is removed, not reused (the new Python then makes the
    venv: here a fake that stops there, so nothing is installed)."""
    fake_gpu(checkout, "NVIDIA H200, 9.0")
    old_venv = checkout / ".venv" / "bin"
    old_venv.mkdir(parents=True)
    (old_venv / "python").write_text("#!/bin/sh\necho 3.10.13\n")
    (old_venv / "python").chmod(0o755)
    new = fake(checkout, "python3.11", 'case "$1" in -c) echo 3.11.7;; *) exit 3;; esac\n')
    out = run(checkout, "serve.sh", PYTHON=str(new))
    assert "== .venv was made by Python 3.10.13, not 3.11.7" in out.stdout
    assert "rebuilding it" in out.stdout and f"creating .venv with Python 3.11.7 ({new})" in (
        out.stdout
    )
    assert out.returncode == 3 and not (checkout / ".venv").exists()


@pytest.fixture
def installed(checkout):
    """A .venv whose python is this test's interpreter, except that it answers the "is it
    installed" probe with yes (skipping the install) and ``-m pytest`` by printing its
    arguments instead of running them."""
    bin_dir = checkout / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python"
    python.write_text(
        textwrap.dedent(f"""\
            #!/bin/sh
            case "$*" in *"import vllm_fa4, vllm"*) exit 0;; esac
            if [ "$1" = -m ] && [ "$2" = pytest ]; then shift 2; echo "PYTEST $*"; exit 0; fi
            exec {sys.executable} "$@"
            """)
    )
    python.chmod(0o755)
    return checkout


@pytest.mark.parametrize(
    "args, pytest_args",
    [
        ([], "-q -n 2 tests"),  # the README suite, two workers (no GPU here)
        (["-k", "plan"], "-q -n 2 tests -k plan"),
        (["tests/unit/test_plan.py"], "-q -n 0 tests/unit/test_plan.py"),  # just that file
        (
            ["tests/unit/test_plan.py", "tests/unit/test_run.py", "-x"],
            "-q -n 0 tests/unit/test_plan.py tests/unit/test_run.py -x",
        ),
        (["-m", "compile_matrix"], "-q -n 2 tests -m compile_matrix"),
    ],
)
def test_test_sh_runs_the_files_given_or_the_readme_suite(installed, args, pytest_args):
    out = run(installed, "test.sh", *args, PYTHON=sys.executable)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == f"PYTEST {pytest_args}", out.stdout
    assert ("README suite" in out.stdout) == (not args or args[0].startswith("-"))


def test_test_sh_workers_can_be_set(installed):
    out = run(installed, "test.sh", PYTHON=sys.executable, TEST_WORKERS="0")
    assert out.stdout.splitlines()[-1] == "PYTEST -q -n 0 tests"


def test_scripts_are_executable():
    for name in ("serve.sh", "test.sh"):
        assert os.access(ROOT / "scripts" / name, os.X_OK), name
