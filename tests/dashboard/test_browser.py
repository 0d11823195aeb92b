"""End to end in a real browser: headless Chromium (the system's /usr/bin/chromium, driven by
Playwright; no browser download) against ``skiplock dashboard`` served by uvicorn on 127.0.0.1, on
the test database, with a real worker. Log in, filter jobs, open one, bulk-retry the failed ones
and see them done, pause a queue, watch a running job appear and finish (the live refresh, no
reload); a screenshot of each page in tests/dashboard/artifacts/ (gitignored); an accessibility
smoke check (every field labelled, keyboard focus reaches the actions).

Chromium: ``apt-get install -y chromium`` (done here when root and it is missing)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest

import browser_app
from private_servers import apt_install
from support import wait_for

ARTIFACTS = Path(__file__).with_name("artifacts")
CHROMIUM = "/usr/bin/chromium"
TOKEN = "browser-operator-token-0123456789"


def chromium() -> str:
    found = apt_install("chromium", f"the browser tests need Chromium at {CHROMIUM}: apt-get install -y chromium",
                        lambda: CHROMIUM if os.path.exists(CHROMIUM) else None)
    return found


@pytest.fixture(scope="module")  # not session: a running sync_playwright leaves an event loop running in the main thread, which breaks every later asyncio.run()
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        yield b
        b.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served(dsn: str) -> Iterator[str]:
    """``skiplock dashboard`` (the real command, uvicorn) on 127.0.0.1 over the test database."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_")}
    env.update(SKIPLOCK_DSN=dsn, SKIPLOCK_DASHBOARD_OPERATOR_TOKEN=TOKEN, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "skiplock", "--quiet", "dashboard", "--port", str(port),
                             "--poll", "1", "--app", "browser_app:app"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the dashboard exited: {proc.stderr.read()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            return False

    try:
        wait_for(up, 30, "the dashboard to listen")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
        assert TOKEN not in err  # a configured token is never printed or logged


@pytest.fixture
def app(dsn: str) -> Iterator[object]:
    a = browser_app.app
    a.close()
    a.configure(dsn=dsn)  # the test's database (configure works on an app not connected)
    yield a
    a.close()


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def unlabelled_fields(page) -> list[str]:
    """Visible inputs and selects with neither a <label for> nor an aria-label."""
    return page.evaluate("""() => Array.from(document.querySelectorAll('input, select, textarea'))
        .filter(e => e.type !== 'hidden')
        .filter(e => !(e.id && document.querySelector('label[for="' + e.id + '"]')) && !e.getAttribute('aria-label'))
        .map(e => e.outerHTML)""")


LOW_CONTRAST = """() => {
  const lum = (c) => { const [r, g, b] = c.map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
                       return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  const rgba = (s) => (s.match(/[\\d.]+/g) || []).map(Number);
  const background = (e) => { for (; e; e = e.parentElement) { const c = rgba(getComputedStyle(e).backgroundColor);
                               if (c.length === 3 || c[3] > 0) return c.slice(0, 3); } return [255, 255, 255]; };
  const out = [];
  for (const e of document.querySelectorAll('body *')) {
    if (![...e.childNodes].some(n => n.nodeType === 3 && n.textContent.trim())) continue;
    const style = getComputedStyle(e);
    if (style.visibility === 'hidden' || style.display === 'none' || e.getClientRects().length === 0) continue;
    const fg = lum(rgba(style.color).slice(0, 3)), bg = lum(background(e));
    const ratio = (Math.max(fg, bg) + 0.05) / (Math.min(fg, bg) + 0.05);
    const large = parseFloat(style.fontSize) >= 24 || (parseFloat(style.fontSize) >= 18.66 && parseInt(style.fontWeight) >= 700);
    if (ratio < (large ? 3 : 4.5)) out.push(e.tagName + ' ' + ratio.toFixed(2) + ': ' + e.textContent.trim().slice(0, 40));
  }
  return out;
}"""


def tab_until(page, accessible_text: str, limit: int = 60) -> bool:
    """Press Tab until the focused element's text is ``accessible_text`` (or its aria-label)."""
    for _ in range(limit):
        page.keyboard.press("Tab")
        focused = page.evaluate("() => { const e = document.activeElement; "
                                "return (e.getAttribute('aria-label') || e.textContent || '').trim(); }")
        if focused == accessible_text:
            return True
    return False


def test_operator_journey(browser, served, app, tmp_path):
    flag, hold = tmp_path / "fail", tmp_path / "hold"
    flag.touch()
    failed = app.enqueue_many([("flaky", {"flag": str(flag), "n": n}) for n in range(3)])
    app.worker(concurrency=1).run(stop_when_empty=True)
    assert all(app.get_job(i).state == "failed" for i in failed)

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    worker = app.worker(concurrency=2, poll_interval=0.1)
    thread = threading.Thread(target=worker.run, daemon=True)
    try:
        # log in: an unauthenticated page redirects to the login form
        page.goto(served + "/jobs")
        assert "/login" in page.url
        assert not unlabelled_fields(page)
        shot(page, "login")
        page.get_by_label("Access token").fill(TOKEN)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(served + "/jobs")

        # filter the jobs
        page.get_by_label("State").select_option("failed")
        page.get_by_label("Task").fill("flaky")
        page.get_by_role("button", name="Filter").click()
        page.wait_for_url("**/jobs?state=failed*")
        assert page.locator("table.jobs tbody tr").count() == 3
        assert not unlabelled_fields(page)
        assert not page.evaluate(LOW_CONTRAST)
        shot(page, "jobs")

        # open a job
        page.get_by_role("link", name=str(failed[0]), exact=True).click()
        page.wait_for_url(f"{served}/jobs/{failed[0]}")
        assert "ValueError: flaky 0" in page.content()
        shot(page, "job")
        page.go_back()

        # bulk retry: the confirmation says how many, then a worker runs them to done
        page.get_by_role("button", name="Retry all matching…").click()
        assert page.locator("#confirm-count strong").inner_text() == "3"
        shot(page, "confirm")
        flag.unlink()
        thread.start()
        page.get_by_role("button", name="Yes, retry 3 job(s)").click()
        wait_for(lambda: all(app.get_job(i).state == "done" for i in failed), 60, "the retried jobs to finish")
        page.goto(served + "/jobs?state=done&task=flaky")
        assert page.locator("table.jobs tbody tr").count() == 3

        # pause a queue (and resume it), keyboard only
        page.goto(served + "/queues")
        assert tab_until(page, "Pause queue default"), "keyboard focus never reached the pause button"
        page.keyboard.press("Enter")
        page.wait_for_url("**/queues?message=*")
        assert page.locator("#paused-default").inner_text() == "paused"
        shot(page, "queues")
        page.get_by_role("button", name="Resume queue default").click()
        page.wait_for_url("**/queues?message=*")
        assert page.locator("#paused-default").inner_text() == "no"

        # watch a running job appear and finish, without reloading the page
        page.goto(served + "/running")
        hold.touch()
        running = app.enqueue("slow", {"hold": str(hold)})
        link = page.get_by_role("link", name=str(running), exact=True)
        link.wait_for(timeout=30_000)
        assert "transaction" in page.locator("table.running").inner_text()
        shot(page, "running")
        hold.unlink()
        link.wait_for(state="detached", timeout=30_000)
        assert app.get_job(running).state == "done"
        # by server-sent events (GET /events/running), not by the polling fallback
        assert page.locator("[data-live]").get_attribute("data-mode") == "events"

        for name, path in [("overview", "/"), ("workers", "/workers"), ("cron", "/cron"), ("outbox", "/outbox"),
                           ("audit", "/audit")]:
            page.goto(served + path)
            assert not unlabelled_fields(page), path
            assert not page.evaluate(LOW_CONTRAST), path  # WCAG AA: 4.5:1 (3:1 for large text)
            shot(page, name)
        audit = page.locator("table.audit").inner_text()
        assert "bulk retry" in audit and "pause" in audit
        page.goto(served + "/cron")
        assert "nightly_report" in page.content()
    finally:
        worker.stop()
        if thread.is_alive():
            thread.join(30)
        context.close()
