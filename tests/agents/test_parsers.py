"""Action parsers: valid replies, malformed replies (fed back as FormatError), and garbage."""

from __future__ import annotations

import json
import random
import time

import pytest

from agents.parsers import (
    BashBlockParser,
    FunctionCallsParser,
    JSONActionParser,
    OpenAIToolsParser,
    ReActParser,
)
from agents.registry import PARSERS
from rollout.errors import ConfigError, FormatError
from rollout.protocols import ActionParser
from rollout.records import Action

TEXT_PARSERS = [JSONActionParser, ReActParser, FunctionCallsParser, BashBlockParser]
ALL_PARSERS = [OpenAIToolsParser, *TEXT_PARSERS]


def msg(content=None, tool_calls=None):
    out = {"role": "assistant", "content": content}
    if tool_calls is not None:
        out["tool_calls"] = tool_calls
    return out


def call(name, arguments, call_id="call_1"):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def format_error(parser, message) -> str:
    with pytest.raises(FormatError) as info:
        parser.parse(message)
    return str(info.value)


# One valid reply per parser, asking for calc(x=2).
VALID = {
    OpenAIToolsParser: msg(None, [call("calc", '{"x": 2}')]),
    JSONActionParser: msg('I will compute.\n```json\n{"tool": "calc", "parameters": {"x": 2}}\n```'),
    ReActParser: msg('Thought: need math\nAction: calc\nAction Input: {"x": 2}'),
    FunctionCallsParser: msg('<function_calls>\n{"tool_name": "calc", "parameters": {"x": 2}}\n</function_calls>'),
}


@pytest.mark.parametrize("name", ["openai_tools", "json", "react", "function_calls", "bash_block"])
def test_registry_names_resolve_to_parsers(name):
    parser = PARSERS.load(name)()
    assert isinstance(parser, ActionParser)


@pytest.mark.parametrize("cls", list(VALID), ids=lambda c: c.__name__)
def test_valid_reply_gives_the_tool_call(cls):
    [action] = cls().parse(VALID[cls])
    assert (action.kind, action.name, action.arguments) == ("tool", "calc", {"x": 2})


def test_bash_block_gives_the_command():
    text = "THOUGHT: look around first.\n\n```bash\nls -la /testbed && cat setup.py\n```\n"
    [action] = BashBlockParser().parse(msg(text))
    assert action == Action(
        kind="bash",
        name="bash",
        arguments={"command": "ls -la /testbed && cat setup.py"},
        raw="ls -la /testbed && cat setup.py",
    )


@pytest.mark.parametrize("cls", TEXT_PARSERS, ids=lambda c: c.__name__)
def test_text_parsers_read_content_parts(cls):
    good = VALID.get(cls, msg("```bash\necho hi\n```"))
    parts = [{"type": "text", "text": good["content"]}, {"type": "image_url", "image_url": {"url": "x"}}]
    assert cls().parse(msg(parts)) == cls().parse(good)


@pytest.mark.parametrize("cls", TEXT_PARSERS, ids=lambda c: c.__name__)
def test_text_parsers_ignore_tool_calls(cls):
    message = msg("no action in this text", [call("calc", '{"x": 2}')])
    with pytest.raises(FormatError):
        cls().parse(message)


def test_openai_parser_ignores_content():
    content = VALID[JSONActionParser]["content"] + "\n```bash\nls\n```"
    assert OpenAIToolsParser().parse(msg(content)) == []


# ---- OpenAI tool calls --------------------------------------------------------------------


def test_openai_several_calls_keep_ids_and_raw_arguments():
    calls = [call("a", '{"p": [1, 2]}', "id_a"), call("b", "", "id_b"), call("c", {"q": True}, "id_c")]
    actions = OpenAIToolsParser().parse(msg("thinking", calls))
    assert [(a.name, a.arguments, a.call_id) for a in actions] == [
        ("a", {"p": [1, 2]}, "id_a"),
        ("b", {}, "id_b"),
        ("c", {"q": True}, "id_c"),
    ]
    assert actions[0].raw == '{"p": [1, 2]}'


def test_openai_no_tool_calls_means_done():
    assert OpenAIToolsParser().parse(msg("All done, the answer is 4.")) == []
    assert OpenAIToolsParser().parse(msg("done", [])) == []


@pytest.mark.parametrize(
    "arguments, expect",
    [
        ('{"x": 2', "Expecting"),
        ("{x: 2}", "Expecting property name"),
        ("not json", "Expecting value"),
        ("[1, 2]", "must be a JSON object, got a list"),
        ('"text"', "got a string"),
        ("null", "got null"),
        ("[" * 100_000, "nested too deeply"),
    ],
)
def test_openai_bad_arguments_name_the_tool_and_the_error(arguments, expect):
    text = format_error(OpenAIToolsParser(), msg(None, [call("ok", "{}"), call("search", arguments)]))
    assert "'search'" in text and expect in text


