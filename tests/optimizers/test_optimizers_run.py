"""One optimizer run through `optimizers.optimization.optimize` for none, maspo and gepa, with a
synthetic two-stage pipeline (analyzer -> coder) and a deterministic optimizer model.

Synthetic pipeline: the coder's program prints N = (+ in analyzer prompt) + (+ in coder
prompt); problem i passes when N >= i % 4. The optimizer model appends '+' (even seed)
or '-' (odd seed) to the current prompt, in tags.
"""

from __future__ import annotations

import json
import re

import pytest
from conftest import compose_cell, optimizer_config, optimizer_params

from apps_bench.optimizers.optimization import optimize, write_prompt_set
from apps_bench.optimizers.proposals import ChatReply
from apps_bench.optimizers.protocol import EvalSet, read_manifest_splits
from apps_bench.optimizers.scoring import RoleTrace, Rollout
from apps_bench.topologies.base import PromptSet
from apps_bench.topologies.prompts import read_prompt_file
from apps_bench.types import Outcome, Problem, Verdict
from apps_bench.types import TestResult as Result
from apps_bench.types import TestSuite as Suite

EVAL = EvalSet(frozenset(("test", str(i)) for i in range(50)))
SEED = PromptSet({"analyzer": "Plan.", "coder": "Code.\n```python\n# your code\n```", "debugger": "unused role"})


def problems():
    out = [
        Problem(
            id=str(i),
            question=f"Train question {i}",
            tests=Suite(("1\n",), ("1\n",)),
            difficulty="interview",
            split="train",
            solutions=("REFERENCE_SOLUTION",),
        )
        for i in range(100, 140)
    ]
    out.append(Problem(id="7", question="Eval question 7", tests=Suite(("1\n",), ("1\n",)), difficulty="interview", split="test"))
    out.append(
        Problem(id="300", question="Eval question 7", tests=Suite(("1\n",), ("1\n",)), difficulty="interview", split="train")
    )
    out.append(Problem(id="301", question="intro", tests=Suite(("1\n",), ("1\n",)), difficulty="introductory", split="train"))
    return out


def n_of(texts) -> int:
    return texts["analyzer"].count("+") + texts["coder"].count("+") - texts["coder"].count("-")


def need(pid) -> int:
    return int(pid) % 4


class Pipeline:
    def __init__(self, out_dir):
        self.out_dir = out_dir
        self.batches = 0
        self.keys: set = set()

    def run_batch(self, prompt_set, jobs):
        assert (self.out_dir / "manifest.json").exists(), "manifest must be written before any model call"
        self.batches += 1
        n = max(0, n_of(prompt_set.texts))
        out = []
        for key, seed in jobs:
            self.keys.add(key)
            ok = n >= need(key[1])
            out.append(
                Rollout(
                    key=key,
                    seed=seed,
                    program=f"print({n})",
                    passed=ok,
                    pass_fraction=1.0 if ok else n / need(key[1]),
                    n_tests=1,
                    tests_passed=int(ok),
                    task_tokens=3,
                    traces=(
                        RoleTrace("analyzer", "analyzer", key[1], "plan" + "+" * prompt_set["analyzer"].count("+")),
                        RoleTrace("coder", "coder", key[1], f"```python\nprint({n})\n```"),
                    ),
                )
            )
        return out


def score_program(problem, program):
    n = int(re.search(r"print\((-?\d+)\)", program).group(1)) if program else -1
    ok = n >= need(problem.id)
    res = (Result(0, Outcome.PASS if ok else Outcome.WRONG_ANSWER),)
    return Verdict(problem.id, ok, 1, 1, int(ok), res, "seed")


def extract(text):
    m = re.search(r"```python\n(.*?)```", text, re.S)
    return m.group(1).strip() if m else None


class Chat:
    def __init__(self):
        self.calls = 0
        self.seen_text = []

    def __call__(self, messages, seed):
        self.calls += 1
        body = messages[-1]["content"]
        self.seen_text.append(body)
        m = re.search(r"<current_prompt>\n(.*)\n</current_prompt>", body, re.S)
        if m is None:  # a text-judge request
            return ChatReply("<winner>tie</winner>", 5)
        cur = m.group(1)
        return ChatReply(
            f"<analysis>a</analysis><modification>m</modification><prompt>{cur}{'+' if seed % 2 == 0 else '-'}</prompt>", 10
        )


