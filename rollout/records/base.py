"""The base every record shares (strict pydantic: JSON and pickle) and the chat message type."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

Message = dict[str, Any]
"""One chat message: ``{"role": ..., "content": ..., "tool_calls"?: [...], "tool_call_id"?: ...}``."""


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", use_enum_values=False, ser_json_inf_nan="constants")
