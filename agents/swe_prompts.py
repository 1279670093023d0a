"""Default Jinja templates of the Mini-SWE bash agent, and strict rendering."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import jinja2

from rollout.errors import ConfigError

SYSTEM_TEMPLATE = """You are a careful software engineer working in a shell.
Every reply holds a short explanation and exactly ONE bash code block with ONE command:

```bash
your_command_here
```

Each command runs in a fresh shell (directory changes and variables do not persist; chain with &&).
You will see the command's output, then write the next command."""

INSTANCE_TEMPLATE = """{% if task.data.repo is defined %}The repository {{ task.data.repo }} is checked out at \
{{ cwd }}.
{% else %}Your working directory is {{ cwd }}.
{% endif %}
<task>
{{ problem }}
</task>

Work step by step: look around, make the change, check it. When you are done, submit by running
a command whose first output line is exactly {{ sentinel }}, followed by your result, e.g.

```bash
{{ submit_command }}
```

Submitting ends the episode; you cannot continue after it."""

OBSERVATION_TEMPLATE = """<returncode>{{ returncode }}</returncode>
{% if timed_out %}<warning>The command timed out after {{ timeout }} seconds and was killed.</warning>
{% endif %}{% if truncated %}<warning>The output was truncated at {{ output_limit }} and the command was \
stopped (killed) there; only its start and end are kept below. Send long output to a file and read parts of it \
with head, tail or grep.</warning>
{% endif %}{% if elided %}<output_head>
{{ head }}
</output_head>
<elided>{{ elided }} characters elided: the output was too long. Use head, tail, grep or sed -n to see parts of \
it.</elided>
<output_tail>
{{ tail }}
</output_tail>{% else %}<output>
{{ output }}
</output>{% endif %}"""

FORMAT_ERROR_TEMPLATE = """Your reply was not in the expected format: {{ error }}

Reply with a short explanation and exactly ONE bash code block:

```bash
your_command_here
```

To finish, run a command whose first output line is {{ sentinel }}."""

_env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=False, autoescape=False)


@lru_cache(maxsize=64)
def _compile(source: str) -> tuple[jinja2.Template, dict[str, Any]]:
    template = _env.from_string(source)
    return template, dict(template.globals)


def render(source: str, field: str, **variables: Any) -> str:
    """Render with strict undefined: a template naming a missing variable is a ConfigError.

    What ``Template.render`` does, with the template's globals merged once per template rather than per call
    (jinja flattens a ChainMap of them on every render, every turn of every rollout: an observation takes 7-10 µs
    instead of 16-23 µs, and jinja's context set-up was 14 % of a worker's samples in ``bench_farm`` (c)); an error
    renders again the usual way, for jinja's own error handling."""
    try:
        template, globals_ = _compile(source)
        try:
            context = template.new_context({**globals_, **variables}, shared=True)
            return _env.concat(template.root_render_func(context))  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - raised again, as jinja raises it, just below
            pass
        return template.render(**variables)
    except jinja2.UndefinedError as exc:
        raise ConfigError(f"template uses an undefined variable: {exc.message}", field) from None
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"template syntax error line {exc.lineno}: {exc.message}", field) from None


def elide(output: str, max_chars: int) -> dict[str, Any]:
    """Head and tail of a long output and how much was left out between them."""
    if len(output) <= max_chars:
        return {"output": output, "elided": 0, "head": "", "tail": ""}
    half = max_chars // 2
    return {"output": output, "elided": len(output) - 2 * half, "head": output[:half], "tail": output[-half:]}
