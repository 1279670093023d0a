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


def test_a_generate_reply_sampled_across_two_weight_versions_is_as_old_as_its_oldest_tokens():
    """A turn whose tokens two versions sampled (an engine that kept a request across a reload) carries the older:
    a token sampled under version k is never trained as k+1, and the staleness bound holds for its oldest token."""
    from rollout.wire.generate import parse_generate

    def reply(spans):
        return {"choices": [{"token_ids": [5, 6, 7, 8], "finish_reason": "stop", "weight_versions": spans,
                             "logprobs": {"content": [{"logprob": -0.5}] * 4}}]}

    spans = [{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 2, "end": 4}]
    assert parse_generate(reply(spans)).weight_version == "3"
    assert parse_generate(reply(spans[::-1])).weight_version == "3"  # in whatever order the spans come
    assert parse_generate(reply([{"version": "4", "start": 0, "end": 4}])).weight_version == "4"
    assert parse_generate(reply([{"version": "default", "start": 0, "end": 4}])).weight_version is None
