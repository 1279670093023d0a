"""A run seen in a browser: the live page (``live_page``) and the end-of-run report (``report_html``,
``report_png``)."""
