"""The MLflow UI, read in a real browser: a real `mlflow server` (launchers/mlflow_server.sh) on
loopback holding a small gold sweep logged through it by the real CLI (with traces), opened in
headless Chromium (Debian's chromium + chromium-driver, driven by selenium). What a user looks
at: the experiment's cells with pass@1, a cell's Traces tab, one trace's agent turns and tool
call, and the sweep's comparison table on its parent run. Every page is saved as a screenshot
under the test's tmp dir and, when APPS_BENCH_SCREENSHOTS names a directory, there too.

The UI is a React app: every check waits for what it reads (WebDriverWait), and a check that
times out saves the page (png + html) it was looking at."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from conftest import cli_env, gold_sweep, mlflow_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
SHOTS_ENV = "APPS_BENCH_SCREENSHOTS"
WAIT_S = 180  # the UI on 2 shared busy cores: a page once took over a minute to render


def _browser() -> tuple[str, str]:
    """(chromium, chromedriver) on PATH, or the test skips saying how to install them."""
    chrome = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    driver = shutil.which("chromedriver")
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip("selenium is not installed: pip install -e '.[dev]'")
    if not chrome or not driver:
        missing = " and ".join(n for n, p in (("chromium", chrome), ("chromedriver", driver)) if not p)
        pytest.skip(f"{missing} not on PATH: on Debian, apt-get install chromium chromium-driver (.ci/run does, as root)")
    return chrome, driver


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """launchers/mlflow_server.sh on a free loopback port (one worker), stopped after the module."""
    with mlflow_server(tmp_path_factory.mktemp("mlflow_server")) as uri:
        yield uri


@pytest.fixture(scope="module")
def sweep(server: str, tmp_path_factory: pytest.TempPathFactory, apps_data_dir: Path) -> dict:
    """The gold sweep, logged to the server by the real CLI, traces on (gold's default is off)."""
    _browser()  # no sweep for a test that will skip
    cwd = tmp_path_factory.mktemp("ui_sweep")
    gold_sweep(cwd, apps_data_dir, "tracking.traces=true", env=cli_env(cwd, MLFLOW_TRACKING_URI=server))
    from mlflow import MlflowClient

    c = MlflowClient(tracking_uri=server)
    exp = c.get_experiment_by_name("apps")
    runs = list(c.search_runs([exp.experiment_id]))
    [parent] = [r for r in runs if r.data.tags.get("sweep") == "true"]
    cells = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(cells) == 4
    return {"uri": server, "client": c, "exp": exp.experiment_id, "parent": parent, "cells": cells, "cwd": cwd}


class Page:
    """One headless Chromium window; `shot` saves what it shows."""

    def __init__(self, shots: Path) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service

        chrome, driver = _browser()
        opts = Options()
        opts.binary_location = chrome
        for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=2200,1300"):
            opts.add_argument(a)
        self.d = webdriver.Chrome(options=opts, service=Service(driver))
        self.shots = shots
        self.extra = Path(os.environ[SHOTS_ENV]) if os.environ.get(SHOTS_ENV) else None

    def shot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.d.save_screenshot(str(path))
        (self.shots / f"{name}.html").write_text(self.d.page_source, encoding="utf-8")
        if self.extra is not None:
            self.extra.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, self.extra / path.name)
        return path

    def wait(self, what: str, found: Callable[[], Any], timeout: float = WAIT_S) -> Any:
        """`found()`'s first truthy value, polled until `timeout`; else the page is saved and the test fails."""
        from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

        deadline = time.monotonic() + timeout
        while True:
            try:
                got = found()
            except (StaleElementReferenceException, WebDriverException):
                got = None  # React re-rendered what we held: look again
            if got:
                return got
            if time.monotonic() > deadline:
                self.shot("timeout")
                pytest.fail(
                    f"MLflow UI at {self.d.current_url}: {what} did not appear in {timeout:.0f} s "
                    f"(page saved to {self.shots}/timeout.png/.html)"
                )
            time.sleep(0.5)

    def by_text(self, text: str, tag: str = "*") -> list[Any]:
        from selenium.webdriver.common.by import By

        return [
            e for e in self.d.find_elements(By.XPATH, f"//{tag}[normalize-space(text())={json.dumps(text)}]") if e.is_displayed()
        ]

    def css(self, selector: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return self.d.find_elements(By.CSS_SELECTOR, selector)


@pytest.fixture
def page(tmp_path: Path) -> Any:
    _browser()
    p = Page(tmp_path)
    yield p
    p.d.quit()


def _text(e: Any) -> str:
    return " ".join((e.get_attribute("textContent") or "").split())


def test_the_experiment_page_lists_the_cells_with_pass_at_1(sweep: dict, page: Page):
    from urllib.parse import quote

    expected = {r.info.run_name: r.data.metrics["pass_at_1"] for r in sweep["cells"]}
    flt = quote("metrics.pass_at_1 >= 0")  # the cells (the parent has no pass@1), listed flat
    page.d.get(
        f"{sweep['uri']}/#/experiments/{sweep['exp']}/runs?searchFilter={flt}&orderByKey={quote('metrics.`pass_at_1`')}&orderByAsc=false"
    )
    page.wait("the four cell runs", lambda: len(page.css("[role=gridcell][col-id='attributes.`Run Name`']")) == 4)
    # pass@1 is a column the user adds from Columns (search "pass_at_1", tick it)
    page.wait("the Columns button", lambda: page.by_text("Columns", "button") or page.by_text("Columns"))[0].click()
    box = page.wait("the column search box", lambda: page.css("input[placeholder='Search columns']"))[0]
    box.send_keys("pass_at_1")
    entry = page.wait(
        "the pass_at_1 column entry",
        lambda: [e for e in page.css("strong") if e.is_displayed() and _text(e.find_element("xpath", "..")) == "pass_at_1"],
    )
    entry[0].click()
    from selenium.webdriver.common.keys import Keys

    box.send_keys(Keys.ESCAPE)
    col = "metrics.`pass_at_1`"
    cells = page.wait(
        "the pass_at_1 column of the four cells",
        lambda: (lambda cs: cs if len(cs) == 4 and all(_text(c) for c in cs) else None)(
            page.css(f"[role=gridcell][col-id='{col}']")
        ),
    )
    page.shot("experiment_cells_pass_at_1")

    def row_index(e: Any) -> str:
        return e.find_element("xpath", "ancestor::*[@row-index][1]").get_attribute("row-index")

    names = {
        row_index(e): _text(e.find_element("css selector", "a"))
        for e in page.css("[role=gridcell][col-id='attributes.`Run Name`']")
    }
    shown = {names[row_index(c)]: float(_text(c)) for c in cells}
    assert shown.keys() == expected.keys()
    assert shown == pytest.approx(expected, abs=1e-3)


def _cell_keys_on_disk(cwd: Path, cell_key: str) -> set[str]:
    [d] = [p for p in (cwd / "outputs" / "cells").iterdir() if p.name.endswith(cell_key)]
    return {json.loads(x)["key"] for x in (d / "records.jsonl").read_text().splitlines()}


def _sequential_cell(sweep: dict) -> Any:
    return next(r for r in sweep["cells"] if r.data.tags["topology"] == "sequential_langgraph")


TRACE_ID = "[data-component-id='mlflow.genai-traces-table.trace-id'][title^='tr-']"  # a row's trace id tag


def _open_traces(page: Page, sweep: dict, run: Any, n: int) -> list[str]:
    """The run's Traces tab, once it lists `n` traces; -> their ids, as the tab shows them."""
    page.d.get(f"{sweep['uri']}/#/experiments/{sweep['exp']}/runs/{run.info.run_id}/traces")
    return page.wait(
        f"the {n} traces of run {run.info.run_name}",
        lambda: (lambda ids: ids if len(ids) == n else None)(
            page.d.execute_script("return Array.from(document.querySelectorAll(arguments[0])).map(e => e.title)", TRACE_ID)
        ),
    )


def test_a_cells_traces_tab_lists_its_problems(sweep: dict, page: Page):
    run = _sequential_cell(sweep)
    keys = _cell_keys_on_disk(sweep["cwd"], run.data.tags["cell_key"])
    assert len(keys) == 5
    ids = _open_traces(page, sweep, run, len(keys))
    page.shot("cell_traces_tab")
    assert set(ids) == {t.info.trace_id for t in sweep["client"].search_traces(locations=[sweep["exp"]], run_id=run.info.run_id)}
    body = _text(page.css("body")[0])
    listed = {k for k in keys if f'"problem": "{k}"' in body}
    assert listed == keys, f"problems not listed on the Traces tab: {sorted(keys - listed)}"


def test_a_trace_shows_the_agents_turns_and_a_tool_call(sweep: dict, page: Page):
    from mlflow.entities import SpanType

    run = _sequential_cell(sweep)
    c = sweep["client"]
    traces = c.search_traces(locations=[sweep["exp"]], run_id=run.info.run_id)
    with_tool = [t for t in traces if any(s.span_type == SpanType.TOOL for s in t.data.spans)]
    assert with_tool, "no trace of the sequential cell has a python_exec span"
    trace = with_tool[0]
    agents = {s.name for s in trace.data.spans if s.span_type == SpanType.AGENT and not s.name.startswith("problem ")}
    assert {"analyzer", "coder", "tester", "debugger"} <= agents  # the flow's roles, one span per turn
    tool = next(s for s in trace.data.spans if s.span_type == SpanType.TOOL)
    assert tool.name == "python_exec"

    tid = trace.info.trace_id
    assert tid in _open_traces(page, sweep, run, len(traces))
    page.css(f"{TRACE_ID}[title='{tid}']")[0].click()
    root = next(s.name for s in trace.data.spans if s.parent_id is None)  # "problem test/N"
    page.wait(f"the span tree of trace {tid}", lambda: page.by_text(root) and page.by_text("python_exec"))
    shown = {a for a in agents if page.by_text(a)}
    assert shown == agents, f"agent turns missing from the span tree: {sorted(agents - shown)}"
    page.shot("trace_span_tree")
    page.by_text("python_exec")[0].click()  # its inputs: the code the agent ran
    code_line = next(x for x in str(tool.inputs["code"]).splitlines() if x.strip())
    page.wait(
        "the python_exec span's code", lambda: page.by_text("code") and code_line.strip()[:40] in _text(page.css("body")[0])
    )
    page.shot("trace_python_exec")


def test_in_model_training_mode_the_experiment_lists_the_sweep_whose_cells_unfold(sweep: dict, page: Page):
    """MLflow's UI starts in its GenAI mode, which opens an experiment on a traces dashboard; in its "Model
    training" mode (the switch at the top left, or `?workflowType=machine_learning`) the experiment opens on
    its runs: the sweep's parent, whose cells unfold under it with the + beside its name."""
    page.d.get(f"{sweep['uri']}/#/experiments/{sweep['exp']}?workflowType=machine_learning")
    name_cells = "[role=gridcell][col-id='attributes.`Run Name`']"
    [row] = page.wait("the sweep's parent row", lambda: page.css(name_cells))
    assert page.d.current_url.split(f"/experiments/{sweep['exp']}")[-1].startswith("/runs"), page.d.current_url
    assert _text(row.find_element("css selector", "a")) == sweep["parent"].info.run_name  # its cells are folded under it
    row.find_element("css selector", "button").click()
    shown = page.wait(
        "the cells under the parent",
        lambda: (lambda xs: xs if len(xs) == 5 else None)(
            [_text(x.find_element("css selector", "a")) for x in page.css(name_cells)]
        ),
    )
    assert sorted(shown) == sorted([sweep["parent"].info.run_name, *(r.info.run_name for r in sweep["cells"])])
    page.shot("experiment_runs_unfolded")


def test_the_parent_run_shows_pass_at_1_of_each_cell_as_metrics(sweep: dict, page: Page):
    parent = sweep["parent"].info.run_id
    logged = sweep["client"].get_run(parent).data.metrics
    names = {f"pass_at_1/{t} gold" for t in ("single", "sequential_langgraph")}
    assert names | {f"pass_at_1_ci_low/{t} gold" for t in ("single", "sequential_langgraph")} <= logged.keys()
    page.d.get(f"{sweep['uri']}/#/experiments/{sweep['exp']}/runs/{parent}")
    page.wait("the parent's pass@1 metrics", lambda: all(page.by_text(n) for n in names))
    body = _text(page.css("body")[0])
    assert f"Metrics ({len(logged)})" in body
    for n in names:
        row = page.by_text(n)[0].find_element("xpath", "ancestor::*[self::tr or @role='row'][1]")
        assert _text(row).replace(n, "").strip() == _metric_shown(logged[n]), (n, _text(row))
    page.shot("parent_metrics")


def _metric_shown(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def test_the_parent_run_shows_the_comparison_table(sweep: dict, page: Page):
    from apps_bench.report import sweep_run

    parent = sweep["parent"].info.run_id
    rows = sweep_run.read(sweep["uri"], parent)
    assert {r["topology"] for r in rows} == {"single", "sequential_langgraph"}
    page.d.set_window_size(3600, 1300)  # the table's columns up to its p-values, in one screenshot
    page.d.get(f"{sweep['uri']}/#/experiments/{sweep['exp']}/runs/{parent}/artifacts")
    page.wait("the comparison table artifact", lambda: page.by_text(sweep_run.TABLE))[0].click()
    table = page.wait("the table view of the comparison", lambda: page.css("[role=table] [role=columnheader]"))
    page.shot("parent_comparison_table")
    head = [_text(h) for h in table]
    assert head == sweep_run.COLUMNS
    body = [[_text(c) for c in r.find_elements("css selector", "[role=cell]")] for r in page.css("[role=table] [role=row]")]
    body = [r for r in body if r]
    expected = [[_shown(r[k]) for k in sweep_run.COLUMNS] for r in rows]
    assert body == expected
    page.d.set_window_size(2200, 1300)
    page.by_text(sweep_run.FIGURE)[0].click()
    page.wait(
        "the comparison chart",
        lambda: [
            i
            for i in page.css(f"img[alt='{sweep_run.FIGURE}']")
            if page.d.execute_script("return arguments[0].naturalWidth", i) > 400
        ],
    )
    page.shot("parent_comparison_chart")


def _shown(v: Any) -> str:
    """A table value as the UI's table view prints it: JSON numbers without a trailing .0, and runs of
    spaces as one (HTML collapses them: per_seed's "s0 1.000  s1 1.000" reads "s0 1.000 s1 1.000")."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return " ".join(str(v).split())
