"""Datasets: JSONL and JSON lists, flat and Task-shaped rows, selection, and errors that name the line."""

import json
from pathlib import Path

import pytest

from rollout.data.dataset import dataset_hash, load_tasks, row_hash, select
from rollout.errors import ConfigError
from rollout.records import Task

SWE_ROW = {
    "instance_id": "astropy__astropy-12907",
    "repo": "astropy/astropy",
    "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
    "problem_statement": "Modeling's separability_matrix does not compute separability correctly",
    "FAIL_TO_PASS": '["test_separable[compound_model6]"]',
    "version": "4.3",
}


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_jsonl_flat_and_task_shaped_rows(tmp_path):
    path = write_jsonl(
        tmp_path / "tasks.jsonl",
        [
            SWE_ROW,
            "",
            {"task_id": "t2", "messages": [{"role": "user", "content": "hi"}], "data": {"answer": "4"},
             "metadata": {"k": 1}},
            {"id": 7, "question": "2+2?", "answer": "4"},
        ],
    )
    swe, shaped, qa = load_tasks(path)
    assert swe.task_id == "astropy__astropy-12907"
    assert swe.prompt == SWE_ROW["problem_statement"]
    assert swe.data == SWE_ROW  # every SWE field stays in data, the statement and the id included
    assert shaped.messages == [{"role": "user", "content": "hi"}]
    assert shaped.data == {"answer": "4"} and shaped.metadata == {"k": 1}
    assert qa.task_id == "7" and qa.prompt == "2+2?" and qa.data == {"id": 7, "question": "2+2?", "answer": "4"}


def test_id_and_prompt_keys_are_taken_in_order(tmp_path):
    row = {"task_id": "a", "instance_id": "b", "id": "c", "prompt": "p", "problem_statement": "ps", "extra": 1}
    (task,) = load_tasks(write_jsonl(tmp_path / "t.jsonl", [row]))
    assert task.task_id == "a" and task.prompt == "p"
    assert task.data == {"instance_id": "b", "id": "c", "problem_statement": "ps", "extra": 1}


def test_json_list_file(tmp_path):
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps([SWE_ROW, {"task_id": "t2", "prompt": "go"}], indent=2))
    tasks = load_tasks(path)
    assert [t.task_id for t in tasks] == ["astropy__astropy-12907", "t2"]


@pytest.mark.parametrize(
    "bad, problem",
    [
        ('{"task_id": "x", "prompt": ', "invalid JSON"),
        ('["not", "an", "object"]', "must be a JSON object"),
        ('{"prompt": "no id here"}', "no task id"),
        ('{"task_id": "t1", "prompt": "dup"}', "duplicate task id 't1' (first on line 1)"),
        ('{"id": "z", "problem_statement": 42}', "'problem_statement' must be a string"),
        ('{"task_id": "z", "messages": "hi"}', "'messages'"),
        ('{"instance_id": ["x"], "problem_statement": "s"}', "task id must be a non-empty string"),
    ],
)
def test_bad_rows_name_file_line_and_problem(tmp_path, bad, problem):
    path = write_jsonl(tmp_path / "tasks.jsonl", [{"task_id": "t1", "prompt": "ok"}, "", bad])
    with pytest.raises(ConfigError) as info:
        load_tasks(path)
    text = str(info.value)
    assert str(path) in text and "line 3:" in text and problem in text


def test_json_list_errors_name_the_line_of_the_item(tmp_path):
    path = tmp_path / "tasks.json"
    path.write_text('[\n  {"task_id": "a", "prompt": "x"},\n  {"prompt": "missing id"}\n]\n')
    with pytest.raises(ConfigError, match="line 3: no task id"):
        load_tasks(path)
    path.write_text('{"task_id": "a"}')
    with pytest.raises(ConfigError, match="must hold a list"):
        load_tasks(path)
    path.write_text('[\n {"task_id": "a"},\n {"task_id": \n')
    with pytest.raises(ConfigError, match="invalid JSON"):
        load_tasks(path)


