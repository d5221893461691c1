"""``celery redislock web`` over HTTP, and its page in a real headless Chromium.

The command runs as a subprocess (``celery -A tests.celery_app redislock
web --port 0``) against a redis-server of its own started with
``--requirepass``: the app's lock store URL carries the password, and no
answer, header or line of output may.  Holds are taken with a task run's
owner prefix, so the page names their task, worker and pid; their leases are
not renewed, so they count down.  The browser tests skip where Debian's
chromium, chromedriver or selenium is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from email.message import Message
from pathlib import Path
from typing import Any, Optional
from urllib.error import HTTPError

import pytest
import redis

from celery_redislock import Lock
from celery_redislock.exceptions import LockNotOwned
from celery_redislock.inspect import Inspector
from celery_redislock.tasks.owners import owner_prefix
from tests.helpers import wait_until
from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "web-view-s3cret-pw"
XSS = "<img src=x onerror=alert(1)>"


class WebCommand:
    """A running ``celery redislock web``: its URL, release token and output."""

    def __init__(self, store: RedisServer, *args: str) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "REDISLOCK_TEST_REDIS": f"redis://:{PASSWORD}@127.0.0.1:{store.port}",
        }
        command = ["celery", "-A", "tests.celery_app", "redislock", "web", "--port", "0", *args]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *command],
            cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        first = wait_until(lambda: self._line("web view of"), 60, what="the web view to start")
        self.url = first.rsplit(" ", 1)[1]
        opened = None
        if "--allow-release" in args:
            opened = wait_until(lambda: self._line("open http"), 10, what="the token")
        self.token_url = None if opened is None else opened.split(" ", 1)[1]
        self.token = None if opened is None else opened.rsplit("#token=", 1)[1]
        self.port = int(self.url.rstrip("/").rsplit(":", 1)[1])

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def _line(self, start: str) -> Optional[str]:
        return next((line for line in self.lines if line.startswith(start)), None)

    def output(self) -> str:
        return "\n".join(self.lines)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture(scope="module")
def store() -> Iterator[RedisServer]:
    """A redis-server that wants a password."""
    server = RedisServer(extra=["--requirepass", PASSWORD])
    server.ping_options = {"password": PASSWORD}
    server.start()
    yield server
    server.stop()


@pytest.fixture
def client(store: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis(host="127.0.0.1", port=store.port, password=PASSWORD)
    c.flushdb()
    yield c
    c.close()


@pytest.fixture(scope="module")
def web(store: RedisServer) -> Iterator[WebCommand]:
    """The web view with releasing allowed."""
    started = WebCommand(store, "--allow-release")
    yield started
    started.stop()


@pytest.fixture(scope="module")
def read_only(store: RedisServer) -> Iterator[WebCommand]:
    """The web view as started without options: read-only, on 127.0.0.1."""
    started = WebCommand(store)
    yield started
    started.stop()


def hold(client: redis.Redis, name: str, task: str = "t.sync", task_id: str = "task-1") -> Lock:
    """``name`` held as a task run on worker w1@host, pid 4242 would, unrenewed."""
    lock = Lock(
        client, name, ttl=30.0, renew=False, owner=owner_prefix(task_id, "w1@host", 4242, task)
    )
    assert lock.acquire(blocking=False)
    return lock


def call(
    url: str, method: str = "GET", body: Optional[bytes] = None, headers: Optional[dict] = None
) -> tuple[int, Message, bytes]:
    """(status, headers, body) of one request; an error status is an answer too."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except HTTPError as exc:
        with exc:
            return exc.code, exc.headers, exc.read()


def entries(web: WebCommand) -> dict[str, Any]:
    status, headers, body = call(f"{web.url}api/entries")
    assert status == 200, body
    assert headers["Content-Type"] == "application/json; charset=utf-8"
    return json.loads(body)


def release_headers(web: WebCommand) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "Authorization": f"Bearer {web.token}",
        "X-Redislock": "release",
    }


def post_release(web: WebCommand, name: str, headers: dict[str, str]) -> tuple[int, Any]:
    body = json.dumps({"kind": "lock", "name": name}).encode()
    status, _, answer = call(f"{web.url}api/release", "POST", body, headers)
    return status, json.loads(answer)


