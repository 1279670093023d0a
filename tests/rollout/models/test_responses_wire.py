"""Responses API ↔ chat completions, both ways, as a NeMo-Gym agent server needs them."""

from __future__ import annotations

import pytest

from rollout.wire.responses import ResponsesFormatError, chat_request, response_object

TOOLS = [{"type": "function", "name": "get_weather", "description": "weather by city", "strict": True,
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]


def test_a_string_input_and_instructions_become_system_and_user_messages():
    body = chat_request({"model": "m", "instructions": "Be brief.", "input": "hi", "max_output_tokens": 64,
                         "temperature": 0.2, "top_p": 0.9})
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert body["max_tokens"] == 64 and "max_output_tokens" not in body
    assert body["temperature"] == 0.2 and body["top_p"] == 0.9 and body["model"] == "m"


def test_flat_tools_nest_and_calls_and_outputs_become_tool_calls_and_tool_messages():
    body = chat_request({"input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Oslo?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Bergen"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "rain"},
        {"type": "function_call_output", "call_id": "c2", "output": {"sky": "clear"}},
    ], "tools": TOOLS, "tool_choice": {"type": "function", "name": "get_weather"}})
    user, assistant, first, second = body["messages"]
    assert user == {"role": "user", "content": "Weather in Oslo?"}
    assert assistant["content"] == "Checking." and [c["id"] for c in assistant["tool_calls"]] == ["c1", "c2"]
    assert assistant["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert first == {"role": "tool", "tool_call_id": "c1", "content": "rain"}
    assert second["content"] == '{"sky": "clear"}'
    assert body["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "weather by city", "parameters": TOOLS[0]["parameters"]}}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}


def test_a_chat_completion_becomes_message_and_function_call_items_with_the_token_data():
    completion = {"model": "m", "prompt_token_ids": [1, 2, 3], "usage": {"prompt_tokens": 3, "completion_tokens": 2,
                                                                        "total_tokens": 5},
                  "choices": [{"finish_reason": "tool_calls", "token_ids": [7, 8],
                               "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -0.25}]},
                               "message": {"role": "assistant", "content": "Let me look.", "tool_calls": [
                                   {"id": "c9", "type": "function",
                                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}}]}
    reply = response_object(completion, {"model": "m", "tools": TOOLS, "temperature": 0.2})
    message, call = reply["output"]
    assert reply["object"] == "response" and reply["status"] == "completed" and reply["incomplete_details"] is None
    assert message["type"] == "message" and message["content"][0] == {"type": "output_text", "text": "Let me look.",
                                                                     "annotations": []}
    assert (call["type"], call["call_id"], call["name"]) == ("function_call", "c9", "get_weather")
    for item in reply["output"]:  # what NeMo RL reads, on every output item of the turn
        assert item["prompt_token_ids"] == [1, 2, 3] and item["generation_token_ids"] == [7, 8]
        assert item["generation_log_probs"] == [-0.5, -0.25]
    assert {k: reply["usage"][k] for k in ("input_tokens", "output_tokens", "total_tokens")} == {
        "input_tokens": 3, "output_tokens": 2, "total_tokens": 5}
    assert reply["tools"] == TOOLS and reply["temperature"] == 0.2


def test_a_truncated_completion_is_incomplete_for_max_output_tokens_and_carries_no_token_fields_unasked():
    completion = {"choices": [{"finish_reason": "length", "message": {"role": "assistant", "content": "partial"}}]}
    reply = response_object(completion, {"model": "m", "max_output_tokens": 4})
    assert reply["status"] == "incomplete" and reply["incomplete_details"] == {"reason": "max_output_tokens"}
    assert "generation_token_ids" not in reply["output"][0] and reply["max_output_tokens"] == 4


@pytest.mark.parametrize("params, says", [
    ({"input": 3}, "input"),
    ({"input": [{"type": "image_generation_call"}]}, "input[0].type"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0]"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
])
def test_a_request_outside_the_conversion_says_where(params, says):
    with pytest.raises(ResponsesFormatError, match=says.replace("[", r"\[").replace("]", r"\]")):
        chat_request(params)