POOL = {"train_size": 12, "val_size": 6, "split_seed": 3}
PARAMS = {
    "maspo": optimizer_params("maspo", budget={"rollouts": 300}, pool=POOL, K=2, Ksub=2, T=2, D=2, minibatch=4, seed=0),
    "gepa": optimizer_params("gepa", budget={"rollouts": 80}, pool=POOL, minibatch=3),
    "none": optimizer_params("gepa", budget={"rollouts": None}, pool=POOL),  # optimizer=none reads only the protocol's part
}


def go(tmp_path, method, name="out"):
    out = tmp_path / name
    pipe, chat = Pipeline(out), Chat()
    res = optimize(
        optimizer=optimizer_config(method, PARAMS[method]),
        flow="sequential",
        roles=["analyzer", "coder"],
        seed_prompts=SEED,
        problems=problems(),
        dataset_revision="rev1",
        eval_set=EVAL,
        runner=pipe,
        run_seed=0,
        model={"id": "synthetic"},
        settings={"flow": "sequential"},
        out_dir=out,
        chat=None if method == "none" else chat,
        score_program=score_program,
        extract_program=extract,
    )
    return res, pipe, chat, out


@pytest.mark.parametrize("method", ["maspo", "gepa"])
def test_optimizer_run_end_to_end(tmp_path, method):
    res, pipe, chat, out = go(tmp_path, method)
    splits = read_manifest_splits(out / "manifest.json")
    man = json.loads((out / "manifest.json").read_text())
    assert man["dataset_revision"] == "rev1" and man["pool_size"] == 40
    assert man["dropped"] == {"eval_question": 1, "other_difficulty": 1, "other_split": 1}
    # only training problems during optimization, val only for re-scoring; never an eval key
    assert pipe.keys <= set(splits.train) | set(splits.val) and not any(k[0] == "test" for k in pipe.keys)
    assert res.chosen_val > res.seed_val and n_of(res.chosen) > n_of(SEED.texts)
    assert res.chosen["debugger"] == "unused role" and res.chosen["coder"].startswith("Code.\n```python")
    assert read_prompt_file(res.prompts_path) == res.chosen  # a cell loads it as topology.prompt_file
    assert res.budget["rollouts"] <= 300 + 6 and res.budget["overshoot"]["rollouts"] <= 6
    assert res.val_rescoring["rollouts"] == 12 and res.val_rescoring["max_rollouts"] is None
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    kinds = {e["kind"] for e in events}
    assert {"start", "evaluation", "optimizer_call", "val", "done"} <= kinds
    evaluated = {k for e in events if e["kind"] == "evaluation" for k in e["keys"]}
    assert evaluated and not any(k.startswith("test/") for k in evaluated)
    # the optimizer model never saw a reference solution
    assert chat.calls > 0 and not any("REFERENCE_SOLUTION" in t for t in chat.seen_text)
    assert json.loads((out / "result.json").read_text())["chosen"] == res.chosen
    if method == "maspo":
        assert res.details["graph"]["agents"] == ["analyzer", "coder"] and res.details["steps"] > 0
        assert any(e["kind"] == "maspo_child" for e in events)
    else:
        assert res.details["candidates"] >= 2 and any(e["kind"] == "gepa_candidate" for e in events)
    # a checkpoint per step (MASPO step / GEPA iteration), the last one holding the final budget
    from apps_bench.optimizers.cache import Checkpoints

    ck = Checkpoints(out / "checkpoints")
    assert len(ck.steps()) >= 2 and ck.latest()["budget"]["rollouts"] == res.budget["rollouts"]


