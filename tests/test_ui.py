"""The operator's page at ``/ui`` (docs/ui.md).

Served without a browser (the app itself): every file of ``werk_host/ui/static`` with its
content type and the security headers (a strict Content-Security-Policy, ``nosniff``, no
framing); no inline script, style or event handler in the HTML; no HTML sinks in the scripts;
unknown names, traversal attempts and other methods refused; the page needs no key, the data
routes it calls do.

In a real headless browser (Debian's ``chromium`` and ``chromium-driver``, driven by selenium;
installed by ``scripts/setup-browser.sh``), against one real ``werk serve`` with a real
llama-server and the generated tiny GGUF, shared by the module: an operator key signs in, sees
the instances, loads and unloads one and reads its log; a client key previews a prune of its
states, which removes nothing, then confirms it; a long prompt of the same key leaves a
prompt-cache entry, which the page pins and evicts, each previewed then confirmed; a playground
answer streams with its usage; the memory chart and the traffic table fill; a client key sees
no operator controls and gets 403 when it calls them anyway; a refused key is never in the URL. Each view is saved as a PNG
(into ``WERK_UI_SCREENSHOTS`` when set: ``docs/ui/`` holds the ones docs/ui.md shows). Without
the browser or llama-server those tests skip with the reason.
"""

from __future__ import annotations

import html.parser
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import falcon.testing
import pytest

from tests.browser_support import chromium
from werk_host.http.ui import CONTENT_TYPES
from werk_host.testing.api import Api
from werk_host.testing.hosts import serve_process

ROOT = Path(__file__).resolve().parents[1]
STATIC = resources.files("werk_host.ui").joinpath("static")
CLIENT = "sk-werk-ui-client-0123456789"
OPERATOR = "sk-werk-ui-operator-0123456789"
#: Generous bound on each wait for the page (never a pass/fail threshold on speed).
WAIT_S = 90


def _static_names() -> list[str]:
    return sorted(entry.name for entry in STATIC.iterdir() if entry.is_file())


