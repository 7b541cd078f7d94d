"""APPS loading: real rows, the test cap, filters, every skip reason, local files, the hub path, eval IDs."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from apps_bench.config.schema import DatasetConfig, typed
from apps_bench.data import (
    DEMO_PROBLEMS,
    SKIP_REASONS,
    RowError,
    eval_ids,
    eval_manifest,
    hub_data_files,
    load_problems,
    parse_row,
)

CONF = Path(__file__).resolve().parents[2] / "conf"


def dataset(name="apps", **over) -> DatasetConfig:
    """conf/dataset/<name>.yaml with `over` on top, typed (every key comes from the YAML)."""
    return typed(DatasetConfig, OmegaConf.merge(OmegaConf.load(CONF / "dataset" / f"{name}.yaml"), over))


def local(path, split="test"):
    return dataset(source="file", path=str(path), split=split)


def good_row(pid=1, **over):
    row = {
        "problem_id": pid,
        "question": "Print the sum.",
        "solutions": json.dumps(["print(sum(map(int, input().split())))"]),
        "input_output": json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}),
        "difficulty": "introductory",
        "url": "https://example.org/p",
        "starter_code": "",
    }
    row.update(over)
    return row


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


# ------------------------------------------------------------------ real rows


def test_train_mini150_all_tests(apps_data_dir):
    res = load_problems(local(apps_data_dir / "train_mini150.jsonl", "train"), max_tests_per_row=0)
    assert len(res.problems) == 150 and res.skipped == {}
    assert sum(len(p.tests) for p in res.problems) == 959
    call = [p for p in res.problems if p.tests.mode == "call"]
    assert len(call) == 12 and all(p.starter_code.strip() for p in call)
    assert all(p.split == "train" and p.solutions for p in res.problems)
    assert {p.difficulty for p in res.problems} == {"introductory", "interview", "competition"}
    p = next(p for p in call if p.id == "2404")
    assert p.tests.fn_name == "findKthPositive" and p.tests.inputs[0] == [[2, 3, 4, 7, 11], 5] and p.tests.outputs[0] == 9


def test_cap_keeps_first_tests_and_records_available(apps_data_dir):
    path = apps_data_dir / "test_0-49_partial.jsonl"
    full = {p.id: p for p in load_problems(local(path), max_tests_per_row=0).problems}
    capped = {p.id: p for p in load_problems(local(path)).problems}  # default 20
    assert set(full) == {"8", "9", "28"}
    assert len(full["8"].tests) == 213 and full["8"].tests.n_available == 213
    assert len(capped["8"].tests) == 20 and capped["8"].tests.n_available == 213
    assert capped["8"].tests.inputs == full["8"].tests.inputs[:20]
    assert capped["8"].tests.outputs == full["8"].tests.outputs[:20]
    assert len(load_problems(local(path), max_tests_per_row=-1).problems[0].tests) == 213
    assert len(load_problems(local(path), max_tests_per_row=3).problems[0].tests) == 3


def test_filters_on_real_rows(apps_data_dir):
    path = apps_data_dir / "test_more.jsonl"
    all_ids = [p.id for p in load_problems(local(path)).problems]
    assert len(all_ids) == 52 and all_ids[:3] == ["203", "747", "771"]
    assert [p.id for p in load_problems(local(path), limit=5).problems] == all_ids[:5]
    assert [p.id for p in load_problems(local(path), offset=2, limit=3).problems] == all_ids[2:5]
    comp = load_problems(local(path), difficulty="competition").problems
    assert len(comp) == 4 and all(p.difficulty == "competition" for p in comp)
    res = load_problems(local(path), only=["4655", "747", "999999"])
    assert [p.id for p in res.problems] == ["747", "4655"]  # file order
    assert res.missing_ids == ("999999",)
    assert load_problems(local(path), only=[4655]).problems[0].solutions  # ints accepted, 23 solutions
    assert load_problems(local(path), limit=0).problems == []


# ------------------------------------------------------------------ skip reasons

MALFORMED = {
    "missing_id": good_row(problem_id=None),
    "empty_question": good_row(question="   "),
    "missing_input_output": good_row(input_output=""),
    "unparsable_input_output": good_row(input_output='{"inputs": ["1"], "outputs": '),
    "malformed_input_output": good_row(input_output=json.dumps({"inputs": "1 2", "outputs": "3"})),
    "empty_tests": good_row(input_output=json.dumps({"inputs": [], "outputs": []})),
    "unequal_lengths": good_row(input_output=json.dumps({"inputs": ["1", "2"], "outputs": ["1"]})),
}


@pytest.mark.parametrize("reason", sorted(MALFORMED))
def test_each_skip_reason(reason):
    with pytest.raises(RowError) as e:
        parse_row(MALFORMED[reason])
    assert e.value.reason == reason and reason in SKIP_REASONS


def test_skips_are_counted_by_reason(tmp_path):
    rows = [good_row(100)] + [
        dict(r, problem_id=(None if k == "missing_id" else i)) for i, (k, r) in enumerate(sorted(MALFORMED.items()))
    ]
    rows += ["{not json", good_row(101, input_output=json.dumps({"outputs": ["1"]}))]
    res = load_problems(local(write_jsonl(tmp_path / "rows.jsonl", rows)))
    assert [p.id for p in res.problems] == ["100"]
    expected = {k: 1 for k in MALFORMED}
    expected["unparsable_row"] = 1
    expected["malformed_input_output"] = 2  # outputs but no inputs
    assert res.skipped == expected and res.n_skipped == 9 and res.rows_selected == 10


def test_limit_counts_rows_so_limit_50_is_the_first_50_ids(tmp_path):
    rows = [good_row(i) for i in range(60)]
    rows[3] = good_row(3, input_output="")
    res = load_problems(local(write_jsonl(tmp_path / "r.jsonl", rows)), limit=50)
    assert res.rows_selected == 50 and res.skipped == {"missing_input_output": 1}
    assert [p.id for p in res.problems] == [str(i) for i in range(50) if i != 3]


def test_huge_integers_in_input_output(tmp_path):
    big = "9" * 5000
    row = good_row(7, input_output='{"inputs": [[' + big + ']], "outputs": [' + big + '], "fn_name": "f"}')
    sys.set_int_max_str_digits(4300)
    try:
        (p,) = load_problems(local(write_jsonl(tmp_path / "big.jsonl", [row]))).problems
    finally:
        sys.set_int_max_str_digits(0)
    assert p.tests.outputs[0] == int(big) and p.tests.inputs[0] == [int(big)]


def test_stdin_list_inputs_and_outputs_joined_with_newlines():
    p = parse_row(good_row(input_output=json.dumps({"inputs": [["1 2", "3"]], "outputs": [["3", "3"]]})))
    assert p.tests.inputs == ("1 2\n3",) and p.tests.outputs == ("3\n3",) and p.tests.mode == "stdin"


def test_call_based_row_keeps_argument_lists():
    p = parse_row(good_row(input_output=json.dumps({"fn_name": "f", "inputs": [[1, [2]], 5], "outputs": [[3], 4]})))
    assert p.tests.mode == "call" and p.tests.inputs == ([1, [2]], [5]) and p.tests.outputs == ([3], 4)


def test_solutions_parsing_never_skips():
    assert parse_row(good_row(solutions="")).solutions == ()
    assert parse_row(good_row(solutions="not json")).solutions == ()
    assert parse_row(good_row()).solutions == ("print(sum(map(int, input().split())))",)


# ------------------------------------------------------------------ local files and errors


def test_parquet_equals_jsonl(apps_data_dir, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = apps_data_dir / "test_more.jsonl"
    rows = [json.loads(line) for line in src.read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "test.parquet")
    a = load_problems(local(src), limit=10).problems
    b = load_problems(local(tmp_path / "test.parquet"), limit=10).problems
    assert a == b and len(a) == 10


def test_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_problems(local(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match="unknown format"):
        load_problems(local(write_jsonl(tmp_path / "x.csv", [good_row()])))
    with pytest.raises(ValueError, match="codeparrot/apps schema"):
        load_problems(local(write_jsonl(tmp_path / "other.jsonl", [{"id": 1, "prompt": "x"}])))
    with pytest.raises(ValueError, match="introductory, interview, competition"):
        load_problems(dataset("demo"), difficulty="hard")
    with pytest.raises(ValueError, match="dataset.path"):
        load_problems(dataset(source="file", path=None))
    with pytest.raises(ValueError, match="pin a hub revision"):
        load_problems(dataset(revision=""))


# ------------------------------------------------------------------ hub path (datasets builders on a hub-like layout)


def test_hub_urls_for_the_real_repo():
    assert hub_data_files("codeparrot/apps", "abc123", "test") == ("json", "hf://datasets/codeparrot/apps@abc123/test.jsonl")
    assert hub_data_files("codeparrot/apps", "refs/convert/parquet", "train") == (
        "parquet",
        "hf://datasets/codeparrot/apps@refs/convert/parquet/all/train/*.parquet",
    )


@pytest.fixture
def hub_mirror(apps_data_dir, tmp_path, monkeypatch):
    """A directory laid out like the codeparrot/apps hub repo: test.jsonl, train.jsonl, and all/<split>/*.parquet."""
    import datasets.config
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")  # keep the arrow cache in tmp
    repo = tmp_path / "codeparrot-apps"
    repo.mkdir()
    test_rows = (apps_data_dir / "test_0-49_partial.jsonl").read_text() + (apps_data_dir / "test_more.jsonl").read_text()
    (repo / "test.jsonl").write_text(test_rows)
    (repo / "train.jsonl").write_text((apps_data_dir / "train_mini150.jsonl").read_text())
    rows = [json.loads(line) for line in test_rows.splitlines()]
    (repo / "all" / "test").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows[:30]), repo / "all" / "test" / "0000.parquet")
    pq.write_table(pa.Table.from_pylist(rows[30:]), repo / "all" / "test" / "0001.parquet")
    return repo


def hub_cfg(repo, **over):
    return dataset(hub_repo=str(repo), **over)


def test_hub_json_builder_streaming_first_rows(hub_mirror, apps_data_dir):
    res = load_problems(hub_cfg(hub_mirror), limit=4, max_tests_per_row=5)
    assert [p.id for p in res.problems] == ["8", "9", "28", "203"]
    assert res.source.endswith("test.jsonl") and res.revision == "21e74ddf8de1a21436da12e3e653065c5213e9d1"
    assert len(res.problems[0].tests) == 5 and res.problems[0].tests.n_available == 213
    direct = load_problems(local(apps_data_dir / "test_0-49_partial.jsonl"), max_tests_per_row=5).problems
    assert res.problems[:3] == direct


def test_hub_json_builder_full_split_and_train(hub_mirror):
    res = load_problems(hub_cfg(hub_mirror, streaming=False))
    assert len(res.problems) == 55 and res.skipped == {}
    train = load_problems(hub_cfg(hub_mirror, split="train"), difficulty="competition", limit=3)
    assert len(train.problems) == 3 and all(p.split == "train" and p.difficulty == "competition" for p in train.problems)


def test_hub_parquet_conversion_layout(hub_mirror):
    res = load_problems(hub_cfg(hub_mirror, revision="refs/convert/parquet"), only=["4655", "9"])
    assert res.source.endswith("*.parquet") and [p.id for p in res.problems] == ["9", "4655"]


def test_dataset_path_overrides_hub(apps_data_dir):
    cfg = hub_cfg("codeparrot/apps", path=str(apps_data_dir / "test_more.jsonl"))  # no network needed
    res = load_problems(cfg, limit=2)
    assert res.revision == "local" and [p.id for p in res.problems] == ["203", "747"]


# ------------------------------------------------------------------ configs, demos, eval IDs


@pytest.mark.parametrize("name", ["apps", "apps_train", "demo"])
def test_dataset_configs_match_schema(name):
    cfg = OmegaConf.merge(OmegaConf.structured(DatasetConfig), OmegaConf.load(CONF / "dataset" / f"{name}.yaml"))
    assert cfg.name == name
    if name != "demo":
        assert cfg.hub_repo == "codeparrot/apps" and re.fullmatch(r"[0-9a-f]{40}", cfg.revision)


def test_a_dataset_setting_the_yaml_leaves_out_is_refused_naming_it():
    """No code default fills a dataset key: every conf/dataset/*.yaml sets them all."""
    from omegaconf.errors import MissingMandatoryValue

    data = OmegaConf.to_container(OmegaConf.load(CONF / "dataset" / "apps.yaml"))
    del data["split"]
    with pytest.raises(MissingMandatoryValue, match="split"):
        typed(DatasetConfig, data)
    assert typed(DatasetConfig, OmegaConf.load(CONF / "dataset" / "demo.yaml")).path is None  # null: no file


def test_demo_problems():
    res = load_problems(dataset("demo"))
    assert [p.tests.mode for p in res.problems] == ["stdin", "call"] and res.revision == "builtin"
    assert all(p.solutions and len(p.tests) >= 3 for p in DEMO_PROBLEMS)
    assert [p.id for p in load_problems(dataset("demo"), only=["demo-call"]).problems] == ["demo-call"]


def test_eval_ids_manifest_ships_with_package():
    ids = eval_ids()
    assert ids == tuple(str(i) for i in range(50))
    m = eval_manifest()
    assert m["split"] == "test" and m["difficulty"] == "interview" and m["dataset"] == "codeparrot/apps"
    import apps_bench.data

    assert (Path(apps_bench.data.__file__).parent / "apps_eval_ids.json").is_file()


def test_only_reports_ids_no_row_had(tmp_path):
    rows = [good_row(1), good_row(2, input_output="")]
    res = load_problems(local(write_jsonl(tmp_path / "r.jsonl", rows)), only=["1", "2", "3"])
    assert [p.id for p in res.problems] == ["1"] and res.skipped == {"missing_input_output": 1}
    assert res.missing_ids == ("3",)  # 2 exists but was skipped (counted), 3 is absent


def test_unreachable_hub_says_how_to_go_offline(tmp_path, monkeypatch):
    from apps_bench.data import DatasetUnavailableError

    repo = tmp_path / "mirror"
    repo.mkdir()  # a mirror without test.jsonl
    with pytest.raises(DatasetUnavailableError, match="dataset.path"):
        load_problems(dataset(hub_repo=str(repo), revision="x"), limit=1)
