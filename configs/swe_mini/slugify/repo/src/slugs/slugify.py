"""slugify: lower-case ASCII letters and digits joined by a separator."""

import re

_NOT_ALNUM = re.compile(r"[^a-z0-9]+")


def slugify(text, separator="-", max_length=None):
    """A slug for ``text``: runs of anything but ASCII letters and digits become one ``separator``.

    With ``max_length`` the slug is cut to at most that many characters, never ending in a separator.
    """
    slug = _NOT_ALNUM.sub(separator, text.lower()).strip(separator)
    if max_length is not None:
        slug = slug[:max_length].rstrip(separator)
    return slug


def unique_slug(text, taken, separator="-"):
    """``slugify(text)``, with ``-2``, ``-3``, ... appended until it is not in ``taken``."""
    base = slugify(text, separator) or "item"
    slug, n = base, 1
    while slug in taken:
        n += 1
        slug = f"{base}{separator}{n}"
    return slug