# -- served without a browser ------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/ui", "/ui/"])
def test_the_page_carries_a_strict_content_security_policy(bare_client: falcon.testing.TestClient, path: str) -> None:
    result = bare_client.simulate_get(path, headers={"Authorization": ""})
    assert result.status_code == 200
    assert result.headers["content-type"] == "text/html; charset=utf-8"
    csp = result.headers["content-security-policy"]
    directives = dict(part.strip().split(" ", 1) for part in csp.split(";"))
    assert directives["default-src"] == "'self'"
    assert directives["script-src"] == "'self'" and directives["style-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'" and directives["object-src"] == "'none'"
    assert "unsafe" not in csp
    assert result.headers["x-content-type-options"] == "nosniff"
    assert result.headers["x-frame-options"] == "DENY"
    assert result.headers["referrer-policy"] == "no-referrer"
    assert result.content == STATIC.joinpath("index.html").read_bytes()


def test_every_static_file_is_served_with_its_content_type(bare_client: falcon.testing.TestClient) -> None:
    names = _static_names()
    assert {"index.html", "app.js", "api.js", "style.css"} <= set(names)
    for name in names:
        result = bare_client.simulate_get(f"/ui/{name}")
        assert result.status_code == 200, name
        assert result.headers["content-type"] == CONTENT_TYPES[Path(name).suffix], name
        assert result.headers["x-content-type-options"] == "nosniff"
        assert "content-security-policy" in result.headers
        assert result.content == STATIC.joinpath(name).read_bytes()
        head = bare_client.simulate_head(f"/ui/{name}")
        assert head.status_code == 200 and head.headers["content-type"] == result.headers["content-type"]


class _Markup(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[dict[str, str | None]] = []
        self.inline: list[str] = []
        self.in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = {name for name, _ in attrs}
        if tag == "style" or "style" in names or any(name.startswith("on") for name in names):
            self.inline.append(f"<{tag} {sorted(names)}>")
        if tag == "script":
            self.scripts.append(dict(attrs))
            self.in_script = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self.in_script = False

    def handle_data(self, data: str) -> None:
        if self.in_script and data.strip():
            self.inline.append(data)


def test_no_inline_script_style_or_handler_and_no_html_sinks() -> None:
    markup = _Markup()
    markup.feed(STATIC.joinpath("index.html").read_text())
    assert markup.inline == []
    assert markup.scripts == [{"type": "module", "src": "/ui/app.js"}]
    for name in _static_names():
        if not name.endswith(".js"):
            continue
        text = STATIC.joinpath(name).read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in text, (name, sink)
        # the key: this tab's sessionStorage only, never localStorage, a cookie or a URL
        assert "localStorage" not in text and "document.cookie" not in text, name
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", text), name  # no CDN, no other origin


@pytest.mark.parametrize(
    "path",
    [
        "/ui/missing.js",
        "/ui/..%2Fhttp%2Fui.py",
        "/ui/%2e%2e%2f%2e%2e%2fconfig.py",
        "/ui/../http/ui.py",
        "/ui/__init__.py",
        "/ui/static",
        "/ui/static/app.js",
        "/ui/app.js/",
        "/ui/.app.js",
        "/ui/index.html%00.js",
    ],
)
def test_unknown_names_and_traversal_are_404(bare_client: falcon.testing.TestClient, path: str) -> None:
    result = bare_client.simulate_get(path)
    assert result.status_code == 404, (path, result.status_code)
    assert b"import" not in result.content and b"def " not in result.content


def test_only_get_and_head(bare_client: falcon.testing.TestClient) -> None:
    assert bare_client.simulate_post("/ui", body=b"{}").status_code == 405
    assert bare_client.simulate_delete("/ui/app.js").status_code == 405


def test_the_page_needs_no_key_and_the_data_does(bare_host: Any) -> None:
    anonymous = falcon.testing.TestClient(bare_host.app)
    assert anonymous.simulate_get("/ui/app.js").status_code == 200
    assert anonymous.simulate_get("/werk/v1/deployments").status_code == 401
    assert anonymous.simulate_get("/metrics").status_code == 401


def test_the_wheel_carries_the_static_files() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "ui/static/*" in pyproject["tool"]["setuptools"]["package-data"]["werk_host"]


def _setup_browser(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = ROOT / "scripts" / "setup-browser.sh"
    return subprocess.run(
        [shutil.which("bash") or "/bin/bash", str(script)], capture_output=True, text=True, env=env, timeout=600
    )


def test_setup_browser_says_what_it_found_in_one_line() -> None:
    if shutil.which("chromium") is None or shutil.which("chromedriver") is None:
        pytest.skip("chromium is not installed here; this test does not install it")
    done = _setup_browser(dict(os.environ))
    assert done.returncode == 0 and done.stdout == ""
    assert done.stderr == "[browser] chromium and chromedriver are present\n"


def test_setup_browser_without_apt_changes_nothing_and_says_why(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "id").symlink_to(shutil.which("id") or "/usr/bin/id")
    done = _setup_browser({"PATH": str(bin_dir)})
    assert done.returncode == 0 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "no apt-get here; the browser tests will skip" in done.stderr


# -- in a real headless browser ---------------------------------------------------------------


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, llama_server: str) -> Iterator[str]:
    """One ``werk serve`` with two llama.cpp instances of the tiny GGUF: ``tiny`` (preloaded)
    and ``spare`` (cold); a client key and an operator key. Each request gets the model's
    trained context, 4,096 tokens (docs/deployments.md, "llama.cpp options"): room for the prompt-cache
    test's prompt of over 1,024 tokens."""
    binary = llama_server
    testmodel = pytest.importorskip("werk_llamacpp.testing.testmodel", reason="the llama.cpp plugin is not installed")
    base = tmp_path_factory.mktemp("ui")
    model = testmodel.generate_model(base / "tiny.gguf")
    profile = base / "deployments.toml"
    broken = base / "broken.gguf"  # a real GGUF header, then nothing: llama-server cannot load it
    broken.write_bytes(model.read_bytes()[:4096])
    profile.write_text(
        f'[[instance]]\nid = "tiny"\nmodel = "{model}"\npreload = true\ndefault = true\n\n'
        f'[[instance]]\nid = "spare"\nmodel = "{model}"\n\n'
        f'[[instance]]\nid = "broken"\nmodel = "{broken}"\nbackend = "llama.cpp"\n'
    )
    home = base / "home"
    home.mkdir(mode=0o700)
    env = {"WERK_LLAMA_SERVER": binary, "WERK_OPERATOR_API_KEYS": OPERATOR}
    with serve_process(home, "--profile", str(profile), keys=(CLIENT,), env=env, drop=("WERK_LLAMA_ARGS",)) as served:
        yield served.url


@pytest.fixture(scope="module")
def chrome() -> Iterator[Any]:
    """One headless chromium for the module (skips without it, with the reason)."""
    yield from chromium("--window-size=1360,900")


@pytest.fixture(scope="module")
def browser(chrome: Any, live: str) -> Any:
    """The module's chromium, once the live host with llama-server is up."""
    return chrome


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = os.environ.get("WERK_UI_SCREENSHOTS")
    path = Path(where) if where else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _wait(driver: Any, condition: Any, what: str) -> Any:
    """Wait for ``condition``; the polled views redraw, so an element found may be replaced."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    waiting = WebDriverWait(driver, WAIT_S, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,))
    return waiting.until(condition, message=what)


def _text(driver: Any, selector: str) -> str:
    """The rendered text of the first match, read in one step in the page (never stale)."""
    text = driver.execute_script(
        "const el = document.querySelector(arguments[0]); return el ? el.innerText : '';", selector
    )
    return str(text)


def _click(driver: Any, selector: str) -> None:
    from selenium.webdriver.common.by import By

    def clicked(d: Any) -> bool:
        found = d.find_elements(By.CSS_SELECTOR, selector)
        if not found:
            return False
        found[0].click()
        return True

    _wait(driver, clicked, f"{selector} clicked")


def _signed_out(driver: Any, url: str) -> None:
    """Forget the tab's key from a page of the same origin that runs none of the page's code."""
    driver.get(f"{url}/ui/favicon.svg")
    driver.execute_script("sessionStorage.clear()")


def _sign_in(driver: Any, url: str, key: str, view: str = "instances") -> None:
    from selenium.webdriver.common.by import By

    _signed_out(driver, url)
    driver.get(f"{url}/ui#{view}")
    _wait(driver, lambda d: d.find_element(By.ID, "key").is_displayed(), "the sign-in form")
    driver.find_element(By.ID, "key").send_keys(key)
    driver.find_element(By.ID, "signin-submit").click()
    _wait(driver, lambda d: d.find_element(By.ID, "who").text.endswith("key"), "signed in")
    _wait(driver, lambda d: d.find_element(By.ID, "view").get_attribute("data-view") == view, f"the {view} view")


def _state(driver: Any, instance: str) -> str:
    return _text(driver, f'td.state-cell[data-instance="{instance}"] .state')


def _samples(driver: Any) -> int:
    found = re.search(r"(\d+) samples", _text(driver, "#view .status"))
    return int(found.group(1)) if found else 0


def _no_page_errors(driver: Any, *expected: int) -> None:
    """No error in the page's console but refusals the test caused: the role probe's 403 for a
    client key, and the ``expected`` statuses. (``/favicon.ico`` is the browser's own request
    when :func:`_signed_out` shows the icon, not the page's.)"""
    allowed = "|".join(str(status) for status in (403, *expected))
    log = driver.get_log("browser")
    severe = [e for e in log if e["level"] == "SEVERE" and "/favicon.ico " not in e["message"]]
    assert all(re.search(rf" ({allowed}) ", e["message"]) for e in severe), severe


def test_an_operator_sees_the_instances_loads_and_unloads(browser: Any, live: str, shots: Path) -> None:
    from selenium.webdriver.common.by import By

    _sign_in(browser, live, OPERATOR)
    assert browser.find_element(By.ID, "who").text == "operator key"
    _wait(browser, lambda d: _state(d, "tiny") == "ready", "tiny ready")
    assert _state(browser, "spare") == "cold"
    row = _text(browser, 'tr[data-instance="tiny"]')
    assert "llama.cpp" in row and "forever" in row
    _click(browser, 'button[data-action="load"][data-instance="spare"]')
    _wait(browser, lambda d: _state(d, "spare") == "ready", "spare loaded by the operator")
    _click(browser, 'button[data-action="logs"][data-instance="spare"]')
    _wait(browser, lambda d: "ready in" in _text(d, "#instance-events"), "the log tail shows the load")
    assert browser.find_element(By.CSS_SELECTOR, 'tr[data-instance="spare"] td:nth-child(5)').text.isdigit()  # pid
    browser.save_screenshot(str(shots / "instances.png"))
    _click(browser, 'button[data-action="unload"][data-instance="spare"]')
    _wait(browser, lambda d: _state(d, "spare") == "cold", "spare unloaded by the operator")
    _wait(browser, lambda d: "unloaded" in _text(d, "#instance-events"), "the log tail shows the unload")
    _click(browser, 'button[data-action="load"][data-instance="broken"]')
    _wait(browser, lambda d: _state(d, "broken") == "failed", "the broken instance failed")
    reason = _text(browser, 'td.state-cell[data-instance="broken"] .reason')
    assert "failed to start instance broken" in reason and ".gguf" not in reason  # redacted: no path
    assert "refused" in _text(browser, "#instances-status")
    browser.save_screenshot(str(shots / "instances-failed.png"))
    assert browser.current_url == f"{live}/ui#instances"  # the key is in no URL
    _no_page_errors(browser, 503)  # the failed start's answer


def test_a_prune_is_previewed_then_confirmed(browser: Any, live: str, shots: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    api = Api(live, CLIENT)
    for text in ("a first state of this key", "a second state of this key"):
        body = {
            "model_id": "tiny",
            "input": {"type": "text", "text": text},
            "policy": {"mode": "disk"},
            "allow_experimental": True,
        }
        status, doc = api.post("/werk/v1/prefill", body)
        assert status == 200, doc
    ids = {s["id"] for s in api.get("/werk/v1/states")[1]["data"]["states"]}
    assert len(ids) == 2
    _sign_in(browser, live, CLIENT, "states")
    _wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "tr[data-state]")) == 2, "two states listed")
    first = sorted(ids)[0]
    _click(browser, f'button[data-action="pin"][data-state="{first}"]')
    _wait(browser, lambda d: f"pin {first} would change it" in _text(d, "#states-preview-text"), "the pin's dry run")
    assert not any(s["pinned"] for s in api.get("/werk/v1/states")[1]["data"]["states"])  # a preview changes nothing
    _click(browser, "#states-confirm")
    _wait(browser, lambda d: _text(d, f'tr[data-state="{first}"] td:nth-child(9)') == "yes", "the confirmed pin")
    Select(browser.find_element(By.ID, "states-prune-kind")).select_by_value("all")
    _click(browser, "#states-prune-preview")
    _wait(browser, lambda d: "2 state(s) match" in _text(d, "#states-preview-text"), "the dry-run preview")
    assert {s["id"] for s in api.get("/werk/v1/states")[1]["data"]["states"]} == ids  # a preview removes nothing
    browser.save_screenshot(str(shots / "states.png"))
    _click(browser, "#states-confirm")
    _wait(browser, lambda d: "Pruned: 2 of 2" in _text(d, "#states-preview-text"), "the confirmed prune")
    assert api.get("/werk/v1/states")[1]["data"]["states"] == []
    _wait(browser, lambda d: "no named states" in _text(d, "#states-table"), "the emptied list")
    _no_page_errors(browser)


#: About 1,300 tokens on the generated model (its vocabulary tokenises words): above the 1,024
#: tokens under which no prompt cache is saved (docs/prompt-cache.md, "What happens").
LONG_PROMPT = " ".join(f"box {i} holds {i * 7 % 13} red marbles and {i * 5 % 11} blue ones." for i in range(40))


def _entries(api: Api) -> list[dict[str, Any]]:
    status, doc = api.get("/werk/v1/prompt-caches")
    assert status == 200, doc
    return list(doc["data"]["entries"])


def test_a_prompt_cache_entry_is_pinned_then_evicted(browser: Any, live: str, shots: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    api = Api(live, CLIENT, timeout=120)
    question = {"role": "user", "content": f"{LONG_PROMPT}\n\nWhich box holds most?"}
    status, answer = api.post("/v1/chat/completions", {"model": "tiny", "messages": [question], "max_tokens": 4})
    assert status == 200, answer
    assert answer["usage"]["prompt_tokens"] >= 1024, answer["usage"]
    # saved after the answer, committed by a background thread (docs/prompt-cache.md): poll for it
    (entry,) = _wait(browser, lambda _: _entries(api), "the prompt-cache entry committed")
    assert (entry["instance"], entry["pinned"], entry["reusable"]) == ("tiny", False, True), entry
    eid = entry["id"]
    row = f'tr[data-entry="{eid}"]'
    _sign_in(browser, live, CLIENT, "states")
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, row), "the entry listed")
    cells = [cell.text for cell in browser.find_elements(By.CSS_SELECTOR, f"{row} td")]
    assert cells[0] == "tiny" and cells[2] == str(entry["prompt_tokens"]) and cells[6:8] == ["no", "yes"], cells
    browser.execute_script("document.getElementById('prompt-caches').scrollIntoView()")
    _click(browser, f'button[data-action="pin"][data-entry="{eid}"]')
    _wait(browser, lambda d: f"pin {eid} would change it" in _text(d, "#caches-preview-text"), "the pin's dry run")
    assert not _entries(api)[0]["pinned"]  # a preview changes nothing
    browser.save_screenshot(str(shots / "prompt-caches.png"))
    _click(browser, "#caches-confirm")
    _wait(browser, lambda d: _text(d, f"{row} td:nth-child(7)") == "yes", "the confirmed pin")
    assert _entries(api)[0]["pinned"]
    Select(browser.find_element(By.ID, "caches-prune-kind")).select_by_value("instance")
    browser.find_element(By.ID, "caches-prune-value").clear()
    browser.find_element(By.ID, "caches-prune-value").send_keys("tiny")
    _click(browser, "#caches-prune-preview")
    _wait(browser, lambda d: "matches 1 entry" in _text(d, "#caches-preview-text"), "the prune's dry run")
    _click(browser, "#caches-cancel")  # sends nothing
    assert _text(browser, "#caches-preview") == "" and len(_entries(api)) == 1
    _click(browser, f'button[data-action="evict"][data-entry="{eid}"]')
    _wait(browser, lambda d: f"evict {eid} would change it" in _text(d, "#caches-preview-text"), "the evict's dry run")
    assert [e["id"] for e in _entries(api)] == [eid]  # a preview removes nothing
    _click(browser, "#caches-confirm")
    _wait(browser, lambda d: "no prompt-cache entries" in _text(d, "#caches-table"), "the evicted entry gone")
    assert "evict" in _text(browser, "#caches-preview-text") and _entries(api) == []
    _no_page_errors(browser)


