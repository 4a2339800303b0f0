"""Browser tier: JupyterLab in a real (headless) Chromium runs the four explorers' notebooks (00, 05, 06, 07) over the
committed GPU results, moves a control of each and reads what the browser then draws.

A JupyterLab server on 127.0.0.1 (a free port, token auth, the project's ``python3`` kernel: this interpreter)
serves scratch copies of the notebooks, 05, 06 and 07 with ``results_dir`` set to their committed results (a cell
after the parameters, as papermill injects one); Debian's Chromium (``/usr/bin/chromium``) driven by selenium
through Debian's ``/usr/bin/chromedriver`` (given to selenium's Service, so selenium-manager never runs and
nothing is downloaded) opens each, runs every cell, moves a control, and reads the DOM: each figure's trace paths,
annotations, tick labels and axis titles, and the explorer's texts. 05 goes through an empty selection of arms and
is rendered twice; 07 through a window its steps cannot hold. Screenshots of each explorer go to
``build/browser/`` (git-ignored; ``RLKIT_BROWSER_SHOTS`` another folder). Setup on a fresh Debian machine:
``scripts/ci_browser_setup.sh``; run it alone with ``pytest -m browser tests/test_browser.py``.
"""
from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from rlkit.core.env import REPO_ROOT

pytestmark = pytest.mark.browser

CHROMIUM = Path(os.environ.get("RLKIT_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("RLKIT_CHROMEDRIVER", "/usr/bin/chromedriver"))
NBS = REPO_ROOT / "nbs"
OUTPUTS = REPO_ROOT / "outputs"
SHOTS = Path(os.environ.get("RLKIT_BROWSER_SHOTS", REPO_ROOT / "build" / "browser"))
WAIT_S = 300  # notebook 05 reads 25 committed arms; on 2 busy cores a notebook runs in well under this
# the committed results each notebook renders (00 plans, it reads nothing)
RESULTS = {"05_grpo_qwen3_4b": OUTPUTS / "05_grpo_qwen3_4b", "06_util_sweep": OUTPUTS / "06_util_sweep",
           "07_does_it_learn": OUTPUTS / "07_does_it_learn" / "h200"}

if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
    pytest.skip(f"browser tier: {CHROMIUM} and {CHROMEDRIVER} are needed (Debian: scripts/ci_browser_setup.sh "
                f"installs chromium and chromium-driver)", allow_module_level=True)
selenium = pytest.importorskip("selenium", reason="browser tier: pip install -e .[dev] (selenium)")

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait


def scratch_copy(name: str, root: Path) -> str:
    """``nbs/<name>.ipynb`` into ``root``, reading its committed results: a cell after the parameters sets
    ``results_dir``. 05's also drops ``RLKIT_OUT_DIR`` so that it writes where ``make lab`` does (the render
    must not write into the arms folder it reads)."""
    nb = nbformat.read(NBS / f"{name}.ipynb", as_version=4)
    if name in RESULTS:
        lines = [f"results_dir = {str(RESULTS[name])!r}"]
        if name == "05_grpo_qwen3_4b":
            lines = ["import os", "os.environ.pop('RLKIT_OUT_DIR', None)", *lines]
        at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])) + 1
        nb.cells.insert(at, nbformat.v4.new_code_cell("\n".join(lines), metadata={"tags": ["injected-parameters"]}))
    nbformat.write(nb, root / f"{name}.ipynb")
    return f"{name}.ipynb"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture  # one JupyterLab per explorer: a lab shared by the four stalled the second notebook at times
