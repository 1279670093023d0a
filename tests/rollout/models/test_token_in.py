"""Token-in mode's parsing of raw completion text: hermes tool calls become tool_calls, anything else stays
text for the agent to judge."""

from __future__ import annotations

import json

from rollout.models.client.token_in import assistant_message


def test_hermes_blocks_become_tool_calls_and_leave_the_rest_as_content():
    text = 'Let me add.\n<tool_call>\n{"name": "calculate", "arguments": {"expression": "1+2"}}\n</tool_call>'
    message = assistant_message(text, with_tools=True)
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "calculate"
    assert json.loads(call["function"]["arguments"]) == {"expression": "1+2"}
    assert message["content"] == "Let me add."


def test_a_broken_block_stays_in_the_text_and_no_tools_means_no_parsing():
    broken = "<tool_call>{not json}</tool_call>"
    assert assistant_message(broken, with_tools=True) == {"role": "assistant", "content": broken}
    call = '<tool_call>{"name": "x", "arguments": {}}</tool_call>'
    assert assistant_message(call, with_tools=False) == {"role": "assistant", "content": call}


def test_several_calls_in_one_reply_keep_their_order():
    text = "".join(f'<tool_call>{{"name": "t{i}", "arguments": {{"i": {i}}}}}</tool_call>' for i in range(3))
    message = assistant_message(text, with_tools=True)
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["t0", "t1", "t2"]
    assert message["content"] is None