def test_the_playground_streams_an_answer(browser: Any, live: str, shots: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    _sign_in(browser, live, CLIENT, "playground")
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, '#play-model option[value="tiny"]'), "the model list")
    Select(browser.find_element(By.ID, "play-model")).select_by_value("tiny")
    _click(browser, "#play-send")
    _wait(browser, lambda d: d.find_element(By.ID, "play-stats").get_attribute("data-done"), "the stream's end")
    stats = _text(browser, "#play-stats")
    assert browser.find_element(By.ID, "play-stats").get_attribute("data-done") == "yes", stats
    assert re.search(r"\d+ prompt \+ \d+ completion tokens", stats), stats
    assert "prompt cache reused" in stats and "first token after" in stats
    assert browser.execute_script("return document.getElementById('play-output').textContent.length") > 0
    browser.save_screenshot(str(shots / "playground.png"))
    _no_page_errors(browser)


def test_memory_chart_and_traffic_fill(browser: Any, live: str, shots: Path) -> None:
    from selenium.webdriver.common.by import By

    _sign_in(browser, live, OPERATOR, "memory")
    _wait(browser, lambda d: _samples(d) >= 3, "samples accrue")
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#memory-chart svg polyline.line-host"), "the host line")
    assert "host" in _text(browser, "#memory-table") and "Pressure" in _text(browser, "#memory-table")
    browser.save_screenshot(str(shots / "memory.png"))
    _click(browser, 'nav button[data-view="traffic"]')
    _wait(
        browser, lambda d: d.find_elements(By.CSS_SELECTOR, '#traffic-table tr[data-instance="tiny"]'), "tiny's traffic"
    )
    row = _text(browser, '#traffic-table tr[data-instance="tiny"]').split()
    assert int(row[1]) >= 1  # the playground's request
    _wait(browser, lambda d: "POST /v1/chat/completions 200" in _text(d, "#traffic-routes"), "requests by route")
    browser.save_screenshot(str(shots / "traffic.png"))
    _no_page_errors(browser)