def test_missing_and_empty_files_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read dataset"):
        load_tasks(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(ConfigError, match="no tasks"):
        load_tasks(tmp_path / "empty.jsonl")


def test_select_by_ids_pattern_and_slice(tmp_path):
    tasks = load_tasks(write_jsonl(tmp_path / "t.jsonl", [{"task_id": f"repo__{i}", "prompt": "p"} for i in range(10)]))
    assert [t.task_id for t in select(tasks, ids=["repo__3", "repo__1"])] == ["repo__1", "repo__3"]
    assert [t.task_id for t in select(tasks, pattern=r"__[2-4]$")] == ["repo__2", "repo__3", "repo__4"]
    assert [t.task_id for t in select(tasks, slice_="0:2")] == ["repo__0", "repo__1"]
    assert [t.task_id for t in select(tasks, slice_="::4")] == ["repo__0", "repo__4", "repo__8"]
    assert [t.task_id for t in select(tasks, pattern="[13579]$", slice_="1:")] == [
        "repo__3", "repo__5", "repo__7", "repo__9"]
    assert select(tasks) == tasks


@pytest.mark.parametrize(
    "kwargs, field",
    [({"ids": ["repo__99"]}, "dataset.ids"), ({"pattern": "("}, "dataset.pattern"), ({"slice_": "5"}, "dataset.slice"),
     ({"slice_": "a:b"}, "dataset.slice")],
)
def test_select_rejects_unknown_ids_and_bad_filters(kwargs, field):
    from rollout.records import Task

    with pytest.raises(ConfigError) as info:
        select([Task(task_id="repo__1")], **kwargs)
    assert info.value.field == field


def test_dataset_hash_follows_the_bytes(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"task_id": "a"}])
    first = dataset_hash(path)
    assert len(first) == 16 and first == dataset_hash(path)
    write_jsonl(path, [{"task_id": "b"}])
    assert dataset_hash(path) != first


def test_hugging_face_dataset_without_the_hub_is_a_clear_error(monkeypatch):
    from rollout.data.dataset import load_tasks as load

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(ConfigError) as err:
        load("hf://princeton-nlp/SWE-bench_Lite:test")
    text = str(err.value)
    assert text.startswith("hf://princeton-nlp/SWE-bench_Lite:test:")
    # without the package: how to install it; with it, offline: no copy in the local cache (at once, no retries)
    assert "pip install datasets" in text or ("offline" in text and "local cache" in text)


# ---- rows are input nobody vetted: ids become directories, paths reach the host --------------------


@pytest.mark.parametrize("bad_id", ["../../victim", "a/b", "..", ".", "-rf", "x y", "tab\there", "nul\x00",
                                    "back\\slash", "x" * 201, ""])
@pytest.mark.parametrize("key", ["instance_id", "task_id"])
def test_unsafe_task_ids_are_refused_naming_line_and_field(tmp_path, bad_id, key):
    path = write_jsonl(tmp_path / "tasks.jsonl", [{key: "fine-1", "prompt": "p"}, {key: bad_id, "prompt": "p"}])
    with pytest.raises(ConfigError) as caught:
        load_tasks(path)
    assert f"line 2: field '{key}'" in str(caught.value) and str(path) in str(caught.value)


def test_the_ids_real_datasets_use_are_safe(tmp_path):
    ids = ["astropy__astropy-12907", "oauthlib__oauthlib.1fd52536.combine_file__09vlzwgc", "12", "_private",
           "org__repo-123:v1.2", "task#3", "a+b=c@d,e~f"]
    path = write_jsonl(tmp_path / "tasks.jsonl", [{"id": i, "question": "q"} for i in ids])
    assert [t.task_id for t in load_tasks(path)] == ids


def test_an_instance_id_in_data_is_checked_too(tmp_path):
    row = {"task_id": "fine", "instance_id": "../escape", "prompt": "p"}
    with pytest.raises(ConfigError, match="line 1: field 'data.instance_id'"):
        load_tasks(write_jsonl(tmp_path / "tasks.jsonl", [row]))


@pytest.mark.parametrize("repo_path, why", [("/etc", "is absolute"), ("../outside", "leads out"),
                                            ("repos/../../outside", "leads out"), ("~/x", "is absolute")])
def test_repo_path_outside_the_datasets_directory_needs_the_flag(tmp_path, repo_path, why):
    (tmp_path / "data").mkdir()
    path = write_jsonl(tmp_path / "data" / "tasks.jsonl", [{"instance_id": "a__b-1", "repo_path": repo_path}])
    with pytest.raises(ConfigError, match=f"line 1: field 'repo_path': .*{why}.*dataset.allow_outside_paths"):
        load_tasks(path)
    (task,) = load_tasks(path, allow_outside_paths=True)
    assert Path(task.data["repo_path"]).is_absolute()


def test_repo_path_inside_resolves_against_the_dataset(tmp_path):
    path = write_jsonl(tmp_path / "tasks.jsonl", [{"instance_id": "a__b-1", "repo_path": "repos/a.bundle"}])
    (task,) = load_tasks(path)
    assert task.data["repo_path"] == str(tmp_path.resolve() / "repos" / "a.bundle")


def test_row_hashes_follow_the_row_not_where_the_dataset_lies(tmp_path):
    row = {"instance_id": "a__b-1", "repo_path": "repos/a.bundle", "base_commit": "abc"}
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    (a,) = load_tasks(write_jsonl(tmp_path / "one" / "t.jsonl", [row]))
    (b,) = load_tasks(write_jsonl(tmp_path / "two" / "t.jsonl", [row]))
    (c,) = load_tasks(write_jsonl(tmp_path / "t.jsonl", [{**row, "base_commit": "abd"}]))
    assert row_hash(a) == row_hash(b) != row_hash(c)
    assert len(row_hash(Task(task_id="x"))) == 16  # a task built in code hashes too
