"""Browser tier: JupyterLab in a real (headless) Chromium runs notebook 00, a slider is moved, the explorer redraws.

A JupyterLab server on 127.0.0.1 (a free port, token auth, the project's ``python3`` kernel: this interpreter)
serves a scratch copy of ``nbs/00_phase_budget.ipynb``; Debian's Chromium (``/usr/bin/chromium``) driven by
selenium through Debian's ``/usr/bin/chromedriver`` (given to selenium's Service, so selenium-manager never
runs and nothing is downloaded) opens it, runs every cell, drags the ``gpu_memory_utilization`` slider, and
reads the DOM: the verdict widget's text and the plotly bars' SVG paths must change. Screenshots before and
after go to ``outputs/ui/``. Setup on a fresh Debian machine: ``scripts/ci_browser_setup.sh``; run it alone
with ``pytest -m browser tests/test_browser.py``.
"""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from rlkit.env import REPO_ROOT

pytestmark = pytest.mark.browser

CHROMIUM = Path(os.environ.get("RLKIT_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("RLKIT_CHROMEDRIVER", "/usr/bin/chromedriver"))
NOTEBOOK = REPO_ROOT / "nbs" / "00_phase_budget.ipynb"
SHOTS = REPO_ROOT / "outputs" / "ui"
WAIT_S = 150  # the whole notebook runs in well under a minute on 2 busy cores

if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
    pytest.skip(f"browser tier: {CHROMIUM} and {CHROMEDRIVER} are needed (Debian: scripts/ci_browser_setup.sh "
                f"installs chromium and chromium-driver)", allow_module_level=True)
selenium = pytest.importorskip("selenium", reason="browser tier: pip install -e .[dev] (selenium)")

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on localhost over a scratch folder holding a copy of notebook 00."""
    root = tmp_path_factory.mktemp("lab")
    shutil.copy(NOTEBOOK, root / NOTEBOOK.name)
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(root / ".config"), "JUPYTER_RUNTIME_DIR": str(root / ".runtime"),
           "RLKIT_OUT_DIR": str(root / "out"),  # the notebook's metrics.json goes here, not into outputs/
           "RLKIT_STATIC_FIGURES": "0"}  # the live explorer is under test; PNGs for saved copies are tested elsewhere
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


@pytest.fixture(scope="module")
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


def _bars(driver) -> list[str]:
    """The plotly bar shapes of the explorer's figure: every bar's SVG path."""
    return [p.get_attribute("d") for p in
            driver.find_elements(By.CSS_SELECTOR, ".rlkit-budget-bars .main-svg g.trace.bars g.point path")]


def _verdict(driver) -> str:
    found = driver.find_elements(By.CSS_SELECTOR, ".rlkit-budget-verdict")
    return found[0].text.strip() if found else ""


def _shot(driver, name: str) -> Path:
    """A screenshot of the explorer's cell (its controls, verdict and figure) into outputs/ui/."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    panel = driver.find_element(By.CSS_SELECTOR, ".rlkit-budget-panel")
    cell = panel.find_element(By.XPATH, "./ancestor::div[contains(@class, 'jp-Cell')][1]")
    driver.execute_script("arguments[0].scrollIntoView({block: 'start'});", cell)
    time.sleep(0.5)
    path = SHOTS / name
    if not cell.screenshot(str(path)):
        driver.save_screenshot(str(path))
    return path


def test_explorer_redraws_in_jupyterlab(lab, browser):
    browser.get(f"{lab['url']}/lab/tree/{NOTEBOOK.name}?token={lab['token']}")
    # the app is up and the notebook's kernel is idle
    _wait(browser, lambda d: d.execute_script(
        "const a = window.jupyterapp; const w = a && a.shell.currentWidget;"
        "return !!(w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel"
        " && w.sessionContext.session.kernel.status === 'idle');"))
    browser.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells');")
    _wait(browser, lambda d: _verdict(d) and _bars(d))
    # every cell ran: the last code cell (the cost table) has an output and no cell failed
    _wait(browser, lambda d: d.execute_script(
        "const code = window.jupyterapp.shell.currentWidget.content.widgets.filter(c => c.model.type === 'code');"
        "return code.every(c => c.model.executionCount !== null) && code[code.length - 1].model.outputs.length > 0;"))
    errors = browser.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    tracebacks = [e.text for e in errors if "Traceback" in e.text or "Error" in e.text.split("\n")[0]]
    assert not tracebacks, tracebacks[:1]
    time.sleep(1.0)  # let plotly finish its first draw
    before_verdict, before_bars = _verdict(browser), _bars(browser)
    bars_element = browser.find_element(By.CSS_SELECTOR, ".rlkit-budget-bars")
    _shot(browser, "00_explorer_before.png")

    # drag the gpu_memory_utilization slider's handle to the left (a real pointer drag; the value is sent on release)
    slider = browser.find_element(
        By.XPATH, "//div[contains(@class,'rlkit-budget-panel')]//div[contains(@class,'widget-slider')]"
                  "[.//label[normalize-space()='gpu_memory_utilization']]")
    readout = slider.find_element(By.CSS_SELECTOR, ".widget-readout")
    start_value = readout.text
    handle = slider.find_element(By.CSS_SELECTOR, ".noUi-handle")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", handle)
    ActionChains(browser).click_and_hold(handle).move_by_offset(-8, 0).pause(0.2).move_by_offset(-8, 0) \
        .release().perform()
    _wait(browser, lambda d: readout.text != start_value, timeout=20)
    _wait(browser, lambda d: _verdict(d) != before_verdict and _bars(d) and _bars(d) != before_bars, timeout=60)
    time.sleep(1.0)
    after_verdict, after_bars = _verdict(browser), _bars(browser)
    _shot(browser, "00_explorer_after.png")

    assert float(readout.text) < float(start_value)
    assert after_verdict != before_verdict, "the verdict did not change"
    assert after_bars != before_bars, "the bars were not redrawn"
    assert browser.find_element(By.CSS_SELECTOR, ".rlkit-budget-bars") == bars_element  # redrawn in place
    assert (SHOTS / "00_explorer_before.png").stat().st_size > 10_000
    assert (SHOTS / "00_explorer_after.png").stat().st_size > 10_000
