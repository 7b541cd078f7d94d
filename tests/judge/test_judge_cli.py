"""`python -m apps_bench.judge` end to end, as a subprocess, on real APPS rows and the real sandbox."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def judge_cmd(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "apps_bench.judge", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def rows(apps_data_dir, tmp_path) -> Path:
    """Six train rows: 4 standard-input problems and 2 call-based ones, in the codeparrot schema."""
    wanted = {"0", "1", "2", "3", "2404", "2412"}
    lines = [
        l for l in (apps_data_dir / "train_mini150.jsonl").read_text().splitlines() if str(json.loads(l)["problem_id"]) in wanted
    ]
    assert len(lines) == 6
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_gold_end_to_end(rows, tmp_path):
    out = tmp_path / "verdicts.jsonl"
    r = judge_cmd(str(rows), "--gold", "--max-tests-per-row", "0", "--out", str(out), "--workers", "2")
    assert r.returncode == 0, r.stderr
    recs = read_jsonl(out)
    assert [x["id"] for x in recs] == ["0", "1", "2", "3", "2404", "2412"]  # problem order
    for x in recs:
        assert {"id", "passed", "n_tests", "tests_run", "tests_passed", "results", "profile"} <= set(x)
        assert x["profile"] == "seed" and x["passed"] is True and x["tests_passed"] == x["n_tests"] == len(x["results"])
    assert "pass@1" in r.stdout and "seconds:" in r.stdout and "introductory" in r.stdout


def test_predictions_with_wrong_missing_and_null(rows, tmp_path, apps_data_dir):
    sols = {str(json.loads(l)["problem_id"]): json.loads(json.loads(l)["solutions"])[0] for l in rows.read_text().splitlines()}
    pred = tmp_path / "pred.jsonl"
    pred.write_text(
        "\n".join(
            json.dumps(x)
            for x in [
                {"id": "0", "code": sols["0"]},
                {"id": "1", "code": "print('wrong')"},
                {"id": "2404", "code": sols["2404"]},
                {"id": "2412", "code": None},
                {"id": "3", "reply": "<think>hmm</think>Here:\n```python\n" + sols["3"] + "\n```\nDone."},
                {"id": "2", "reply": "I cannot solve this."},
            ]
        )
        + "\n"
    )
    out = tmp_path / "v.jsonl"
    r = judge_cmd(str(rows), "--predictions", str(pred), "--out", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr
    recs = {x["id"]: x for x in read_jsonl(out)}
    assert set(recs) == {"0", "1", "2", "3", "2404", "2412"}  # only what was predicted
    assert recs["0"]["passed"] and recs["2404"]["passed"]
    assert not recs["1"]["passed"] and recs["1"]["results"][0]["outcome"] == "wrong_answer" and recs["1"]["tests_run"] == 1
    assert not recs["2412"]["passed"] and recs["2412"]["extracted"] is False and recs["2412"]["tests_run"] == 0
    assert recs["3"]["passed"] and recs["2"]["extracted"] is False  # replies go through extract_program
    # pass@1 all = 3/6, extracted = 3/4
    assert "0.5000" in r.stdout and "0.7500" in r.stdout


def test_only_limit_and_default_cap_from_conf(apps_data_dir, tmp_path):
    out = tmp_path / "v.jsonl"
    r = judge_cmd(str(apps_data_dir / "test_0-49_partial.jsonl"), "--gold", "--only", "8,9", "--out", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr
    recs = read_jsonl(out)
    assert [x["id"] for x in recs] == ["8", "9"]
    assert all(x["n_tests"] == 20 for x in recs)  # conf/config.yaml max_tests_per_row
    assert "max_tests_per_row=20" in r.stderr
    r = judge_cmd(
        str(apps_data_dir / "test_0-49_partial.jsonl"),
        "--gold",
        "--limit",
        "1",
        "--max-tests-per-row",
        "3",
        "--out",
        str(out),
        "--no-progress",
    )
    assert r.returncode == 0 and [(x["id"], x["n_tests"]) for x in read_jsonl(out)] == [("8", 3)]


@pytest.mark.parametrize(
    "args,message",
    [
        ([], "--predictions"),
        (["--gold", "--profile", "nonesuch"], "available: reference, seed"),
        (["--predictions", "/nonexistent/pred.jsonl"], "not found"),
    ],
)
def test_bad_input_gets_a_clear_error(rows, args, message):
    r = judge_cmd(str(rows), *args)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_bad_predictions_line(rows, tmp_path):
    pred = tmp_path / "p.jsonl"
    pred.write_text('{"id": "0"}\n')
    r = judge_cmd(str(rows), "--predictions", str(pred))
    assert r.returncode == 2 and '"id" and "code" keys' in r.stderr


def test_missing_rows_file(tmp_path):
    r = judge_cmd(str(tmp_path / "none.jsonl"), "--gold")
    assert r.returncode == 2 and "not found" in r.stderr


def test_the_command_reads_conf_without_hydra(rows, tmp_path):
    """The judge command reads its settings from conf/'s files (the profile, the dataset, the test cap) and
    composes no cell: Hydra is never imported (its import and a cell's composition were ~0.2 s of a ~1.3 s
    command on train_mini150: docs/benchmarks.md, judge speed). What conf/ and --set say still applies."""
    out, summary = tmp_path / "v.jsonl", tmp_path / "s.json"
    r = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "apps_bench.judge",
            str(rows),
            "--gold",
            "--no-progress",
            "--out",
            str(out),
            "--summary",
            str(summary),
            "--set",
            "timeout_s=3",
            "--profile",
            "reference",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr
    imported = {line.rsplit("|", 1)[1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert {"omegaconf", "apps_bench.judge.cli", "apps_bench.config.schema"} <= imported  # the list is the command's imports
    assert not {m for m in imported if m == "hydra" or m.startswith("hydra.")}
    assert len(read_jsonl(out)) == 6 and "max_tests_per_row=20" in r.stderr  # conf/config.yaml's test cap
    judge = json.loads(summary.read_text())["judge"]
    assert (judge["profile"], judge["timeout_s"], judge["program_timeout_s"]) == ("reference", 3.0, 11.0)
    assert judge["sandbox"]["output_cap_bytes"] == 8 << 20  # conf/judge/reference.yaml's
