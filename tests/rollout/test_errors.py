"""The failure taxonomy: every exception pickles, and each reason is on the right side."""

import pickle

import pytest

from rollout.errors import (
    ALL_ERROR_TYPES,
    INFRASTRUCTURE_REASONS,
    TASK_OUTCOMES,
    ConfigError,
    ExitReason,
    InfrastructureError,
    ModelError,
    Submitted,
    TaskOutcome,
)


@pytest.mark.parametrize("exc_type", ALL_ERROR_TYPES, ids=lambda t: t.__name__)
def test_every_exception_type_survives_pickle(exc_type):
    exc = exc_type("it broke")
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is exc_type
    assert str(back) == str(exc)
    assert back.exit_reason == exc.exit_reason
    assert isinstance(back, Exception)


def test_extra_fields_survive_pickle():
    sub = pickle.loads(pickle.dumps(Submitted("done", submission="diff --git a b")))
    assert sub.submission == "diff --git a b"
    model = pickle.loads(pickle.dumps(ModelError("gone", retryable=False)))
    assert model.retryable is False
    cfg = pickle.loads(pickle.dumps(ConfigError("unknown key", "agent.max_stepz")))
    assert str(cfg) == "agent.max_stepz: unknown key"


def test_outcomes_and_infrastructure_partition_exit_reasons():
    assert TASK_OUTCOMES | INFRASTRUCTURE_REASONS == set(ExitReason)
    assert not TASK_OUTCOMES & INFRASTRUCTURE_REASONS
    for exc_type in ALL_ERROR_TYPES:
        if issubclass(exc_type, TaskOutcome):
            assert not exc_type.exit_reason.is_infrastructure, exc_type
        if issubclass(exc_type, InfrastructureError):
            assert exc_type.exit_reason.is_infrastructure, exc_type
