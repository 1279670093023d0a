"""``app: endpoint``: no deployment; the run talks to an OpenAI-compatible server it does not own
(``serve.base_url``, else the ``model`` section's ``base_url``)."""

from __future__ import annotations

from cluster.serving.config import ServeSection
from cluster.serving.kinds.base import ServeApp


class EndpointApp(ServeApp):
    deploys = False

    def url(self, section: ServeSection, base_url: str | None) -> str:
        url = section.base_url or base_url
        if not url:
            raise ValueError("serve.base_url (or model.base_url) is required for app: endpoint")
        return url.rstrip("/")
