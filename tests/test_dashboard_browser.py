"""The dashboard in a real headless Chromium (Debian's ``chromium``, driven
by Playwright for Python; no browser is downloaded): screenshots of the
front page and a job page at 1400 px and 420 px wide, kept as test
artefacts, and what the DOM shows: a strip per job, a failing job marked
failing, the filter form narrowing the list (a plain GET form: the pages
have no script), and nothing wider than a phone's screen at 420 px.

Artefacts go to ``$CRONWARDEN_ARTIFACTS`` (made if missing) or the test's
tmp path; their paths are printed."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import unavailable
from cronwarden.clock import FakeClock
from cronwarden.monitor import Monitor
from cronwarden.stores import open_store
from cronwarden.web import Dashboard, bind, url_of
from fleet import ADHOC, BACKUP, EXPORT, PLAINFAIL, STEADY, fleet

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (os.access(CHROMIUM, os.X_OK) or shutil.which("chromium")):
        unavailable("chromium is not installed (apt-get install chromium; .ci/apt-packages lists it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("playwright is not installed (pip install -e '.[dev]')")
    executable = CHROMIUM if os.access(CHROMIUM, os.X_OK) else str(shutil.which("chromium"))
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The fleet's dashboard, served on loopback from a thread."""
    clock = FakeClock()
    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('browser') / 'cw.db'}", clock=clock)
    fleet(store, clock)
    server = bind(Dashboard(Monitor(store, clock=clock), refresh=0), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield url_of(server)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
        store.close()


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    named = os.environ.get("CRONWARDEN_ARTIFACTS")
    where = Path(named) / "dashboard" if named else tmp_path_factory.mktemp("screenshots")
    where.mkdir(parents=True, exist_ok=True)
    return where


def open_page(browser: Any, url: str, width: int) -> Any:
    page = browser.new_page(viewport={"width": width, "height": 900}, java_script_enabled=True)
    response = page.goto(url)
    assert response is not None and response.status == 200, url
    return page


def shoot(page: Any, artefacts: Path, name: str) -> Path:
    path = artefacts / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 1000
    print(f"screenshot: {path}")
    return path


def listed(page: Any) -> list[str]:
    """The jobs in the front page's jobs table, in order."""
    return list(
        page.eval_on_selector_all("tr:has(td .strip) td:first-child a", "els => els.map(e => e.textContent)")
    )


def overflow(page: Any) -> tuple[int, int]:
    return tuple(page.evaluate("[document.scrollingElement.scrollWidth, window.innerWidth]"))  # type: ignore[return-value]


@pytest.mark.parametrize("width", [1400, 420])
def test_front_page_in_chromium(browser: Any, site: str, artefacts: Path, width: int) -> None:
    page = open_page(browser, site, width)
    try:
        shoot(page, artefacts, f"front-{width}")
        jobs = listed(page)
        assert sorted(jobs) == sorted((BACKUP, PLAINFAIL, EXPORT, ADHOC, *STEADY))
        # A strip per job, with its cells drawn (a box of some width, not an empty span).
        strips = page.eval_on_selector_all(
            "td .strip", "els => els.map(e => [e.children.length, e.getBoundingClientRect().width])"
        )
        assert len(strips) == len(jobs) and all(n == 20 and w >= 100 for n, w in strips), strips
        row = page.locator("tr", has=page.locator(f"a[href='/jobs/{PLAINFAIL}']")).first
        assert row.locator(".badge.failing").inner_text() == "failing"
        assert row.locator(".strip i").last.get_attribute("class") == "bad"
        colour = row.locator(".strip i").last.evaluate("e => getComputedStyle(e).backgroundColor")
        assert colour == "rgb(217, 83, 79)"  # red, not green
        if width == 420:
            scroll, inner = overflow(page)
            assert scroll <= inner, f"the front page is {scroll} px wide in a {inner} px window"
    finally:
        page.close()


def test_filters_narrow_the_list_in_chromium(browser: Any, site: str, artefacts: Path) -> None:
    page = open_page(browser, site, 1400)
    try:
        page.fill("input[name=q]", "report-")
        page.click("form.filters button[type=submit]")
        page.wait_for_url("**/?*q=report-*")
        assert sorted(listed(page)) == sorted(STEADY)
        page.select_option("select[name=verdict]", "failing")
        page.fill("input[name=q]", "")
        page.click("form.filters button[type=submit]")
        page.wait_for_url("**/?*verdict=failing*")
        assert listed(page) == [PLAINFAIL]
        shoot(page, artefacts, "front-filtered-failing")
    finally:
        page.close()


@pytest.mark.parametrize("width", [1400, 420])
def test_job_page_in_chromium(browser: Any, site: str, artefacts: Path, width: int) -> None:
    page = open_page(browser, f"{site}jobs/{BACKUP}", width)
    try:
        shoot(page, artefacts, f"job-{BACKUP}-{width}")
        chart = page.locator("svg.chart")
        assert chart.count() == 1
        box = chart.bounding_box()
        assert box is not None and box["width"] > 300
        assert page.locator("svg.chart rect.run").count() >= 18
        assert page.locator("svg.chart .mark.missed").count() == 2
        if width == 420:
            scroll, inner = overflow(page)
            assert scroll <= inner, f"the job page is {scroll} px wide in a {inner} px window"
    finally:
        page.close()
