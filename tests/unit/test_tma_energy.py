"""benchmarks/tma_energy.py's stream kernel compiles for sm_90a on the CPU, multicast included
(the GPU run is the only other check; a DSL change that breaks the cluster path fails here)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import tma_energy  # noqa: E402


def test_the_multicast_stream_compiles():
    assert tma_energy.compile_stream(cluster=2, stages=4) is not None
