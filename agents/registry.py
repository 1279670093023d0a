"""Short names of the agents, the action parsers and the demo's scripted policy."""

from __future__ import annotations

from rollout.registry import Registry

AGENTS = Registry("agent", {
    "tool_calling": "agents.tool_agent:ToolCallingAgent",
    "text_action": "agents.text_agent:TextActionAgent",
    "mini_swe": "agents.swe_agent:MiniSweAgent",
    "external": "agents.external_agent:ExternalAgent",
    "aviary": "agents.step_agent:AviaryStepAgent",
    "oracle": "agents.reference_agents:OracleAgent",
    "nop": "agents.reference_agents:NopAgent",
})
PARSERS = Registry("parser", {
    "openai_tools": "agents.parsers.openai_tools:OpenAIToolsParser",
    "json": "agents.parsers.json_action:JSONActionParser",
    "react": "agents.parsers.react:ReActParser",
    "function_calls": "agents.parsers.function_calls:FunctionCallsParser",
    "bash_block": "agents.parsers.bash_block:BashBlockParser",
})
POLICIES = Registry("policy", {"demo": "agents.demo.policy:demo_policy"})
