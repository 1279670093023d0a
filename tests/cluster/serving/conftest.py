"""The tiny CPU model served through ``ray.serve.llm``, one engine for the session's vLLM tests (its start is the
slow part): ``test_vllm_cpu.py``, ``test_vllm_generate.py``."""

from __future__ import annotations

import sys
import time

import pytest

ENGINE = {"max_model_len": 2048, "dtype": "float32", "enable_auto_tool_choice": True, "tool_call_parser": "hermes"}


@pytest.fixture(scope="session")
def tiny(vllm_available, tmp_path_factory):
    from cluster.serving.tiny_model import write_tiny_model

    root = tmp_path_factory.mktemp("tiny")
    return {"a": str(write_tiny_model(root / "a", seed=0)), "b": str(write_tiny_model(root / "b", seed=1))}


@pytest.fixture(scope="session")
def served(ray_cluster, tiny):
    from cluster.serving import apps
    from cluster.serving.config import ServeSection

    section = ServeSection(app="vllm", name="tiny-llm", model_source=tiny["a"], cpu=True, engine_kwargs=ENGINE,
                           ready_timeout=600)
    t0 = time.perf_counter()
    model = apps.start(section, "tiny", out=sys.stderr)
    print(f"ray.serve.llm: tiny model ready in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    yield model
    model.stop()
