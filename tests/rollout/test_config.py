"""Config: files merged in order, key.path=value overrides, unknown keys and wrong types named."""

import pytest

from agents.registry import AGENTS
from rollout.config.load import StrictModel, load_config, validate
from rollout.config.retype import apply_retypes
from rollout.errors import ConfigError
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


class Many(StrictModel):
    """Sections reached through a list, a mapping, a union and a prefix."""

    agents: list[Agent] = []
    profiles: dict[str, Root] = {}
    maybe: Agent | None = None


@pytest.mark.parametrize("data, prefix, line", [
    ({"agents": [{}, {"max_step": 1}]}, "", "agents.1.max_step: unknown key (did you mean agents.1.max_steps?)"),
    ({"profiles": {"big": {"agnet": {}}}}, "", "profiles.big.agnet: unknown key (did you mean profiles.big.agent?)"),
    ({"maybe": {"limits": {"max_steps": 1, "tme_limit": 2}}}, "run",
     "run.maybe.limits.tme_limit: unknown key (did you mean run.maybe.limits.time_limit?)"),
    ({"mabye": {}}, "", "mabye: unknown key (did you mean maybe?)"),
    ({"agents": [{"colour": "red"}]}, "", "agents.0.colour: unknown key"),  # nothing close: no guess
])
def test_an_unknown_key_suggests_the_closest_by_its_full_path(data, prefix, line):
    with pytest.raises(ConfigError) as err:
        validate(Many, data, prefix)
    assert str(err.value) == line


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


def test_every_problem_is_listed_one_line_each():
    with pytest.raises(ConfigError) as err:
        validate(Root, {"agent": {"max_steps": "ten", "max_stepz": 3}, "name": 5, "extra": 1})
    assert str(err.value).splitlines() == [
        "agent.max_steps: Input should be a valid integer, unable to parse string as an integer (got 'ten')",
        "agent.max_stepz: unknown key (did you mean agent.max_steps?)",
        "name: Input should be a valid string (got 5)",
        "extra: unknown key",
    ]
    assert err.value.field == "agent.max_steps"  # the first problem's field, as before


AUTO = "runtime:\n  type: auto\n  docker: {memory: 1g}\n  local: {timeout: 120}\n" \
       "agent:\n  type: a\n  only_a: 1\n  shared: 2\n"
KEYS = {"local": {"type", "timeout"}, "docker": {"type", "memory", "timeout"}, "b": {"type", "shared"}}


def section_keys(path, type_name):
    return KEYS.get(type_name)


def test_an_override_that_changes_a_type_drops_what_the_new_type_does_not_take(tmp_path):
    data = load_config([write(tmp_path, "c.yaml", AUTO)], ["runtime.type=local", "agent.type=b"])
    notes = apply_retypes(data, section_keys)
    assert data["runtime"] == {"type": "local", "timeout": 120}  # auto's local sub-section becomes the section
    assert data["agent"] == {"type": "b", "shared": 2}
    assert notes == [
        "runtime.type=local replaces auto: dropped runtime.docker, runtime.local (not options of local); "
        "carried over runtime.local's timeout",
        "agent.type=b replaces a: dropped agent.only_a (not an option of b)"]
    assert apply_retypes(data, section_keys) == []  # applied once


def test_keys_set_on_the_command_line_are_never_dropped(tmp_path):
    overrides = ["runtime.type=local", "runtime.timeout=5", "runtime.docker.memory=2g", "agent.type=b",
                 "agent.only_a=7"]
    data = load_config([write(tmp_path, "c.yaml", AUTO)], overrides)
    notes = apply_retypes(data, section_keys)
    assert data["runtime"] == {"type": "local", "docker": {"memory": "2g"}, "timeout": 5}  # docker: still an error
    assert data["agent"] == {"type": "b", "only_a": 7, "shared": 2}
    assert notes == ["runtime.type=local replaces auto: dropped runtime.local (not an option of local); "
                     "carried over runtime.local's timeout"]


def test_a_section_given_whole_or_kept_on_its_type_is_left_alone(tmp_path):
    path = write(tmp_path, "c.yaml", AUTO)
    for overrides in (["runtime={type: local, docker: 1}"], ["runtime.type=auto"], ["agent.type=unknown_type"]):
        data = load_config([path], overrides)
        before = {k: dict(v) for k, v in data.items()}
        assert apply_retypes(data, section_keys) == []
        assert data == before


def test_a_section_whose_type_changed_again_before_validation_is_left_alone(tmp_path):
    data = load_config([write(tmp_path, "c.yaml", AUTO)], ["agent.type=b"])
    data["agent"] = {"type": "local", "only_a": 1}  # as `runtime: auto` becomes the runtime it picks
    assert apply_retypes(data, section_keys) == [] and data["agent"] == {"type": "local", "only_a": 1}
