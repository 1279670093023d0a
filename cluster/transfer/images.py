"""Images through the object store, for a cluster with no registry: the machine that has an image ``docker save``s
it once into pieces in the object store (``export_image``, run by the depot), and a node that lacks it streams the
pieces into its own daemon's ``docker load`` (``DepotImages``, an ``envs.images.sources.ImageSource``). The whole
image travels (a registry moves only the layers a node lacks), so a worker uses it for an image it cannot build:
the base image, or a prebuilt one; an instance image it builds from the base and the carried repository."""

from __future__ import annotations

from typing import Any, Iterator

import ray

from envs.images.daemon import ImageError

PIECE_BYTES = 64 << 20
"""The size of one object-store piece of a saved image: a node holds one piece at a time while loading."""


def export_image(tag: str) -> list[Any] | None:
    """``docker save`` of ``tag`` from this process's daemon as object references of ``PIECE_BYTES`` pieces; None
    when the daemon lacks the image or there is no daemon here."""
    import docker  # the docker extra

    try:
        client = docker.from_env(timeout=600)
        client.images.get(tag)
    except (docker.errors.DockerException, docker.errors.ImageNotFound):
        return None
    pieces, buffer = [], bytearray()
    for chunk in client.api.get_image(tag, chunk_size=4 << 20):
        buffer += chunk
        if len(buffer) >= PIECE_BYTES:
            pieces.append(ray.put(bytes(buffer)))
            buffer.clear()
    if buffer:
        pieces.append(ray.put(bytes(buffer)))
    return pieces


class DepotImages:
    """Load an image this node lacks from the run's depot."""

    layered = False
    name = "object store"

    def __init__(self, depot: Any, timeout: float = 1800.0):
        self.depot, self.timeout = depot, timeout

    def fetch(self, image: str, client: Any) -> int | None:
        try:
            pieces = ray.get(self.depot.image.remote(image), timeout=self.timeout)
        except Exception as exc:  # noqa: BLE001 - a depot that cannot answer: the attempt is retried
            raise ImageError(f"fetching {image} from the driver's machine failed: {exc}", retryable=True) from None
        if not pieces:
            return None
        moved = [0]

        def stream() -> Iterator[bytes]:
            for piece in pieces:
                data = ray.get(piece, timeout=self.timeout)
                moved[0] += len(data)
                yield data

        try:
            for line in client.api.load_image(stream()):
                if isinstance(line, dict) and line.get("error"):
                    raise RuntimeError(line["error"])
        except Exception as exc:  # noqa: BLE001 - the daemon or a transfer failed: retried, never a task outcome
            raise ImageError(f"loading {image} into this node's docker failed: {exc}", retryable=True) from None
        client.images.get(image)  # present now, or the SDK says why not
        return moved[0]