@pytest.mark.parametrize("method", ["maspo", "gepa"])
def test_rerun_same_out_dir_replays_without_cost(tmp_path, method):
    first, pipe1, chat1, _ = go(tmp_path, method)
    again, pipe2, chat2, _ = go(tmp_path, method)
    assert again.chosen == first.chosen and again.seed_val == first.seed_val and again.chosen_val == first.chosen_val
    assert (
        again.budget["rollouts"] == first.budget["rollouts"]
        and again.budget["optimizer_tokens"] == first.budget["optimizer_tokens"]
    )
    assert pipe2.batches == 0 and chat2.calls == 0 and again.budget["fresh_rollouts"] == 0
    events = [json.loads(line) for line in (tmp_path / "out" / "events.jsonl").read_text().splitlines()]
    first = [e for e in events if e["attempt"] == 1]
    second = [e for e in events if e["attempt"] == 2]
    assert [e["kind"] for e in first] == [e["kind"] for e in second]  # the rerun replays the same log
    assert all(e["fresh"] == 0 for e in second if e["kind"] == "evaluation")


def test_none_scores_seed_only_and_other_split_settings_are_refused(tmp_path):
    res, pipe, chat, out = go(tmp_path, "none")
    assert res.chosen == dict(SEED.texts) and res.seed_val == res.chosen_val and res.budget["rollouts"] == 0
    assert chat.calls == 0 and pipe.batches == 1  # seed on val once; chosen == seed is served from the cache
    with pytest.raises(ValueError, match="different split manifest"):
        optimize(
            optimizer=optimizer_config("none", optimizer_params("gepa", pool={**POOL, "split_seed": 4})),
            flow="sequential",
            roles=["analyzer", "coder"],
            seed_prompts=SEED,
            problems=problems(),
            dataset_revision="rev1",
            eval_set=EVAL,
            runner=Pipeline(out),
            run_seed=0,
            model={"id": "synthetic"},
            settings={},
            out_dir=out,
        )
    with pytest.raises(ValueError, match="needs an optimizer model"):
        optimize(
            optimizer=optimizer_config("gepa", PARAMS["gepa"]),
            flow="sequential",
            roles=["analyzer", "coder"],
            seed_prompts=SEED,
            problems=problems(),
            dataset_revision="rev1",
            eval_set=EVAL,
            runner=Pipeline(tmp_path / "x"),
            run_seed=0,
            model={"id": "synthetic"},
            settings={},
            out_dir=tmp_path / "x",
        )


def test_prompt_file_roundtrip_with_fences_and_odd_whitespace(tmp_path):
    texts = {"a": "line1\n```python\nx = 1\n```\n", "b": "trailing space \nnext", "c": "one line"}
    path = write_prompt_set(tmp_path / "p.yaml", texts)
    assert read_prompt_file(path) == texts


def test_step_metrics_from_events(tmp_path):
    """Events -> (step, metrics) for MLflow: the step is the charged rollout count."""
    from apps_bench.optimizers.optimization import step_metrics

    logged = []
    out = tmp_path / "o"
    res = optimize(
        optimizer=optimizer_config("maspo", PARAMS["maspo"]),
        flow="sequential",
        roles=["analyzer", "coder"],
        seed_prompts=SEED,
        problems=problems(),
        dataset_revision="rev1",
        eval_set=EVAL,
        runner=Pipeline(out),
        run_seed=0,
        model={"id": "synthetic"},
        settings={},
        out_dir=out,
        chat=Chat(),
        score_program=score_program,
        extract_program=extract,
        hook=lambda k, p: logged.append(step_metrics(k, p)),
    )
    logged = [m for m in logged if m is not None]
    charged = [m["opt/rollouts_charged"] for _, m in logged if "opt/rollouts_charged" in m]
    assert charged == sorted(charged) and charged[-1] == res.budget["rollouts"]
    assert all(step == m["opt/rollouts_charged"] for step, m in logged if "opt/rollouts_charged" in m)
    best = [m["opt/best_score/coder"] for _, m in logged if "opt/best_score/coder" in m]
    assert len(best) == res.details["steps"] and best[-1] == res.details["best_scores"]["coder"]
    final = logged[-1][1]
    assert final["val/chosen_strict"] == res.chosen_val.strict and final["val/seed_strict"] == res.seed_val.strict
    assert step_metrics("optimizer_call", {"tokens": 3}) is None


