"""The ``nemo_gym`` fixture: NeMo Gym 0.7.0 in a venv of its own (built once per machine, reused), to check our
wire shapes against its models. Without it (no network): skip, or fail when ROLLOUT_REQUIRE_NEMO_GYM=1."""

from __future__ import annotations

import os
from typing import Iterator

import pytest

from .nemo_gym_venv import NemoGymUnavailable, NemoGymVenv


@pytest.fixture(scope="session")
def nemo_gym() -> Iterator[NemoGymVenv]:
    """``validate(model, body)``, ``validate_many([(model, body), ...])`` and
    ``check_session_contract(app_factory, keeps_state, task_data=None)``, run in the NeMo Gym venv."""
    try:
        venv = NemoGymVenv().ensure()
    except (NemoGymUnavailable, OSError) as error:
        message = f"no NeMo Gym venv: {error}"
        if os.environ.get("ROLLOUT_REQUIRE_NEMO_GYM", "") not in ("", "0", "false", "no"):
            pytest.fail(message)
        pytest.skip(message + " (set ROLLOUT_REQUIRE_NEMO_GYM=1 to make this an error)")
    yield venv
    venv.close()


@pytest.fixture(scope="module")
def calc():
    """The calculator resources server on 127.0.0.1."""
    from envs.resources.calc_server import create_app
    from envs.resources.serving import serve_in_thread

    with serve_in_thread(create_app()) as server:
        yield server