@pytest.mark.parametrize(
    "calls", [[{"id": "1", "type": "function"}], [{"function": {"arguments": "{}"}}], ["junk"], "junk"]
)
def test_openai_malformed_calls_are_format_errors(calls):
    format_error(OpenAIToolsParser(), msg(None, calls))


def test_openai_max_calls():
    calls = [call("a", "{}", "1"), call("b", "{}", "2")]
    assert "at most 1" in format_error(OpenAIToolsParser(max_calls=1), msg(None, calls))


# ---- JSON actions -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"tool": "calc", "parameters": {"x": 2}}',
        'Let me think {about it}. {"tool": "calc", "parameters": {"x": 2}} and wait.',
        '```\n{"tool": "calc", "arguments": {"x": 2}}\n```',
        '{"tool": "calc", "parameters": "{\\"x\\": 2}"}',
        'A stray { brace, then {"tool": "calc", "parameters": {"x": 2}}',
    ],
)
def test_json_finds_the_action_in_prose_and_fences(text):
    [action] = JSONActionParser().parse(msg(text))
    assert (action.name, action.arguments) == ("calc", {"x": 2})


def test_json_list_and_several_objects_give_several_actions():
    listed = '[{"tool": "a", "parameters": {"s": "}{]["}}, {"tool": "b"}]'
    separate = '{"tool": "a", "parameters": {"s": "}{]["}}\nthen\n{"tool": "b", "parameters": {}}'
    for text in (listed, separate):
        actions = JSONActionParser().parse(msg(text))
        assert [(a.name, a.arguments) for a in actions] == [("a", {"s": "}{]["}), ("b", {})]


@pytest.mark.parametrize(
    "text, expect",
    [
        ('{"tool": "calc", "parameters": {"x": 2}', "JSON parse error: Expecting ',' delimiter"),
        ('{"tool": "calc", "parameters": {"x": 2,}}', "JSON parse error"),
        ("{'tool': 'calc'}", "JSON parse error"),
        ("Sure, I can help with that.", "No JSON action found"),
        ('{"action": "calc"}', 'no object with a "tool" key'),
        ('{"tool": "", "parameters": {}}', "non-empty string"),
        ('{"tool": "calc", "parameters": [1]}', "must be a JSON object, got a list"),
        ('[{"tool": "calc"}, 5]', "Item 2"),
    ],
)
def test_json_malformed_is_explained(text, expect):
    error = format_error(JSONActionParser(), msg(text))
    assert expect in error and '{"tool": "<tool name>"' in error


def test_json_broken_action_is_refused_even_beside_a_good_one():
    text = '{"tool": "a", "parameters": {}}\n{"tool": "b", "parameters": {"x": }'
    assert "JSON parse error" in format_error(JSONActionParser(), msg(text))


def test_json_allow_no_action():
    parser = JSONActionParser(allow_no_action=True)
    assert parser.parse(msg("The answer is 4 {as computed}.")) == []
    assert "JSON parse error" in format_error(parser, msg('{"tool": "calc", "parameters": {'))


def test_json_custom_keys():
    parser = JSONActionParser(tool_keys=["name"], parameters_keys=["args"])
    [action] = parser.parse(msg('{"name": "calc", "args": {"x": 2}}'))
    assert (action.name, action.arguments) == ("calc", {"x": 2})


# ---- ReAct --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, arguments",
    [
        ('Thought: t\nAction: search\nAction Input: {"query": "cats", "k": 3}', {"query": "cats", "k": 3}),
        ("Thought: t\nAction: search\nAction Input: cats and dogs", {"input": "cats and dogs"}),
        ('Thought: t\nAction: search\nAction Input: "cats \\"x\\""', {"input": 'cats "x"'}),
        ('Action: search\nAction Input:\n```json\n{\n  "query": "cats"\n}\n```', {"query": "cats"}),
        ('**Thought:** t\n**Action:** `search`\n**Action Input:** {"query": "cats"}', {"query": "cats"}),
        ("thought: t\naction: search", {}),
        ('Action: search\nAction Input: {"query": "x"}\nObservation: 3 hits\nAction: other', {"query": "x"}),
        ('Action: search\nAction Input: {"query": "x"} because it is good', {"query": "x"}),
    ],
)
def test_react_action_and_input(text, arguments):
    [action] = ReActParser().parse(msg(text))
    assert (action.kind, action.name, action.arguments) == ("tool", "search", arguments)


