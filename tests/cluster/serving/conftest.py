"""The tiny CPU model served through ``ray.serve.llm``, one engine for the session's vLLM tests (its start is the
slow part): ``test_vllm_cpu.py``, ``test_vllm_generate.py``. It is stopped after the last test that uses it, not at
the end of the session: its placement holds the session cluster's CPUs, which a later engine (the RL example's)
needs."""

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


LAST_USER = pytest.StashKey[bool]()
_engines: list = []


def pytest_collection_modifyitems(items):
    users = [item for item in items if "served" in getattr(item, "fixturenames", ())]
    if users:
        users[-1].stash[LAST_USER] = True


@pytest.fixture(autouse=True)
def _stop_the_engine_after_its_last_user(request):
    yield
    if request.node.stash.get(LAST_USER, False):
        while _engines:
            _engines.pop().stop()


@pytest.fixture(scope="session")
def served(ray_cluster, tiny):
    from cluster.serving import apps
    from cluster.serving.config import ServeSection

    section = ServeSection(app="vllm", name="tiny-llm", model_source=tiny["a"], cpu=True, engine_kwargs=ENGINE,
                           ready_timeout=600)
    t0 = time.perf_counter()
    model = apps.start(section, "tiny", out=sys.stderr)
    print(f"ray.serve.llm: tiny model ready in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    _engines.append(model)
    yield model
    while _engines:  # not stopped yet (the last user did not run)
        _engines.pop().stop()