def lab(tmp_path_factory):
    """A JupyterLab server on localhost over a scratch folder holding copies of the notebooks."""
    root = tmp_path_factory.mktemp("lab")
    for name in ("00_phase_budget", *RESULTS):
        scratch_copy(name, root)
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(root / ".config"), "JUPYTER_RUNTIME_DIR": str(root / ".runtime"),
           "RLKIT_OUT_DIR": str(root / "out"),  # the notebooks' metrics.json go here, not into outputs/
           "RLKIT_STATIC_FIGURES": "0"}  # the live explorers are under test; PNGs for saved copies are tested elsewhere
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
           f"--LabApp.user_settings_dir={root / '.settings'}", f"--LabApp.workspaces_dir={root / '.workspaces'}",
           "--ServerApp.terminals_enabled=False", *(["--allow-root"] if os.geteuid() == 0 else [])]
    # no news / update toasts over the screenshots
    settings = root / ".settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    with open(root / "lab.log", "w") as log:
        yield from _serve(cmd, root, env, log, port, token)


def _serve(cmd, root, env, log, port, token):
    """Start the server, wait for its API, yield where it is, stop it (the fixture's body)."""
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"JupyterLab did not start:\n{(root / 'lab.log').read_text()[-3000:]}")
                time.sleep(0.5)
        yield {"url": url, "token": token, "root": root}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def browser(monkeypatch_module):
    from selenium.webdriver.common import selenium_manager

    def refuse(*_a, **_k):
        raise AssertionError("selenium-manager must not run: the driver path is given")

    monkeypatch_module.setattr(selenium_manager.SeleniumManager, "binary_paths", refuse)
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1500,2000", "--hide-scrollbars", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_script_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def _wait(driver, what, timeout=WAIT_S, poll=0.5):
    """Wait until ``what(driver)`` is truthy; return it."""
    return WebDriverWait(driver, timeout, poll_frequency=poll).until(lambda d: what(d))


_RAN = """
const nb = window.jupyterapp.shell.currentWidget;
const kernel = nb && nb.sessionContext && nb.sessionContext.session && nb.sessionContext.session.kernel;
if (!kernel) return '';
const code = nb.content.widgets.filter(c => c.model.type === 'code');
for (const c of code) {
  const outs = c.model.outputs;
  for (let i = 0; i < outs.length; i++) {
    const o = outs.get(i).toJSON();
    if (o.output_type === 'error') return 'error: ' + o.ename + ': ' + o.evalue;
  }
}
return code.every(c => c.model.executionCount !== null) && kernel.status === 'idle' ? 'done' : '';
"""


def run_all(driver) -> None:
    """Clear every output, run every cell, wait until each has run; a cell's error fails the test with its text."""
    driver.execute_script("window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs');")
    _wait(driver, lambda d: d.execute_script(
        "return window.jupyterapp.shell.currentWidget.content.widgets.every("
        "c => c.model.type !== 'code' || c.model.executionCount === null);"), timeout=30)
    driver.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells');")
    ran = _wait(driver, lambda d: d.execute_script(_RAN))
    assert ran == "done", ran
    time.sleep(1.0)  # let plotly finish its first draws


def open_and_run(driver, lab, name: str) -> None:
    driver.get(f"{lab['url']}/lab/tree/{name}.ipynb?token={lab['token']}")
    _wait(driver, lambda d: d.execute_script(
        "const a = window.jupyterapp; const w = a && a.shell.currentWidget;"
        "return !!(w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel"
        " && w.sessionContext.session.kernel.status === 'idle');"))
    run_all(driver)


def shut_down(driver) -> None:
    """End the notebook's kernel (four kernels at once would crowd two cores)."""
    driver.execute_script("return window.jupyterapp.shell.currentWidget.sessionContext.shutdown();")


_DRAWN = """
const root = document.querySelector(arguments[0]);
if (!root) return null;
const all = s => Array.from(root.querySelectorAll(s));
const text = s => all(s).map(t => t.textContent.trim());
return {traces: all('g.trace path').map(p => p.getAttribute('d')).filter(d => d && d !== 'M0,0Z'),
        annotations: text('.annotation-text'), xticks: text('g.xtick text, g.xtick2 text'),
        xtitle: text('text.xtitle').join(' '), ytitle: text('text.ytitle').join(' '), title: text('text.gtitle').join(' ')};
"""


