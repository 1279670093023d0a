"""A tiny course catalogue and the two lookups the demo's tools expose."""

from __future__ import annotations

COURSES: dict[str, list[str]] = {
    "Building Agents with Tools": [
        "What an agent loop is",
        "Describing tools with JSON schema",
        "Parsing tool calls",
        "Sandboxing shell commands",
        "Grading agents with verifiers",
    ],
    "Containers for Researchers": [
        "Images and layers",
        "Running a container",
        "Sandboxing shell commands",
        "Resource limits",
    ],
    "Reinforcement Learning from Rollouts": [
        "Policies and rewards",
        "Group sampling",
        "Grading agents with verifiers",
        "Token ids and logprobs",
    ],
}


def course_outline(course_title: str) -> str:
    for title, lessons in COURSES.items():
        if title.lower() == course_title.strip().lower():
            body = "\n".join(f"Lesson {i}: {name}" for i, name in enumerate(lessons, 1))
            return f"Course: {title}\n{body}"
    raise KeyError(f"no course titled {course_title!r}; courses: {', '.join(COURSES)}")


def search_content(query: str, exclude_course: str | None = None) -> str:
    q = query.strip().lower()
    hits = [
        f"Course: {title} | Lesson {i}: {name}"
        for title, lessons in COURSES.items()
        if title != exclude_course
        for i, name in enumerate(lessons, 1)
        if q and q in name.lower()
    ]
    return "\n".join(hits) if hits else f"No lesson matches {query!r}."