def test_a_client_key_sees_no_operator_controls_and_is_refused(browser: Any, live: str, shots: Path) -> None:
    from selenium.webdriver.common.by import By

    _sign_in(browser, live, CLIENT)
    assert browser.find_element(By.ID, "who").text == "client key"
    _wait(browser, lambda d: _state(d, "tiny") == "ready", "tiny listed for the client")
    assert browser.find_elements(By.CSS_SELECTOR, "button[data-action]") == []
    assert "Actions" not in _text(browser, "#instances-table thead")
    browser.save_screenshot(str(shots / "instances-client.png"))
    status = browser.execute_async_script(
        """const done = arguments[arguments.length - 1];
        const key = sessionStorage.getItem("werk.ui.key");
        fetch("/werk/v1/deployments/tiny/actions", {method: "POST",
          headers: {Authorization: "Bearer " + key, "Content-Type": "application/json"},
          body: JSON.stringify({action: "unload"})}).then((r) => done(r.status));"""
    )
    assert status == 403
    assert _state(browser, "tiny") == "ready"
    _no_page_errors(browser)


def test_a_refused_key_signs_nobody_in(browser: Any, live: str) -> None:
    from selenium.webdriver.common.by import By

    _signed_out(browser, live)
    browser.get(f"{live}/ui")
    _wait(browser, lambda d: d.find_element(By.ID, "key").is_displayed(), "the sign-in form")
    browser.find_element(By.ID, "key").send_keys("sk-not-a-key-of-this-host")
    browser.find_element(By.ID, "signin-submit").click()
    _wait(browser, lambda d: "refused" in d.find_element(By.ID, "signin-error").text, "the refusal")
    assert browser.execute_script("return sessionStorage.getItem('werk.ui.key')") is None
    assert "sk-not" not in browser.current_url
    assert not browser.find_element(By.ID, "app").is_displayed()