def drawn(driver, css: str) -> dict | None:
    """What the browser draws of the figure widget with class ``css``: every trace's SVG path, the annotations'
    texts, the x tick labels, the axis titles and the title."""
    return driver.execute_script(_DRAWN, f".{css}")


def text_of(driver, css: str) -> str:
    found = driver.find_elements(By.CSS_SELECTOR, f".{css}")
    return found[0].text.strip() if found else ""


def control(driver, panel: str, kind: str, label: str):
    """The ipywidgets control of ``kind`` (a widget class: widget-dropdown, widget-slider, ...) labelled ``label``."""
    return driver.find_element(By.XPATH, f"//div[contains(@class,'{panel}')]//div[contains(@class,'{kind}')]"
                                         f"[.//label[normalize-space()='{label}']]")


def drag(driver, slider, dx: int) -> None:
    """Drag a slider's handle by ``dx`` pixels (a real pointer drag; the value is sent on release)."""
    handle = slider.find_element(By.CSS_SELECTOR, ".noUi-handle")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", handle)
    step = dx // 2
    ActionChains(driver).click_and_hold(handle).move_by_offset(step, 0).pause(0.2).move_by_offset(dx - step, 0) \
        .release().perform()


def to_end(slider, side: int) -> int:
    """The pixels from a slider's handle to just past the left (``side`` -1) or right (+1) end of its track."""
    track = slider.find_element(By.CSS_SELECTOR, ".noUi-base").rect
    handle = slider.find_element(By.CSS_SELECTOR, ".noUi-handle").rect
    centre = handle["x"] + handle["width"] / 2
    return int((track["x"] - centre - 4) if side < 0 else (track["x"] + track["width"] - centre + 4))


