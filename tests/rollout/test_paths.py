"""Paths built from data stay under their root; names from the user's config name one directory level."""

import os

import pytest

from rollout.data.paths import PathOutsideRoot, id_problem, name_problem, under


def test_under_accepts_paths_inside_and_refuses_climbs_and_symlinks_out(tmp_path):
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    assert under(root, root / "a" / "b") == (root / "a" / "b").resolve()
    for outside in (root / ".." / "x", root / "a" / ".." / ".." / "x", "/etc"):
        with pytest.raises(PathOutsideRoot, match="refusing"):
            under(root, outside)
    os.symlink(tmp_path, root / "link")
    with pytest.raises(PathOutsideRoot):
        under(root, root / "link" / "x")
    with pytest.raises(PathOutsideRoot):
        under(root, root)  # deleting the root itself is not "inside"
    assert under(root, root, strict=False) == root.resolve()


def test_ids_and_names():
    assert id_problem("django__django-11099") is None and id_problem("../x") is not None
    assert name_problem("my run 1") is None  # the user's own run id may hold a space
    for bad in ("", ".", "..", "a/b", "a\\b", "a\nb"):
        assert name_problem(bad) is not None