def holders(client: redis.Redis, name: str) -> list[str]:
    return [h.token for e in Inspector(client).show(name) for h in e.holders]


# -- HTTP ----------------------------------------------------------------------


def test_the_json_lists_a_held_lock_with_its_holder(
    web: WebCommand, client: redis.Redis, store: RedisServer
) -> None:
    lock = hold(client, "sync-42")
    data = entries(web)
    [entry] = [e for e in data["entries"] if e["name"] == "sync-42"]
    [holder] = entry["holders"]
    assert entry["kind"] == "lock"
    assert holder["task_name"] == "t.sync"
    assert holder["task_id"] == "task-1"
    assert (holder["hostname"], holder["pid"]) == ("w1@host", 4242)
    assert holder["fence"] == lock.fence
    assert 25_000 < holder["ttl_ms"] <= 30_000
    assert data["stats"]["holders"] == 1
    assert data["release"] is True
    assert data["store"] == f"redis://127.0.0.1:{store.port}/0"


def test_a_release_without_the_token_is_refused(web: WebCommand, client: redis.Redis) -> None:
    lock = hold(client, "sync-42")
    no_token = release_headers(web)
    del no_token["Authorization"]
    assert post_release(web, "sync-42", no_token)[0] == 403
    wrong = {**release_headers(web), "Authorization": f"Bearer {web.token}x"}
    status, answer = post_release(web, "sync-42", wrong)
    assert status == 403
    assert "token" in answer["error"]
    assert holders(client, "sync-42") == [lock.token]


@pytest.mark.parametrize(
    ("change", "status"),
    [
        ({"X-Redislock": None}, 403),  # the custom header left out
        ({"X-Redislock": "yes"}, 403),
        ({"Content-Type": "text/plain"}, 415),  # what a cross-site form can send
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
        ({"Origin": "http://evil.example"}, 403),
        ({"Origin": "null"}, 403),
        ({"Sec-Fetch-Site": "cross-site"}, 403),
        ({"Host": "evil.example"}, 403),  # a rebound DNS name, pointing at 127.0.0.1
    ],
)
def test_a_release_with_the_token_but_not_as_the_page_sends_it_is_refused(
    web: WebCommand, client: redis.Redis, change: dict[str, Optional[str]], status: int
) -> None:
    lock = hold(client, "sync-42")
    headers = {**release_headers(web), **change}
    sent = {k: v for k, v in headers.items() if v is not None}
    assert post_release(web, "sync-42", sent)[0] == status
    assert holders(client, "sync-42") == [lock.token]


def test_a_release_with_the_token_and_the_header_frees_it_and_raises_the_fence(
    web: WebCommand, client: redis.Redis
) -> None:
    lock = hold(client, "sync-42")
    other = hold(client, "sync-43")
    # As a browser sends it from the page: same origin, same site.
    headers = {
        **release_headers(web),
        "Origin": f"http://127.0.0.1:{web.port}",
        "Sec-Fetch-Site": "same-origin",
    }
    status, answer = post_release(web, "sync-42", headers)
    assert status == 200, answer
    [released] = answer["released"]
    assert [h["token"] for h in released["freed"]] == [lock.token]
    assert lock.fence is not None
    assert released["fence"] > lock.fence
    assert holders(client, "sync-42") == []
    assert int(client.get(lock.keys.fence) or 0) == released["fence"]
    with pytest.raises(LockNotOwned):
        lock.release()
    assert holders(client, "sync-43") == [other.token]  # (only the name asked for)


def test_read_only_has_no_release(read_only: WebCommand, client: redis.Redis) -> None:
    lock = hold(client, "sync-42")
    assert read_only.token is None
    assert "read-only" in read_only.output()
    assert "token" not in read_only.output()
    assert entries(read_only)["release"] is False
    headers = {"Content-Type": "application/json", "X-Redislock": "release"}
    for token in ("", "None", "null"):
        status, _ = post_release(
            read_only, "sync-42", {**headers, "Authorization": f"Bearer {token}"}
        )
        assert status == 404
    assert holders(client, "sync-42") == [lock.token]


