"""Config: files merged in order, key.path=value overrides, unknown keys and wrong types named."""

import pytest

from rollout.config import StrictModel, load_config, validate
from rollout.errors import ConfigError
from agents.registry import AGENTS
from rollout.registry import Registry
from rollout.termination import Limits


class Agent(StrictModel):
    type: str = "tool_calling"
    max_steps: int = 10
    limits: Limits = Limits()


class Root(StrictModel):
    agent: Agent = Agent()
    name: str = "x"


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_files_merge_in_order_and_overrides_win(tmp_path):
    a = write(tmp_path, "a.yaml", "agent:\n  max_steps: 3\n  type: text\nname: first\n")
    b = write(tmp_path, "b.yaml", "agent:\n  max_steps: 5\n")
    data = load_config([a, b], ["agent.limits.time_limit=2.5", "name=from-cli"])
    root = validate(Root, data)
    assert root.agent.max_steps == 5  # later file wins
    assert root.agent.type == "text"  # earlier keys survive a partial override
    assert root.agent.limits.time_limit == 2.5  # override values are parsed as YAML
    assert root.name == "from-cli"


def test_unknown_key_names_the_field(tmp_path):
    with pytest.raises(ConfigError) as err:
        validate(Root, load_config([write(tmp_path, "c.yaml", "agent:\n  max_stepz: 3\n")]))
    assert str(err.value).startswith("agent.max_stepz: unknown key")


def test_wrong_type_names_the_field_and_value():
    with pytest.raises(ConfigError) as err:
        validate(Root, {"agent": {"limits": {"max_consecutive_format_errors": "many"}}})
    assert "agent.limits.max_consecutive_format_errors" in str(err.value)
    assert "'many'" in str(err.value)


def test_bad_yaml_and_bad_override_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config([write(tmp_path, "bad.yaml", "agent: [unclosed\n")])
    with pytest.raises(ConfigError, match="key.path=value"):
        load_config([], ["no-equals-sign"])
    with pytest.raises(ConfigError, match="not a mapping"):
        load_config([], ["name=x", "name.sub=1"])


def test_registry_short_names_and_dotted_paths():
    assert AGENTS.load("tool_calling").__name__ == "ToolCallingAgent"
    assert AGENTS.load("agents.swe_agent:MiniSweAgent").__name__ == "MiniSweAgent"
    assert Registry("thing", {}).load("json.dumps").__name__ == "dumps"
    with pytest.raises(ConfigError) as err:
        AGENTS.load("no_such_agent", field="agent.type")
    assert "agent.type" in str(err.value) and "tool_calling" in str(err.value)
    with pytest.raises(ConfigError, match="cannot import"):
        AGENTS.load("nowhere.module:Thing", field="agent.type")


def test_colon_numbers_stay_strings_not_sexagesimal(tmp_path):
    # YAML 1.1 would read 3:5 as 185; a dataset slice must stay "3:5"
    data = load_config([write(tmp_path, "s.yaml", "slice: 3:5\nn: 1e3\n")], ["other=10:20"])
    assert data == {"slice": "3:5", "n": 1000.0, "other": "10:20"}
