"""tools/kit_site.sh: the GPU tools put the gpu-kit's directory on PYTHONPATH only when this
user owns it and no one else can write it (else another user of the host could plant code
that every benchmark and server those tools start would run)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "kit_site.sh"


def _check(site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", f'source "{SCRIPT}"; kit_site_check && echo "OK $KIT_SITE"'],
        env={**os.environ, "KIT_SITE": str(site)},
        capture_output=True,
        text=True,
    )


def test_own_private_directory_is_taken(tmp_path):
    site = tmp_path / "site"
    site.mkdir(mode=0o755)
    result = _check(site)
    assert result.returncode == 0 and result.stdout.strip() == f"OK {site}"


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_directory_others_can_write_is_refused(tmp_path, mode):
    site = tmp_path / "site"
    site.mkdir()
    site.chmod(mode)
    result = _check(site)
    assert result.returncode == 1 and "writable by others" in result.stderr


def test_missing_directory_is_refused(tmp_path):
    result = _check(tmp_path / "absent")
    assert result.returncode == 1 and "does not exist" in result.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory away needs root")
def test_directory_of_another_user_is_refused(tmp_path):
    site = tmp_path / "site"
    site.mkdir(mode=0o755)
    os.chown(site, 65534, 65534)  # nobody
    result = _check(site)
    assert result.returncode == 1 and "not owned by" in result.stderr
