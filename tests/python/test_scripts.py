"""Smoke tests of the package's bench scripts (--cpu --quick: the code paths the GPU runs, on the
CPU reference in seconds) and of examples/train_tiny_moe.py (the loss goes down)."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def run_bench(script, tmp_path, *extra):
    out = tmp_path / "out.json"
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", script), "--cpu",
                           "--quick", "--json", str(out), *extra],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| " in proc.stdout  # the markdown table
    return json.loads(out.read_text())


def test_torch_moe_step(tmp_path):
    data = run_bench("torch_moe_step.py", tmp_path, "--fused-gate-up")
    assert [c["case"] for c in data["cases"]] == ["qwen3", "dsv3", "mixtral"]
    for c in data["cases"]:
        assert c["groupmm_us"] > 0 and c["torch_us"] > 0, c
        # the fused gate_up block: the same weights, the same output bits
        assert c["groupmm_fused_us"] > 0 and c["fused_same_y"], c
        assert c["rel_err"] < 0.05, c  # both blocks compute the same function
        # the torch.compile peer ran, and computes what the eager block does
        assert c["torch_compiled_us"] > 0 and c["torch_compiled_rel_err"] < 1e-3, c


def test_torch_moe_ep_step(tmp_path):
    # One rank made by the script itself (gloo): the EP module in both modes and the reference.
    data = run_bench("torch_moe_ep_step.py", tmp_path)
    assert data["ranks"] == 1 and [c["case"] for c in data["cases"]] == ["qwen3", "dsv3", "mixtral"]
    for c in data["cases"]:
        assert "error" not in c, c
        for k in ("one_gpu_us", "capacity_us", "throughput_us"):
            assert c[k] > 0, c
        assert "capacity_overflow" not in c, c  # factor 2 at one rank holds every entry


def test_peers_hf(tmp_path):
    """The transformers benchmark's tiny run: every backend of two families (gpt-oss: biases,
    transposed weights, its clamped SwiGLU) runs; groupmm agrees with eager; the free-experts bound
    is timed; the JSON holds every record."""
    pytest.importorskip("transformers")
    out = tmp_path / "hf.json"
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "peers_hf.py"), "--tiny",
                           "--device", "cpu", "--families", "qwen3_moe,gpt_oss", "--fp32-ref", "--json",
                           str(out)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = json.loads(out.read_text())["records"]
    got = {(r["family"], r["backend"]): r for r in records}
    for family in ("qwen3_moe", "gpt_oss"):
        for backend in ("eager", "grouped_mm", "groupmm", "groupmm_fp8_block", "free_experts"):
            r = got[(family, backend)]
            assert "error" not in r and r["train_ms"] > 0, r
            assert set(r["decode_ms"]) == {"1", "2"}, r
        for backend in ("groupmm", "groupmm_fp8_block"):
            r = got[(family, backend)]
            assert r["logits_calc_diff"] < 1e-2 and r["grads_calc_diff"] < 1e-2, r
            assert r["logits_calc_diff_fp32"] < 1e-2 and r["grads_calc_diff_fp32"] < 1e-2, r
    assert "bound (experts free) / grouped_mm" in proc.stdout


def test_peers_grouped_mm_smoke():
    """Without CUDA the drop-in benchmark runs every form once on the CPU against a matmul loop."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "peers_grouped_mm.py")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("cpu smoke") == 9


def test_peers_w4_smoke(tmp_path):
    """Without CUDA the MXFP4 peer benchmark multiplies checkpoint-layout weights through
    grouped_mm_w4 on the CPU against their dequantized product, says the peer is unavailable (and
    why), and still exits 0 and writes its rows."""
    out = tmp_path / "w4.json"
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "peers_w4.py"), "--json",
                           str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("cpu smoke") == 6
    assert "peer triton_kernels: unavailable (" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert {r["matrix"] for r in rows} == {"gate_up", "down"}
    assert all(r["ok"] and r["groupmm_ref_diff"] < 1e-2 for r in rows), rows


def test_peers_serving_w4_smoke(tmp_path):
    """Without CUDA the gpt-oss serving-layer benchmark runs groupmm's MXFP4 MoE layer (router,
    clamped interleaved SwiGLU, biases, weighted combine), as groupmm.nn.MoE.from_gpt_oss builds it
    and as the chain of ops, on the CPU against a float64 layer on the dequantized weights, with
    the clamp engaged, says the peer is unavailable (and why), and still exits 0 and writes its
    rows."""
    out = tmp_path / "serving_w4.json"
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "peers_serving_w4.py"),
                           "--json", str(out), "--kernels"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("cpu smoke") == 6
    # --kernels: the CPU layer's operators, both forms, the ops chain's GEMMs among them
    assert proc.stdout.count("operators a layer, groupmm ") == 2
    assert "groupmm::grouped_mm_w4" in proc.stdout
    assert "peer triton_kernels: unavailable (" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [(r["tokens"], r["groupmm_layer"]) for r in rows] == [
        (t, form) for t in (1, 3, 8) for form in ("module", "ops")]
    assert all(r["ok"] and r["groupmm_ref_diff"] < 3e-2 and r["clamped"] > 0 for r in rows), rows


