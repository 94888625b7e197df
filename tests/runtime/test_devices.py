"""Device, dtype and compiler problems are one-line errors with exit code 2, found before any model loads."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from dynatree.runtime import devices
from dynatree.cli import app
from dynatree.errors import DynaTreeError


def run_cli(argv: list[str]):
    result = CliRunner().invoke(app, ["generate", *argv])
    assert "Traceback" not in result.output
    return result


def assert_one_line_error(result, message: str) -> None:
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert len([line for line in result.output.splitlines() if line.strip()]) == 1


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch built without CUDA (what this CPU CI has; forced so the test means the same on a GPU box)."""
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)


@pytest.fixture
def one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA build of torch that sees exactly one GPU."""
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def test_cuda_on_a_torch_without_cuda(no_cuda) -> None:
    assert_one_line_error(run_cli(["--device", "cuda"]), "was built without CUDA")


def test_cuda_build_without_a_visible_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert_one_line_error(run_cli(["--device", "cuda:0"]), "no CUDA GPU is visible")


def test_wrong_gpu_index(one_gpu) -> None:
    assert_one_line_error(run_cli(["--device", "cuda:3"]), "there is no GPU 3; 1 visible: cuda:0")


@pytest.mark.parametrize("device, message", [("gpu", "unknown device 'gpu'"), ("meta", "'meta' is not supported"),
                                             ("cpu:1", "the CPU has no index")])
def test_unknown_devices(device: str, message: str) -> None:
    assert_one_line_error(run_cli(["--device", device]), message)


def test_dtype_the_device_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # What an old CPU torch says for float16 matmul; torch 2.13 runs it, so the failure is injected.
    def fails(device: str, dtype: torch.dtype) -> None:
        raise RuntimeError('"addmm_impl_cpu_" not implemented for \'Half\'')

    monkeypatch.setattr(devices, "_probe_ops", fails)
    assert_one_line_error(run_cli(["--dtype", "float16"]),
                          "--dtype float16 does not run on cpu with torch")


def test_the_dtype_probe_runs_for_real() -> None:
    # On this CPU torch the decoder ops run in every dtype the CLI accepts: the probe must agree.
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert devices.check_device("cpu", dtype) == torch.device("cpu")


def test_compile_without_a_cpp_compiler() -> None:
    from torch._inductor import config

    # torch's own config.patch, never setattr on its config proxy: pytest >= 9.2 restores such an
    # attribute by deleting it, which broke every later compiling test.
    with config.patch({"cpp.cxx": ("/nonexistent/g++",)}):
        assert_one_line_error(run_cli(["--engine", "static", "--compile"]), "needs a working C++ compiler")


def test_compile_on_cuda_without_triton(one_gpu, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.utils._triton as triton_utils

    monkeypatch.setattr(devices, "_probe_ops", lambda device, dtype: None)  # no real GPU to run on
    monkeypatch.setattr(triton_utils, "has_triton_package", lambda: False)
    assert_one_line_error(run_cli(["--device", "cuda", "--compile"]), "needs Triton")


def test_library_loading_refuses_a_missing_gpu(no_cuda) -> None:
    from dynatree.loading import models

    with pytest.raises(DynaTreeError, match="built without CUDA"):
        models.load_model("smollm2-135m", device="cuda")


def test_static_engine_refuses_compile_without_compiler() -> None:
    from tiny import tiny_model
    from torch._inductor import config

    from dynatree.runtime.cache import StaticCachedModel

    with config.patch({"cpp.cxx": ("/nonexistent/g++",)}), pytest.raises(DynaTreeError, match="C\\+\\+ compiler"):
        StaticCachedModel(tiny_model("llama"), 96, 64, compile=True)


def test_compiler_setting_survives_the_tests_that_patch_it() -> None:
    # Runs after the two tests above (file order): the patched setting must be back, not deleted.
    from torch._inductor import config

    assert config.cpp.cxx != ("/nonexistent/g++",)  # AttributeError here if an undo deleted it
