"""Files a task carries: a reference names content, not a path; only a fetcher the host installed turns it into a
file, and a plain path is left alone."""

from __future__ import annotations

import hashlib

import pytest

from rollout.data import carried


def test_a_reference_names_the_content_and_a_safe_name(tmp_path):
    digest = hashlib.sha256(b"bundle").hexdigest()
    ref = carried.carried_ref(digest, "my repo/../x.bundle")
    assert ref.startswith("carried:sha256:") and "/" not in ref.split("/", 1)[1]
    assert carried.parse_ref(ref) == (digest, ref.split("/", 1)[1])
    for not_a_ref in ("/data/repos/x.bundle", "carried:sha256:abc/x", f"carried:sha256:{digest}/../../etc", None, 3):
        assert carried.parse_ref(not_a_ref) is None


def test_local_path_uses_the_installed_fetcher_and_leaves_plain_paths_alone(tmp_path):
    digest = hashlib.sha256(b"bundle").hexdigest()
    ref = carried.carried_ref(digest, "x.bundle")
    try:
        carried.set_fetcher(None)
        assert carried.local_path("/plain/path") == "/plain/path"
        with pytest.raises(FileNotFoundError, match="no way to fetch it"):
            carried.local_path(ref)
        seen = []
        carried.set_fetcher(lambda d, name: seen.append((d, name)) or str(tmp_path / name))
        assert carried.local_path(ref) == str(tmp_path / "x.bundle")
        assert seen == [(digest, "x.bundle")]
    finally:
        carried.set_fetcher(None)