def shot(driver, panel: str, name: str) -> Path:
    """A screenshot of the cell holding the explorer's ``panel`` (its controls, texts and figures) into SHOTS."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    cell = driver.find_element(By.CSS_SELECTOR, f".{panel}").find_element(
        By.XPATH, "./ancestor::div[contains(@class, 'jp-Cell')][1]")
    driver.execute_script("arguments[0].scrollIntoView({block: 'start'});", cell)
    time.sleep(0.5)
    path = SHOTS / name
    if not cell.screenshot(str(path)):
        driver.save_screenshot(str(path))
    assert path.stat().st_size > 10_000, f"{path}: an empty screenshot"
    return path


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# --- 00: the phase-budget planner ---------------------------------------------------------------------------------

def test_00_budget_explorer_redraws_in_place(lab, browser):
    open_and_run(browser, lab, "00_phase_budget")
    _wait(browser, lambda d: text_of(d, "rlkit-budget-verdict") and (drawn(d, "rlkit-budget-bars") or {}).get("traces"))
    before, verdict = drawn(browser, "rlkit-budget-bars"), text_of(browser, "rlkit-budget-verdict")
    bars_element = browser.find_element(By.CSS_SELECTOR, ".rlkit-budget-bars")
    shot(browser, "rlkit-budget-panel", "00_budget_explorer.png")

    slider = control(browser, "rlkit-budget-panel", "widget-slider", "gpu_memory_utilization")
    readout = slider.find_element(By.CSS_SELECTOR, ".widget-readout")
    start_value = readout.text
    drag(browser, slider, -16)
    _wait(browser, lambda d: readout.text != start_value, timeout=20)
    _wait(browser, lambda d: text_of(d, "rlkit-budget-verdict") != verdict
          and drawn(d, "rlkit-budget-bars")["traces"] != before["traces"], timeout=60)
    time.sleep(1.0)
    after = drawn(browser, "rlkit-budget-bars")
    shot(browser, "rlkit-budget-panel", "00_budget_explorer_util.png")

    assert float(readout.text) < float(start_value)
    assert after["traces"] != before["traces"], "the bars were not redrawn"
    assert any(a.startswith("card ") for a in after["annotations"]), after["annotations"]
    assert {"rollout", "update_fwd_bwd"} <= set(after["xticks"]) and "GiB per GPU" in after["ytitle"]
    assert browser.find_element(By.CSS_SELECTOR, ".rlkit-budget-bars") == bars_element  # redrawn in place

    # flash_ce: the pre-flight reads another logits path, and says so in view with both peaks
    Select(control(browser, "rlkit-budget-panel", "widget-dropdown", "logits path").find_element(
        By.TAG_NAME, "select")).select_by_visible_text("flash_ce")
    _wait(browser, lambda d: "Two logits paths" in text_of(d, "rlkit-budget-preflight"), timeout=60)
    shut_down(browser)


# --- 05: the arms explorer over the committed arms ----------------------------------------------------------------

ARMS_FIGURES = ("rlkit-arms-timeline", "rlkit-arms-limits", "rlkit-arms-memory")
EMPTY = "pick at least one arm"


def arms_select(driver) -> Select:
    return Select(driver.find_element(By.CSS_SELECTOR, ".rlkit-arms-panel select[multiple]"))


def test_05_arms_explorer_through_an_empty_selection_and_a_second_render(lab, browser):
    from rlkit.experiments.grpo_runs import read_arms

    folder = RESULTS["05_grpo_qwen3_4b"]
    before = listing(folder)
    open_and_run(browser, lab, "05_grpo_qwen3_4b")
    arms = [o.text for o in arms_select(browser).options]
    assert arms == list(read_arms(folder)) and "interactive" not in arms
    start = {f: drawn(browser, f) for f in ARMS_FIGURES}
    assert all(start[f]["traces"] for f in ARMS_FIGURES), start
    shot(browser, "rlkit-arms-panel", "05_arms_explorer.png")

    arms_select(browser).deselect_all()
    _wait(browser, lambda d: all(EMPTY in drawn(d, f)["annotations"] for f in ARMS_FIGURES), timeout=120)
    empty = {f: drawn(browser, f) for f in ARMS_FIGURES}
    assert all(not e["traces"] and not e["xticks"] for e in empty.values()), empty

    two = ("1-fixes-hostadamw", "5-master-on-host-cast-once")
    for arm in two:
        arms_select(browser).select_by_visible_text(arm)
    _wait(browser, lambda d: set(drawn(d, "rlkit-arms-memory")["xticks"]) == set(two), timeout=120)
    time.sleep(1.0)
    picked = {f: drawn(browser, f) for f in ARMS_FIGURES}
    shot(browser, "rlkit-arms-panel", "05_arms_explorer_two_arms.png")
    for f, p in picked.items():
        assert EMPTY not in p["annotations"], f"{f} keeps the placeholder: {p['annotations']}"
        assert p["traces"] and p["traces"] != start[f]["traces"], f
        assert p["xticks"], f"{f} lost its x tick labels"
    assert set(two) <= set(picked["rlkit-arms-timeline"]["xticks"]) and picked["rlkit-arms-timeline"]["ytitle"] == "seconds"
    assert picked["rlkit-arms-memory"]["ytitle"] == "GiB per GPU"
    assert set(two) == {line.split()[0] for line in text_of(browser, "rlkit-arms-table").splitlines()[1:3]}

    run_all(browser)  # the second render reads the same arms and leaves the folder as it was
    assert [o.text for o in arms_select(browser).options] == arms
    assert listing(folder) == before
    shut_down(browser)


# --- 06: the sweep point explorer over the committed sweep --------------------------------------------------------

def test_06_sweep_explorer_opens_on_a_measured_point_and_follows_the_case(lab, browser):
    open_and_run(browser, lab, "06_util_sweep")
    case = Select(control(browser, "rlkit-sweep-panel", "widget-dropdown", "case").find_element(By.TAG_NAME, "select"))
    first = case.first_selected_option.text
    assert "measured; step" in text_of(browser, "rlkit-sweep-point"), "opened on a point that was not measured"
    start = drawn(browser, "rlkit-sweep-kv")
    assert start["traces"] and not any("no vLLM statistics" in a for a in start["annotations"])
    assert start["xtitle"].startswith("vLLM statistics line") and start["ytitle"] == "KV cache usage (%)"
    shot(browser, "rlkit-sweep-panel", "06_sweep_explorer.png")

    other = next(o.text for o in case.options if o.text != first)
    case.select_by_visible_text(other)
    _wait(browser, lambda d: text_of(d, "rlkit-sweep-point").startswith(other), timeout=120)
    time.sleep(1.0)
    after = {f: drawn(browser, f"rlkit-sweep-{f}") for f in ("timeline", "kv", "compare")}
    assert after["kv"]["traces"] != start["traces"] and after["kv"]["title"] != start["title"]
    assert not any("no vLLM statistics" in a for a in after["kv"]["annotations"])
    assert other in after["timeline"]["title"] and after["timeline"]["ytitle"] == "GiB used (device)"
    assert any(a.startswith("emulated card") for a in after["timeline"]["annotations"])
    assert "kv_pool" in after["compare"]["xticks"]

    series = Select(control(browser, "rlkit-sweep-panel", "widget-dropdown", "vLLM series").find_element(
        By.TAG_NAME, "select"))
    series.select_by_visible_text("running requests")
    _wait(browser, lambda d: drawn(d, "rlkit-sweep-kv")["ytitle"] == "running requests", timeout=60)
    shot(browser, "rlkit-sweep-panel", "06_sweep_explorer_case.png")
    shut_down(browser)


# --- 07: the learning explorer over the committed runs ------------------------------------------------------------

def test_07_learning_explorer_through_too_few_steps(lab, browser):
    open_and_run(browser, lab, "07_does_it_learn")
    start = drawn(browser, "rlkit-learning-curve")
    assert start["traces"] and start["ytitle"] == "reward" and start["xtitle"] == "step"
    verdict = text_of(browser, "rlkit-learning-verdict")
    shot(browser, "rlkit-learning-panel", "07_learning_explorer.png")

    Select(control(browser, "rlkit-learning-panel", "widget-dropdown", "curve").find_element(
        By.TAG_NAME, "select")).select_by_visible_text("entropy")
    _wait(browser, lambda d: drawn(d, "rlkit-learning-curve")["ytitle"] == "entropy", timeout=60)
    entropy = drawn(browser, "rlkit-learning-curve")
    assert entropy["traces"] != start["traces"] and "entropy" in entropy["title"]

    steps = control(browser, "rlkit-learning-panel", "widget-slider", "steps read")
    drag(browser, steps, to_end(steps, -1))  # to 2 steps: fewer than the window needs
    _wait(browser, lambda d: any("needs at least" in a for a in drawn(d, "rlkit-learning-curve")["annotations"]),
          timeout=60)
    short = drawn(browser, "rlkit-learning-curve")
    assert not short["traces"] and not short["xticks"] and "needs at least" in text_of(browser, "rlkit-learning-verdict")

    drag(browser, steps, to_end(steps, +1))  # back to every step
    _wait(browser, lambda d: drawn(d, "rlkit-learning-curve")["traces"], timeout=60)
    time.sleep(1.0)
    back = drawn(browser, "rlkit-learning-curve")
    shot(browser, "rlkit-learning-panel", "07_learning_explorer_entropy.png")
    assert not back["annotations"], back["annotations"]
    assert back["xticks"] and back["ytitle"] == "entropy" and back["xtitle"] == "step"
    assert text_of(browser, "rlkit-learning-verdict") == verdict  # every step read again: the experiment's verdict
    shut_down(browser)