METRICS_TEXT = r"""# HELP lat_seconds latency
# TYPE lat_seconds histogram
lat_seconds_bucket{instance="a",route="/r\"x",le="0.1"} 2.0
lat_seconds_bucket{instance="a",route="/r\"x",le="0.5"} 6.0
lat_seconds_bucket{instance="a",route="/r\"x",le="1.0"} 8.0
lat_seconds_bucket{instance="a",route="/r\"x",le="+Inf"} 8.0
lat_seconds_count{instance="a",route="/r\"x"} 8.0
lat_seconds_created{instance="a",route="/r\"x"} 1.7e+09
tokens_total{instance="a"} 40.0
tokens_total{instance="b"} 2.0
"""


def test_the_pages_metrics_parser_reads_the_text_format(chrome: Any, bare_host: Any) -> None:
    from werk_host.testing.hosts import running

    with running(bare_host) as url:
        chrome.get(f"{url}/ui/favicon.svg")
        found = chrome.execute_async_script(
            """const done = arguments[arguments.length - 1];
            import("/ui/metrics.js").then((m) => {
              const s = m.parseMetrics(arguments[0]);
              const q = (p) => m.quantile(s, "lat_seconds", {instance: "a"}, p);
              done([m.sum(s, "tokens_total"), m.sum(s, "tokens_total", {instance: "a"}), q(0.5), q(0.95),
                    s.find((x) => x.name === "lat_seconds_count").labels.route, m.quantile(s, "none", {}, 0.5)]);
            });""",
            METRICS_TEXT,
        )
    total, of_a, p50, p95, route, missing = found
    assert (total, of_a, route, missing) == (42, 40, '/r"x', None)
    assert p50 == pytest.approx(0.3) and p95 == pytest.approx(0.9)  # interpolated within the bucket


def test_a_host_without_keys_is_operated_by_its_local_user(chrome: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    from werk_host.testing.hosts import backend_host, running

    host, _ = backend_host(tmp_path / "home")
    with running(host) as url:
        _sign_in(chrome, url, "")
        assert chrome.find_element(By.ID, "who").text == "operator key"
        _wait(chrome, lambda d: _state(d, "tiny") == "ready", "the reference instance")
        assert chrome.find_elements(By.CSS_SELECTOR, 'button[data-action="unload"][data-instance="tiny"]')
        assert chrome.execute_script("return sessionStorage.getItem('werk.ui.key')") == ""
