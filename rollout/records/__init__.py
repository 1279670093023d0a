"""The records a rollout reads and writes, by one name each: import them from here (``rollout.records``).

Pydantic models (JSON and pickle); messages stay plain dicts in the OpenAI chat format."""

from rollout.errors import ExitReason
from rollout.records.base import Message, Record
from rollout.records.result import AttemptRecord, ErrorInfo, Reward, RolloutOutputs, RolloutResult, Status
from rollout.records.task import GymContext, RequestMeta, Task
from rollout.records.trajectory import Action, EpisodeSummary, Observation, Step, Trajectory, Usage

__all__ = ["Action", "AttemptRecord", "EpisodeSummary", "ErrorInfo", "ExitReason", "GymContext", "Message",
           "Observation", "Record", "RequestMeta", "Reward", "RolloutOutputs", "RolloutResult", "Status", "Step",
           "Task", "Trajectory", "Usage"]