def test_peers_deepgemm_smoke(tmp_path):
    """Without CUDA the DeepGEMM peer benchmark multiplies fp8_block operands through
    grouped_mm_fp8 on the CPU against their dequantized product, builds DeepGEMM's contiguous and
    masked layouts from the same bytes and checks them by their meaning, checks the counts of its
    GPU cases, says the peer is unavailable (and why), and still exits 0 and writes its rows."""
    out = tmp_path / "deepgemm.json"
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "peers_deepgemm.py"),
                           "--json", str(out)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("cpu smoke") == 12
    assert "counts of the GPU cases: ok" in proc.stdout
    assert "peer DeepGEMM: unavailable (" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert {(r["layout"], r["matrix"]) for r in rows} == {
        (layout, matrix) for layout in ("contiguous", "masked") for matrix in ("gate_up", "down")}
    for r in rows:
        assert r["ok"] and r["groupmm_ref_diff"] < 1e-3 and r["calc_diff"] < 1e-3, r
        assert r["layout_ref_diff"] < 1e-12, r  # the layouts hold exactly groupmm's bytes


def test_torch_overhead(tmp_path):
    data = run_bench("torch_overhead.py", tmp_path)
    names = [o["op"] for o in data["ops"]]
    assert names == ["grouped_mm", "grouped_mm_dgrad", "grouped_mm_wgrad", "group_quantize",
                     "router", "permute", "unpermute"]
    assert all(o["torch_us"] > 0 and o["core_us"] > 0 for o in data["ops"])


@pytest.mark.parametrize("recipe", ["bf16", "fp8_current"])
def test_torch_layer_step(tmp_path, recipe):
    data = run_bench("torch_layer_step.py", tmp_path, "--recipe", recipe)
    assert [c["case"] for c in data["cases"]] == ["qwen3_gate_up", "qwen3_down"]
    assert all(c["package_us"] > 0 and c["core_us"] > 0 for c in data["cases"])


def test_train_tiny_moe_loss_goes_down():
    spec = importlib.util.spec_from_file_location(
        "train_tiny_moe", os.path.join(ROOT, "examples", "train_tiny_moe.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    losses = example.main(["--steps", "10", "--tokens", "64", "--device", "cpu"])
    assert len(losses) == 2 and losses[-1] < 0.7 * losses[0], losses


GPU_STAGES = ["build", "test", "sanitize", "cli", "bench-gemm", "bench-quantize", "bench-layer",
              "bench-moe", "bench-ep", "bench-w4", "peers", "python", "ncu", "tune", "ab",
              "demo"]


def test_gpu_script_lists_its_stages():
    """scripts/gpu.sh (the GPU machine's one script): --list names every stage."""
    proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu.sh"), "--list"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    listed = [line.split()[0] for line in proc.stdout.splitlines()[1:] if line.startswith("  ")]
    assert listed == GPU_STAGES, listed


def test_gpu_script_refuses_an_unknown_stage_before_any_work(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu.sh"), "build", "bench-gem"],
                          capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, OUT=str(out)))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "unknown stage 'bench-gem'" in proc.stderr
    assert not out.exists()  # nothing ran: no build, no logs


def _built_core_tree():
    """A build tree of the core with a built library (build/ after scripts/test.sh, build-cpu/
    after scripts/run.sh without a GPU), or None."""
    for name in ("build", "build-cpu"):
        tree = os.path.join(ROOT, name)
        if all(os.path.exists(os.path.join(tree, f)) for f in ("groupmmConfig.cmake", "libgroupmm.a")):
            return tree
    return None


def _configure_extension(tmp_path, build_dir):
    """Configures python/CMakeLists.txt (what `pip install --no-build-isolation .` runs) into
    tmp_path with GROUPMM_BUILD_DIR=build_dir; builds nothing."""
    if shutil.which("cmake") is None or shutil.which("ninja") is None:
        pytest.skip("needs cmake and ninja (scripts/setup.sh)")
    env = dict(os.environ, GROUPMM_BUILD_DIR=build_dir)
    return subprocess.run(["cmake", "-S", os.path.join(ROOT, "python"), "-B", str(tmp_path / "b"),
                           "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                           f"-DPython3_EXECUTABLE={sys.executable}"],
                          capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.skipif(_built_core_tree() is None, reason="no built core (build/ or build-cpu/)")
def test_pip_build_links_the_built_core(tmp_path):
    """The wheel build links an already built core library (brought up to date first) instead of
    compiling the core, CUDA kernels included, a second time."""
    tree = _built_core_tree()
    proc = _configure_extension(tmp_path, os.path.relpath(tree, ROOT))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"groupmm_torch: linking the core of {tree}" in proc.stdout, proc.stdout
    ninja = (tmp_path / "b" / "build.ninja").read_text()
    assert "groupmm_core_update" in ninja
    assert "groupmm_lib.dir" not in ninja  # no core object is compiled here


def test_pip_build_refuses_an_unconfigured_build_dir(tmp_path):
    proc = _configure_extension(tmp_path, str(tmp_path / "nothing"))
    assert proc.returncode != 0
    assert "is not a configured build tree of groupmm" in proc.stdout + proc.stderr


@pytest.mark.parametrize("script", ["install_python.sh", "python_env.sh", "build_python.sh",
                                    "test_python.sh"])
def test_install_scripts_parse(script):
    proc = subprocess.run(["bash", "-n", os.path.join(ROOT, "scripts", script)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