def test_it_binds_to_127_0_0_1_by_default(read_only: WebCommand) -> None:
    assert read_only.url == f"http://127.0.0.1:{read_only.port}/"
    with socket.create_connection(("127.0.0.1", read_only.port), timeout=5):
        pass
    # Another loopback address reaches a listener bound to it...
    with socket.socket() as control:
        control.bind(("127.0.0.2", 0))
        control.listen()
        with socket.create_connection(control.getsockname(), timeout=5):
            pass
    # ...but not the web view, listening on 127.0.0.1 alone.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", read_only.port), timeout=5).close()


def test_the_store_password_appears_in_no_answer_and_no_output(
    web: WebCommand, read_only: WebCommand, client: redis.Redis
) -> None:
    hold(client, "sync-42")
    hold(client, "sync-43")
    seen = []
    for server in (web, read_only):
        for path in ("", "app.js", "app.css", "api/entries", "api/entries?kind=x", "nope"):
            seen.append(call(f"{server.url}{path}"))
        body = json.dumps({"kind": "lock", "name": "sync-43"}).encode()
        seen.append(call(f"{server.url}api/release", "POST", body, {}))  # (a form's type)
        seen.append(call(f"{server.url}api/release", "POST", body, release_headers(web)))
    statuses = [status for status, _, _ in seen]
    assert statuses == [200] * 4 + [400, 404, 415, 200] + [200] * 4 + [400, 404, 404, 404]
    # (The store was reached: the password is in the app's configuration.)
    assert b"sync-42" in seen[3][2]
    for _status, headers, body in seen:
        assert PASSWORD.encode() not in body
        assert PASSWORD not in str(headers)
    for server in (web, read_only):
        assert PASSWORD not in server.output()
        assert "lock store redis://127.0.0.1:" in server.output()


def test_the_page_allows_no_inline_script(web: WebCommand) -> None:
    status, headers, page = call(web.url)
    assert status == 200
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    policy = headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy
    assert "unsafe-inline" not in policy
    assert "default-src 'none'" in policy
    assert headers["X-Content-Type-Options"] == "nosniff"
    # The page's one script is a file of its own.
    assert re.findall(rb"<script[^>]*>", page) == [b'<script src="app.js" defer>']
    assert b'<script src="app.js" defer></script>' in page
    assert re.search(rb"\son[a-z]+=", page) is None  # (no inline handlers either)
    status, headers, script = call(f"{web.url}app.js")
    assert headers["Content-Type"] == "text/javascript; charset=utf-8"
    assert b"innerHTML" not in script
    assert b"textContent" in script


# -- the page, in Chromium -------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium driven by chromedriver (Debian's packages)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip(
            "chromium and chromedriver are not installed (apt-get install chromium chromium-driver)"
        )
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (the test extra has it)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument("--window-size=1280,720")
    # An alert the page should never show stays up, for the test to find.
    options.unhandled_prompt_behavior = "ignore"
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # (A driver path given: selenium runs it, and downloads nothing.  Its
    # log file is ours to close: selenium 4.11 leaks the one it opens.)
    with open(os.devnull, "wb") as log:
        service = Service(executable_path=driver, log_output=log)
        chrome = webdriver.Chrome(service=service, options=options)
        yield chrome
        chrome.quit()


