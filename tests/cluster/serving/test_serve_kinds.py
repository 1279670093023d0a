"""The model tier's kinds are strategies found from one table, and the assembly is the one place Ray is joined
and a model deployed: a new kind is one class plus one table line, and nothing else branches on ``serve.app``."""

from __future__ import annotations

import asyncio
import io
import re
from pathlib import Path

import pytest

from cluster.assembly import FarmAssembly
from cluster.serving.config import ServeSection
from cluster.serving.kinds import APPS, ENGINES, ServeApp, app_for, app_names

ROOT = Path(__file__).resolve().parents[3]


class EchoEndpointApp(ServeApp):
    """A kind a user adds: no deployment, a fixed URL, and a sampling field set in the client's config."""

    deploys = False

    def check(self, section):
        return None if section.base_url else "serve.base_url is required for app: echo"

    def url(self, section, base_url):
        return section.base_url.rstrip("/")

    def model_overrides(self, section, model_config):
        return {"cache_salt": True}


@pytest.fixture
def echo_kind():
    APPS.register("echo", f"{__name__}:EchoEndpointApp")
    try:
        yield
    finally:
        APPS.entries.pop("echo")


def test_every_kind_in_the_table_loads_as_a_strategy():
    assert app_names() == ["endpoint", "scripted", "vllm"]
    for name in APPS.names():
        assert issubclass(APPS.load(name), ServeApp), name
    assert set(ENGINES.values()) <= set(APPS.names())
    vllm = ServeSection(app="vllm", model_source="/m")
    assert type(app_for(vllm)).__name__ == "VllmApp"
    assert type(app_for(vllm.model_copy(update={"engine": "subprocess"}))).__name__ == "SubprocessVllmApp"


def test_an_unknown_kind_is_a_config_error_naming_the_choices():
    with pytest.raises(ValueError, match="unknown serve app 'echo'; choose one of endpoint, scripted, vllm"):
        ServeSection(app="echo")


def test_a_new_kind_is_one_class_plus_one_table_line(echo_kind):
    with pytest.raises(ValueError, match="serve.base_url is required for app: echo"):
        ServeSection(app="echo")  # the kind's own check runs when the section is validated
    section = ServeSection(app="echo", base_url="http://127.0.0.1:9/v1/")
    assembly = FarmAssembly(section, model={"model": "m"}, backend=None, out=io.StringIO())
    assert not assembly.needs_ray  # a kind that deploys nothing starts no cluster
    served = assembly.open_model()
    assert (served.base_url, served.model_id) == ("http://127.0.0.1:9/v1", "m")
    assert not assembly.session.owned

    from cluster.compose import Composer
    from cluster.config.run_config import RunConfig
    from rollout.config.load import validate

    config = validate(RunConfig, {"serve": {"app": "echo", "base_url": "http://127.0.0.1:9/v1"},
                                  "model": {"type": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"},
                                  "agent": {"type": "tool_calling"},
                                  "environment": {"type": "tool", "tools": "agents.demo.tools:demo_tools"},
                                  "dataset": {"path": "-"}, "farm": {"backend": "local"}})
    assert Composer(config).model_component.config.cache_salt is True  # the kind's model overrides apply
    asyncio.run(assembly.close())


def python_sources(*folders: str) -> list[Path]:
    return [p for folder in folders for p in sorted((ROOT / folder).rglob("*.py"))]


def test_only_the_table_branches_on_the_app_and_only_the_assembly_assembles():
    app_test = re.compile(r"\.app\s*(==|!=|in\b)")
    branching = [f"{p.relative_to(ROOT)}:{n}" for p in python_sources("cluster", "examples")
                 for n, line in enumerate(p.read_text().splitlines(), 1) if app_test.search(line)]
    assert branching == []
    callers = {str(p.relative_to(ROOT)) for p in python_sources("cluster", "examples")
               if re.search(r"(?<![\w.])connect\(", p.read_text())}
    assert callers == {"cluster/session/connect.py"}
    deployers = {str(p.relative_to(ROOT)) for p in python_sources("cluster", "examples")
                 if re.search(r"\bapps\.start\(", p.read_text())}
    assert deployers == {"cluster/assembly/farm_assembly.py"}
    starters = {str(p.relative_to(ROOT)) for p in python_sources("cluster", "examples")
                if re.search(r"\b(start_backend|start_model)\(", p.read_text())}
    assert starters and all(s.startswith("cluster/assembly/") for s in starters), starters