KILL_SCRIPT = r"""
import sys, time
sys.path[:0] = [{tests!r}, {tests_root!r}]
import test_optimizers_run as t
from pathlib import Path
out = Path({out!r})

class Slow(t.Pipeline):
    def run_batch(self, prompt_set, jobs):
        res = super().run_batch(prompt_set, jobs)
        print("batch", self.batches, flush=True)
        time.sleep(0.05)
        return res

t.optimize(optimizer=t.optimizer_config({method!r}, t.PARAMS[{method!r}]), flow="sequential", roles=["analyzer", "coder"],
           seed_prompts=t.SEED, problems=t.problems(), dataset_revision="rev1", eval_set=t.EVAL, runner=Slow(out),
           run_seed=0, model={{"id": "synthetic"}}, settings={{"flow": "sequential"}}, out_dir=out, chat=t.Chat(),
           score_program=t.score_program, extract_program=t.extract)
print("finished", flush=True)
"""


@pytest.mark.parametrize("method", ["maspo", "gepa"])
def test_kill_9_mid_run_then_rerun_same_prompts_same_charged_budget(tmp_path, method):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    reference, _, _, _ = go(tmp_path, method, name="reference")
    out = tmp_path / "killed"
    script = KILL_SCRIPT.format(
        tests=str(Path(__file__).parent), tests_root=str(Path(__file__).parents[1]), out=str(out), method=method
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    seen = 0
    for line in proc.stdout:
        if line.startswith("batch"):
            seen = int(line.split()[1])
            if seen >= 5:
                break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert seen >= 5 and not (out / "result.json").exists()  # killed mid-run
    res, pipe, chat, _ = go(tmp_path, method, name="killed")
    assert res.chosen == reference.chosen
    assert res.budget["rollouts"] == reference.budget["rollouts"]
    assert res.budget["optimizer_tokens"] == reference.budget["optimizer_tokens"]
    assert res.budget["fresh_rollouts"] < res.budget["rollouts"]  # the batches before the kill were not paid twice


def test_each_method_is_the_function_its_yaml_names_and_a_wrong_name_says_where_to_fix_it(tmp_path):
    """conf/optimizer/<name>.yaml's `_target_` is the method `optimize` runs (no list of methods in code);
    it is code, not a setting: it leaves the cell key alone, like a topology's runner class."""
    from dataclasses import replace

    from apps_bench.cell.key import resolve_cell
    from apps_bench.config.schema import cell_data
    from apps_bench.optimizers import methods

    for name, fn in (("none", methods.keep_seed), ("maspo", methods.run_maspo), ("gepa", methods.run_gepa)):
        assert methods.method_of(optimizer_config(name, None)._target_, name) is fn
    cfg = compose_cell("optimizer=maspo")
    other = compose_cell("optimizer=maspo", "optimizer._target_=apps_bench.optimizers.methods.run_gepa")
    assert resolve_cell(cell_data(cfg)).key == resolve_cell(cell_data(other)).key
    for target, says in (
        ("apps_bench.optimizers.nomodule.run", "no module 'apps_bench.optimizers.nomodule'"),
        ("apps_bench.optimizers.methods.MethodRunX", "module apps_bench.optimizers.methods has no 'MethodRunX'"),
        ("apps_bench.optimizers.methods.annotations", "'apps_bench.optimizers.methods.annotations' is not a function"),
    ):
        bad = replace(optimizer_config("none", PARAMS["none"]), _target_=target)
        with pytest.raises(ValueError, match=f"optimizer 'none': .*{re.escape(says)}.*conf/optimizer/none.yaml"):
            optimize(
                optimizer=bad,
                flow="sequential",
                roles=["analyzer", "coder"],
                seed_prompts=SEED,
                problems=problems(),
                dataset_revision="rev1",
                eval_set=EVAL,
                runner=Pipeline(tmp_path / "x"),
                run_seed=0,
                model={"id": "synthetic"},
                settings={},
                out_dir=tmp_path / "x",
            )
        assert not (tmp_path / "x").exists()  # refused before anything is written
