"""The local model server's entry point turns llama.cpp's extra CPU buffer types (AMX, repacking) off: with them,
llama.cpp built with -march=native dies with SIGILL on a VM that advertises AMX without enabling it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

low_level = pytest.importorskip("llama_cpp.llama_cpp")

from rollout_pipeline.local.llama_server import disable_extra_buffer_types  # noqa: E402


@pytest.fixture
def restore_defaults() -> Iterator[None]:
    original = low_level.llama_model_default_params
    yield
    low_level.llama_model_default_params = original


@pytest.mark.usefixtures("restore_defaults")
def test_models_load_without_extra_buffer_types() -> None:
    before = low_level.llama_model_default_params()
    assert before.use_extra_bufts is True  # llama.cpp's default
    disable_extra_buffer_types()
    params = low_level.llama_model_default_params()
    assert params.use_extra_bufts is False
    assert (params.n_gpu_layers, params.check_tensors) == (before.n_gpu_layers, before.check_tensors)  # kept
