"""The ``calc`` fixture: the calculator resources server on 127.0.0.1, for a module's tests. (The ``nemo_gym``
fixture, NeMo Gym 0.7.0 in a venv of its own, is the session's: ``tests/conftest.py``.)"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def calc():
    """The calculator resources server on 127.0.0.1."""
    from envs.resources.calc_server import create_app
    from envs.resources.serving import serve_in_thread

    with serve_in_thread(create_app()) as server:
        yield server
