"""How to open the Ray dashboard: its URL and, under Ray's token authentication, where the sign-in token is.

Ray (2.5x+) starts local clusters with token authentication on: the dashboard opens on an "Authentication Token
Required" dialog, and Ray's own line ("View the dashboard at ...") does not say where the token is. Printed once per
process, when a run starts or joins a cluster with the dashboard on."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TextIO

from cluster.session.ray_private import token_auth_on

_printed = False


def token_source() -> str | None:
    """Where this process's Ray token comes from, in words; None when token authentication is off."""
    mode = os.environ.get("RAY_AUTH_MODE", "").lower()
    if mode == "disabled":
        return None
    if mode != "token":
        if not token_auth_on():
            return None
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "the RAY_AUTH_TOKEN environment variable of this process"
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    return f"the file {path}"


def hint(url: str) -> str:
    """The line to print for a dashboard at ``url``."""
    source = token_source()
    if source is None:
        return f"ray dashboard: {url} (no sign-in: token authentication is off)"
    return (f"ray dashboard: {url} — it asks for Ray's authentication token: paste the token in {source} "
            "(or the output of `ray get-auth-token`)")


def print_once(url: str | None, out: TextIO) -> None:
    """Print the hint for ``url`` the first time this process is asked to (no URL: nothing)."""
    global _printed
    if _printed or not url:
        return
    _printed = True
    print(hint(url if "://" in url else f"http://{url}"), file=out, flush=True)