def row_of(browser: Any, name: str) -> Any:
    """The first table row whose name cell reads ``name``, or None."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        for row in browser.find_elements(By.CSS_SELECTOR, "#rows tr"):
            if row.find_element(By.CSS_SELECTOR, "td.name").text == name:
                return row
    except StaleElementReferenceException:
        pass
    return None


def cell(row: Any, column: str) -> str:
    from selenium.webdriver.common.by import By

    return str(row.find_element(By.CSS_SELECTOR, f"td.{column}").text)


def seconds(lease: str) -> float:
    assert lease.endswith(" s"), lease
    return float(lease[:-2])


def no_alert(browser: Any) -> bool:
    from selenium.common.exceptions import NoAlertPresentException

    try:
        browser.switch_to.alert  # noqa: B018
    except NoAlertPresentException:
        return True
    return False


def errors_logged(browser: Any) -> list[dict[str, Any]]:
    return [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


@pytest.mark.slow
def test_the_page_lists_holds_counts_leases_down_and_shows_names_as_text(
    browser: Any, web: WebCommand, client: redis.Redis
) -> None:
    from selenium.webdriver.common.by import By

    lock = hold(client, "sync-42")
    hold(client, XSS, task="t.evil", task_id="task-2")
    browser.get(web.token_url)
    row = wait_until(lambda: row_of(browser, "sync-42"), 20, what="the lock's row")
    assert cell(row, "kind") == "lock"
    assert cell(row, "holder") == "t.sync[task-1]"
    assert cell(row, "host") == "w1@host"
    assert cell(row, "pid") == "4242"
    assert cell(row, "fence") == str(lock.fence)
    # The token left the address bar for the page's memory.
    assert "token" not in browser.current_url
    assert browser.find_element(By.ID, "token").get_attribute("value") == web.token

    # The lease counts down smoothly: a read a second would show two values
    # in a second, at most; the page counts down every 100 ms between reads.
    leases = []
    for _ in range(8):
        leases.append(seconds(cell(wait_until(lambda: row_of(browser, "sync-42")), "lease")))
        time.sleep(0.12)
    assert leases == sorted(leases, reverse=True)
    assert 25 < leases[-1] < leases[0] <= 30
    assert len(set(leases)) >= 5, leases

    # The name written as HTML runs nothing (the page has been filled a
    # few times by now), and is shown as text.
    assert no_alert(browser)
    assert browser.find_elements(By.TAG_NAME, "img") == []
    evil = wait_until(lambda: row_of(browser, XSS), 10, what="the row of the HTML name")
    assert cell(evil, "holder") == "t.evil[task-2]"
    assert errors_logged(browser) == []


@pytest.mark.slow
def test_a_release_from_the_page_asks_then_frees_the_hold(
    browser: Any, web: WebCommand, client: redis.Redis
) -> None:
    from selenium.webdriver.common.by import By

    lock = hold(client, "sync-44")
    browser.get(web.token_url)
    row = wait_until(lambda: row_of(browser, "sync-44"), 20, what="the lock's row")

    # Answered no: nothing is released.
    row.find_element(By.CSS_SELECTOR, "button").click()
    asked = wait_until(lambda: not no_alert(browser) and browser.switch_to.alert, 5)
    assert "sync-44" in asked.text
    assert "t.sync[task-1]" in asked.text
    asked.dismiss()
    time.sleep(1.2)
    assert holders(client, "sync-44") == [lock.token]

    # Answered yes: the hold is freed, the row goes, the fence is raised.
    wait_until(lambda: row_of(browser, "sync-44"), 5).find_element(By.TAG_NAME, "button").click()
    wait_until(lambda: not no_alert(browser) and browser.switch_to.alert, 5).accept()
    wait_until(lambda: row_of(browser, "sync-44") is None, 10, what="the row to go")
    assert holders(client, "sync-44") == []
    assert not client.exists(lock.keys.lock)
    fence = int(client.get(lock.keys.fence) or 0)
    assert lock.fence is not None and fence > lock.fence
    status = browser.find_element(By.ID, "status").text
    assert status.startswith("Released lock “sync-44” held by t.sync[task-1]")
    assert status.endswith(f"fence now {fence}.")
    assert errors_logged(browser) == []


@pytest.mark.slow
def test_the_read_only_page_offers_no_release(
    browser: Any, read_only: WebCommand, client: redis.Redis
) -> None:
    from selenium.webdriver.common.by import By

    hold(client, "sync-45")
    browser.get(read_only.url)
    wait_until(lambda: row_of(browser, "sync-45"), 20, what="the lock's row")
    assert [b for b in browser.find_elements(By.TAG_NAME, "button") if b.is_displayed()] == []
    assert not browser.find_element(By.ID, "token").is_displayed()
    assert errors_logged(browser) == []
