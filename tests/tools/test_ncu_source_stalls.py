"""tools/ncu_source_stalls.py on a small source-page CSV of the shape ncu writes (CPU)."""

import importlib.util
import lzma
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "ncu_source_stalls", ROOT / "tools" / "ncu_source_stalls.py"
)
stalls = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = stalls  # its dataclasses look their module up there
_spec.loader.exec_module(stalls)

HEADER = (
    '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
    '"stall_wait","stall_mio","stall_long_sb","stall_wait (Not Issued)"'
)


def _csv() -> str:
    rows = [
        '"Kernel Name","ours"',
        HEADER,
        '"0x10","MUFU.EX2 R1, R2","60","1,000","40","20","0","99"',
        '"0x20","MUFU.EX2 R3, R4","20","1,000","20","0","0","0"',
        '"0x30","@!P0  BRA 0x40","20","500","0","0","20","0"',
        '"Kernel Name","FA3c"',
        HEADER,
        '"0x10","FMNMX R1, R2, R3, !PT","10","2,000","10","0","0","0"',
    ]
    return "\n".join(rows) + "\n"


def test_stalls_by_opcode_sums_each_opcodes_samples_and_reasons():
    ours, fa3c = stalls.read_kernels(_csv())
    text = stalls.stalls_by_opcode(ours, top=5)
    lines = text.splitlines()
    assert lines[0] == "== ours  samples 100"  # "(Not Issued)" columns are not counted
    assert lines[1].split()[:2] == ["MUFU", "80.0%"]
    assert "wait=60.0" in lines[1] and "mio=20.0" in lines[1]
    assert lines[2].split()[:2] == ["BRA", "20.0%"] and "long_sb=20.0" in lines[2]
    assert stalls.stalls_by_opcode(fa3c, top=5).splitlines()[1].split()[:2] == ["FMNMX", "100.0%"]


def test_main_reads_xz_and_takes_one_mode(tmp_path, capsys):
    path = tmp_path / "src.csv.xz"
    with lzma.open(path, "wt") as f:
        f.write(_csv())
    assert stalls.main([str(path), "--stalls-by-opcode"]) == 0
    assert "MUFU" in capsys.readouterr().out
    assert stalls.main([str(path), "--by-opcode"]) == 0
    assert "warp instructions executed 0.00 M" in capsys.readouterr().out
    try:
        stalls.main([str(path), "--by-opcode", "--stalls-by-opcode"])
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("both modes at once must be refused")
