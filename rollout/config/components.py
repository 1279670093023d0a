"""What a component named by a config section declares for the one who builds it (``cluster.compose``), so that the
composer asks declared questions and never probes by name: how the component is built from its section
(``FromConfig``), what its section holds (``EndpointModelConfig``, ``RunsImages``, ``CapsOutput``, ``RunsContainers``,
``BindsPaths``, ``InstallsHarness``), and what its class offers before any instance exists (``ChecksRows``,
``PicksImages``). Each is asked with ``isinstance`` (of a section) or ``issubclass`` (of a class); a component that
matches none is built and run all the same."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Protocol, runtime_checkable

from pydantic import BaseModel

if TYPE_CHECKING:
    from rollout.records import Task


@runtime_checkable
class FromConfig(Protocol):
    """A component class built by ``from_config(config, **deps)``; any other is built by ``cls(config, **deps)``.
    ``deps`` are what the composer offers (``runtime=``, ``runtime_builder=``, ``env=``, ``tasks=``, the run and
    rollout ids): each class takes the ones it names."""

    @classmethod
    def from_config(cls, config: BaseModel | Mapping[str, Any], **deps: Any) -> Any: ...


@runtime_checkable
class EndpointModelConfig(Protocol):
    """A model section whose model is a client of an OpenAI-compatible endpoint (``openai``): a run's own model tier
    points it at the tier's URL and sets the fields the tier's kind decides (``ServeApp.model_overrides``)."""

    base_url: str
    """The API root the model sends its calls to."""
    release_sessions: bool
    """Tell the server when a rollout ends (a sticky router then frees the rollout's replica)."""
    api_key: str | None
    """The endpoint's bearer token (a model tier's face beyond loopback needs its key): the run's gateway sends it
    upstream too."""

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Any: ...


@runtime_checkable
class RunsImages(Protocol):
    """A runtime section whose runtimes run from an image (docker, podman, apptainer): ``image``, unless the
    environment picks one per task (``PicksImages``; the composer then passes ``image=``)."""

    image: str


@runtime_checkable
class CapsOutput(Protocol):
    """A runtime section whose runtimes keep at most ``max_output_bytes`` of a command's output (local, docker, podman,
    apptainer): past it the command is stopped and its result ``truncated``. Asked of a runtime's section
    (``rollout.protocols.HasConfig``) by an environment that says where an output was cut."""

    max_output_bytes: int


@runtime_checkable
class RunsContainers(Protocol):
    """A runtime section whose runtimes are containers of an engine's daemon (docker, podman): what a crashed run
    left there is reaped when the next run starts, and a rollout reserves on a node no more than its container's
    limits (``cluster.placement.slots.RESERVED_CPUS``)."""

    cpus: float
    """The container's CPU limit."""
    memory: str
    """The container's memory limit (``2g``)."""

    @property
    def container_engine(self) -> str:
        """The engine the containers run on (``docker``, ``podman``)."""
        ...


@runtime_checkable
class BindsPaths(Protocol):
    """A runtime section whose sandboxes see a host directory only where it is bound into them (docker, podman,
    apptainer): the composer binds the model gateway's socket directory there for an agent that needs one
    (``rollout.protocols.TakesGateway``). A runtime without it runs on the host and sees the directory as it is."""

    binds: list[str]
    """``source:target[:ro]``: host directories bound into each sandbox."""


@runtime_checkable
class InstallsHarness(Protocol):
    """A runtime section whose sandboxes get pip requirements (an outside agent's harness) installed into their image
    as a layer of its own (docker, podman). An environment that builds each task's image (SWE) builds it on the
    layer instead, so that every task's image shares one copy of the harness, and asks for none on top."""

    harness: list[str]


@runtime_checkable
class ChecksRows(Protocol):
    """An environment class with requirements on each dataset row, checked as the dataset loads (before any work)."""

    @staticmethod
    def check_row(task: Task) -> None:
        """Raise ``ValueError`` or ``TypeError`` naming the field the row lacks or gets wrong (the loader adds the
        line number)."""
        ...


@runtime_checkable
class PicksImages(Protocol):
    """An environment class that runs each task in an image of its own (SWE: the row's instance image), not in the
    runtime section's ``image``."""

    @staticmethod
    def image_for(task: Task) -> str:
        """The image ``task`` runs in."""
        ...


@runtime_checkable
class RunsOnHost(Protocol):
    """A runtime section whose commands run on this host without isolation (``local``): a model that is not scripted
    runs there only when the section allows it."""

    allow_host_exec: bool


@runtime_checkable
class BuildsImages(Protocol):
    """An environment section whose environment builds a task's image when it is missing (SWE: the instance image
    from its row), within a budget of disk."""

    build_images: bool

    @property
    def image_budget_bytes(self) -> int | None: ...


@runtime_checkable
class TimesGrading(Protocol):
    """A verifier section that bounds its grading (``eval_timeout`` seconds), which counts into an attempt's
    host-side deadline."""

    eval_timeout: float