def test_react_final_answer_means_done():
    parser = ReActParser()
    message = msg("Thought: I know it now.\nFinal Answer: 42\nbecause 6*7")
    assert parser.parse(message) == []
    assert parser.final_answer(message) == "42\nbecause 6*7"
    assert parser.final_answer(msg('Action: calc\nAction Input: {"x": 1}')) is None


@pytest.mark.parametrize(
    "text, expect",
    [
        ("Thought: I should search.", "No 'Action:' line"),
        ('Thought: t\nAction Input: {"q": 1}', "no 'Action:' line"),
        ("Action:   \nAction Input: {}", "names no tool"),
        ('Action: search\nAction Input: {"query": ', "not valid JSON"),
        ("Action: search\nAction Input: [1, 2]", "must be a JSON object"),
    ],
)
def test_react_malformed_is_explained(text, expect):
    error = format_error(ReActParser(), msg(text))
    assert expect in error


def test_react_plain_input_can_be_refused():
    error = format_error(ReActParser(string_input_key=None), msg("Action: search\nAction Input: cats"))
    assert "must be a JSON object" in error and "Action Input:" in error


# ---- <function_calls> ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        '{"tool_name": "a", "parameters": {"x": 1}}\n{"name": "b", "arguments": {"y": "2"}}',
        '[{"tool_name": "a", "parameters": {"x": 1}}, {"name": "b", "arguments": "{\\"y\\": \\"2\\"}"}]',
        '```json\n[\n  {"tool_name": "a", "parameters": {"x": 1}},\n  {"name": "b", "arguments": {"y": "2"}}\n]\n```',
    ],
)
def test_function_calls_forms(body):
    actions = FunctionCallsParser().parse(msg(f"Calling now.\n<function_calls>\n{body}\n</function_calls>\nDone."))
    assert [(a.name, a.arguments) for a in actions] == [("a", {"x": 1}), ("b", {"y": "2"})]


def test_function_calls_several_blocks_in_order():
    text = (
        '<function_calls>{"name": "a"}</function_calls> and '
        '<function_calls>\n{\n  "name": "b",\n  "parameters": {"z": null}\n}\n</function_calls>'
    )
    actions = FunctionCallsParser().parse(msg(text))
    assert [(a.name, a.arguments) for a in actions] == [("a", {}), ("b", {"z": None})]


@pytest.mark.parametrize(
    "text, expect",
    [
        ('<function_calls>\n{"tool_name": "a", "parameters": {}}\n', "not closed"),
        ('<function_calls>\n{"tool_name": "a", "parameters": {}\n</function_calls>', "JSON parse error"),
        ('<function_calls>\n{"name": "a"}\n{"name": "b",\n</function_calls>', "line 2"),
        ('<function_calls>\n{"parameters": {}}\n</function_calls>', '"tool_name"'),
        ('<function_calls>\n{"name": "a", "parameters": 3}\n</function_calls>', "must be a JSON object"),
        ('<function_calls>\n{"name": "a", "arguments": "{bad"}\n</function_calls>', "Invalid JSON in arguments"),
        ("<function_calls>\n\n</function_calls>", "holds no calls"),
        ("I am finished.", "No <function_calls> block"),
    ],
)
def test_function_calls_malformed_is_explained(text, expect):
    error = format_error(FunctionCallsParser(), msg(text))
    assert expect in error


def test_function_calls_allow_no_action():
    assert FunctionCallsParser(allow_no_action=True).parse(msg("I am finished.")) == []


# ---- bash blocks --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "No code here.",
        "```python\nprint(1)\n```",
        "```bash\nls\n```\nand\n```sh\npwd\n```",
        "```bash\nls\n```\n```bash\npwd\n```\n```bash\nid\n```",
    ],
)
def test_bash_needs_exactly_one_block(text):
    error = format_error(BashBlockParser(), msg(text))
    assert "exactly one bash code block" in error and "```bash\n<command>\n```" in error


def test_bash_other_languages_are_prose():
    text = "Here is the fix:\n```python\nx = 1\n```\nNow run:\n```SH\npython -m pytest -q\n```"
    [action] = BashBlockParser().parse(msg(text))
    assert action.arguments == {"command": "python -m pytest -q"}


@pytest.mark.parametrize(
    "text, expect", [("```bash\nls -la", "not closed"), ("```bash\n\n```", "empty"), ("```bash\n  \n```", "empty")]
)
def test_bash_unclosed_or_empty(text, expect):
    assert expect in format_error(BashBlockParser(), msg(text))


def test_bash_reasoning_in_think_tags_is_skipped():
    text = "<think>maybe ```bash\nrm -rf /\n``` no</think>\n```bash\ngit status\n```"
    [action] = BashBlockParser().parse(msg(text))
    assert action.arguments["command"] == "git status"
    with pytest.raises(FormatError):
        BashBlockParser(ignore_thinking=False).parse(msg(text))


