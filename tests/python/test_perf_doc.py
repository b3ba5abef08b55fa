"""docs/performance.md is rendered from bench/data/*.json by bench/perf_doc.py: the document must
match its data (no torch needed; conftest.py collects this file without torch)."""

import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "bench", "perf_doc.py")


def test_performance_doc_matches_its_data():
    proc = subprocess.run([sys.executable, SCRIPT, "--check"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_check_fails_on_an_edited_figure(tmp_path):
    with open(os.path.join(ROOT, "docs", "performance.md")) as f:
        doc = f.read()
    start = doc.index("<!-- table:gemm_bf16 -->")
    row = doc.index("| dsv3_gate_up |", start)
    cell = doc.index(" (", row)  # the first TFLOP/s figure of the row
    edited = doc[:cell] + "9" + doc[cell:]
    stale = tmp_path / "performance.md"
    stale.write_text(edited)
    proc = subprocess.run([sys.executable, SCRIPT, "--check", "--doc", str(stale)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "is stale" in proc.stdout, proc.stdout + proc.stderr
