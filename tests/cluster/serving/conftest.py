"""What this folder's modules share, each started once a session and stopped after the last test that uses it
(``stop_after_last_user``: both hold the session cluster's CPUs, which a later engine, the RL example's, needs):

- ``served``: the tiny CPU model served through ``ray.serve.llm``, one engine for the vLLM tests (its start is the
  slow part): ``test_vllm_cpu.py``, ``test_vllm_generate.py``;
- ``scripted``: the scripted policy ``demo`` as a Serve application of two replicas, for ``test_serve_scripted.py``
  and ``test_serve_handle.py``."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

ENGINE = {"max_model_len": 2048, "dtype": "float32", "enable_auto_tool_choice": True, "tool_call_parser": "hermes"}
DEMO_DATA = str(Path(__file__).resolve().parents[3] / "configs" / "data" / "local_demo.jsonl")


@pytest.fixture(scope="session")
def tiny(vllm_available, tmp_path_factory):
    from cluster.serving.tiny_model import write_tiny_model

    root = tmp_path_factory.mktemp("tiny")
    return {"a": str(write_tiny_model(root / "a", seed=0)), "b": str(write_tiny_model(root / "b", seed=1))}


@pytest.fixture(scope="session")
def served(ray_cluster, tiny, request, stop_after_last_user):
    from cluster.serving import apps
    from cluster.serving.config import ServeSection

    section = ServeSection(app="vllm", name="tiny-llm", model_source=tiny["a"], cpu=True, engine_kwargs=ENGINE,
                           ready_timeout=600)
    t0 = time.perf_counter()
    model = apps.start(section, "tiny", out=sys.stderr)
    print(f"ray.serve.llm: tiny model ready in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    stop_after_last_user(request, model.stop)
    return model


@pytest.fixture(scope="session")
def scripted(ray_cluster, request, stop_after_last_user):
    """The scripted policy ``demo`` (model ``scripted-demo``) as the Serve application ``test-scripted``."""
    from cluster.serving import apps
    from cluster.serving.config import ServeSection

    section = ServeSection(app="scripted", name="test-scripted", route_prefix="/scripted", policy="demo", replicas=2)
    app = apps.start(section, "scripted-demo", dataset=DEMO_DATA, out=sys.stderr)
    stop_after_last_user(request, app.stop)
    return app