def test_bash_languages_and_pattern_options():
    assert BashBlockParser(languages=["shell"]).parse(msg("```shell\nls\n```"))[0].arguments == {"command": "ls"}
    assert "exactly one shell code block" in format_error(BashBlockParser(languages=["shell"]), msg("```bash\nls\n```"))
    parser = BashBlockParser(pattern=r"<cmd>(.*?)</cmd>")
    assert parser.parse(msg("run <cmd>make test</cmd>"))[0].arguments == {"command": "make test"}


# ---- config -------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", ALL_PARSERS, ids=lambda c: c.__name__)
def test_unknown_option_is_a_config_error_naming_it(cls):
    with pytest.raises(ConfigError) as info:
        cls(bogus_option=1)
    assert "parser.bogus_option" in str(info.value)


def test_bad_regex_is_a_config_error():
    with pytest.raises(ConfigError, match="parser.pattern"):
        BashBlockParser(pattern="(unclosed")


def test_config_object_and_options_combine():
    parser = BashBlockParser(BashBlockParser().config.model_copy(update={"languages": ["zsh"]}), ignore_thinking=False)
    assert (parser.config.languages, parser.config.ignore_thinking) == (["zsh"], False)


# ---- garbage ------------------------------------------------------------------------------


def _garbage() -> dict[str, str]:
    rng = random.Random(7)
    alphabet = "{}[]\"'\\`:\n <>/_abcxyzé€\ufffd\U0001f600\ud800\udfff\x00"
    soup = "".join(rng.choices(alphabet, k=1_000_000))
    return {
        "replacement_chars": "\ufffd\ufffd```bash\n\ufffdls\ufffd\n```",
        "lone_surrogates": '\ud800{"tool": "a\udc00"}\nAction: \udfff\n```bash\necho \ud83d\n```',
        "escaped_surrogates": '{"tool": "calc", "parameters": {"s": "\\ud800x"}}',
        "control_chars": "\x00\x1b[31m\x7f" * 10,
        "soup_1mb": soup,
        "braces_1mb": "{" * 1_000_000,
        "brackets_1mb": "[" * 1_000_000,
        "quotes_1mb": '{"' + '\\"' * 500_000,
        "fences_1mb": "```bash\n" * 125_000,
        "inline_fences_1mb": "```x```" * 150_000,
        "tags_1mb": "<function_calls>" * 62_500,
        "react_1mb": "Action Input: {\n" * 62_500,
        "spaces_1mb": " " * 1_000_000 + "x",
        "think_1mb": "<think>" * 140_000,
    }


GARBAGE = _garbage()


def _assert_survives(parser, message):
    started = time.perf_counter()
    try:
        actions = parser.parse(message)
    except FormatError as exc:
        str(exc).encode("utf-8")  # feedback must be writable
    else:
        assert all(isinstance(a, Action) for a in actions)
        for action in actions:
            action.model_dump_json()  # a trajectory holding it can be written as UTF-8
    elapsed = time.perf_counter() - started
    assert elapsed < 5, f"{type(parser).__name__} took {elapsed:.1f}s"


@pytest.mark.parametrize("name", list(GARBAGE))
@pytest.mark.parametrize("cls", TEXT_PARSERS, ids=lambda c: c.__name__)
def test_text_parsers_survive_garbage(cls, name):
    _assert_survives(cls(), msg(GARBAGE[name]))


@pytest.mark.parametrize("name", list(GARBAGE))
def test_openai_parser_survives_garbage_arguments(name):
    _assert_survives(OpenAIToolsParser(), msg(GARBAGE[name], [call("t", GARBAGE[name])]))


@pytest.mark.parametrize("cls", ALL_PARSERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("content", [None, "", 42, [None, {"type": "text"}, "x"], {"odd": 1}])
def test_odd_content_types(cls, content):
    _assert_survives(cls(), msg(content))


def test_surrogates_in_actions_become_replacement_chars():
    [bash] = BashBlockParser().parse(msg("```bash\necho \ud800\n```"))
    assert bash.arguments["command"] == "echo \ufffd"
    [tool] = JSONActionParser().parse(msg(GARBAGE["escaped_surrogates"]))
    assert tool.arguments == {"s": "\ufffdx"}
    nested = '{"tool": "t", "parameters": {"\\udc00k": ["\\ud800", {"x": "\\udfff", "n": 1}]}}'
    [deep] = JSONActionParser().parse(msg(nested))
    assert deep.arguments == {"\ufffdk": ["\ufffd", {"x": "\ufffd", "n": 1}]}
    [native] = OpenAIToolsParser().parse(msg(None, [call("t", json.dumps({"s": "\ud800"}))]))
    assert native.arguments == {"s": "\ufffd"}
