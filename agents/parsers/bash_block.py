"""BashBlockParser: exactly one fenced ```bash block per reply, Mini-SWE style, as one shell command."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator

from agents.parsers.common import configure, content_text, fenced_blocks, strip_thinking
from rollout.config.load import StrictModel
from rollout.errors import FormatError
from rollout.records import Action, Message


class BashBlockConfig(StrictModel):
    type: str = "bash_block"
    """The short name this config was selected by (``parser.type`` in YAML)."""
    languages: list[str] = Field(default_factory=lambda: ["bash", "sh"], min_length=1)
    """Fence languages that count as a command block (case-insensitive); other fences are prose."""
    pattern: str | None = None
    """A regex (DOTALL) whose first group is the command; replaces the fence scan when set. It
    runs on the whole reply, so keep it free of nested quantifiers that could backtrack."""
    ignore_thinking: bool = True
    """Skip ``<think>...</think>`` spans: reasoning often quotes example commands."""

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a valid regex: {exc}") from None
        return value

    @field_validator("languages")
    @classmethod
    def _lower(cls, value: list[str]) -> list[str]:
        return [lang.strip().lower() for lang in value]


class BashBlockParser:
    """One ``Action(kind="bash", name="bash", arguments={"command": ...})`` per reply.

    Zero blocks, two or more, an unclosed block or an empty one raise ``FormatError`` whose
    text says a reply needs exactly one bash code block and shows the format.
    """

    def __init__(self, config: BashBlockConfig | None = None, **options: Any):
        self.config = configure(BashBlockConfig, config, options)
        self._pattern = re.compile(self.config.pattern, re.DOTALL) if self.config.pattern else None
        lang = self.config.languages[0]
        self.expected = (
            f"Reply with exactly one {lang} code block holding the command to run, like:\n\n```{lang}\n<command>\n```"
        )

    def parse(self, message: Message) -> list[Action]:
        text = content_text(message)
        if self.config.ignore_thinking:
            text = strip_thinking(text)
        commands, unclosed = self._commands(text)
        total = len(commands) + unclosed
        if total == 0:
            raise FormatError(f"No {self.config.languages[0]} code block found. {self.expected}")
        if total > 1:
            raise FormatError(
                f"Found {total} {self.config.languages[0]} code blocks; only one is run per reply"
                f" (join several commands with && inside one block). {self.expected}"
            )
        if unclosed:
            raise FormatError(f"The {self.config.languages[0]} code block is not closed with ```. {self.expected}")
        command = commands[0].strip()
        if not command:
            raise FormatError(f"The {self.config.languages[0]} code block is empty. {self.expected}")
        return [Action(kind="bash", name="bash", arguments={"command": command}, raw=command)]

    def _commands(self, text: str) -> tuple[list[str], int]:
        """Closed command blocks' bodies, and how many command blocks were left unclosed."""
        if self._pattern is not None:
            found = [m.group(1) if m.re.groups else m.group(0) for m in self._pattern.finditer(text)]
            return found, 0
        accepted = self.config.languages
        commands: list[str] = []
        unclosed = 0
        for block in fenced_blocks(text):
            if block.language in accepted:
                if block.closed:
                    commands.append(block.body)
                else:
                    unclosed += 1
        return commands, unclosed
