"""The admin dashboard in a real headless Chromium (Debian's, driven by playwright).

The page loads from the gateway alone (no other origin), asks for the admin key, draws
its charts from /admin/stats, and redraws them after a scripted workload. A screenshot
is kept as an artifact; its path is printed.
"""

import shutil
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from playwright.sync_api import Page, sync_playwright

from gateway.app import create_app
from gateway.policy import parse_policy
from tests.paid_api import paid_api_app
from tests.servers import run_uvicorn

KEY, ADMIN = "sk-dash-tenant-key", "sk-dash-admin-key"
CHARTS = ("chart-hit-rate", "chart-requests", "chart-latency", "chart-saved")


def policy_text(paid: str) -> str:
    return f"""
auth:
  keys: [{{key: {KEY}, tenant: acme}}]
  admin_key: {ADMIN}
engines:
  smollm2-135m: {{kv_cache_mb: 16, max_num_seqs: 4, max_model_len: 512, num_threads: 1}}
tiers:
  small:
    deployments: [{{model: smollm2-135m}}]
    price: {{input: 0.5, output: 1.5}}
  large:
    deployments: [{{model: openai/gpt-4o, api_base: "{paid}"}}]
    price: {{input: 2.5, output: 10}}
routes:
  auto:
    rules: [{{tier: large, contains_code: true}}]
    default: small
"""


@pytest.fixture(scope="module")
def url(one_torch_thread: None) -> Iterator[str]:
    with run_uvicorn(paid_api_app()) as paid:
        policy = parse_policy(policy_text(f"{paid}/v1"), env={})
        with run_uvicorn(create_app(policy)) as base:
            yield base


@pytest.fixture(scope="module")
def page(url: str) -> Iterator[Page]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise RuntimeError("chromium is not installed; run `make test` (apt-get install chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        yield page
        browser.close()


def workload(url: str) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    for text in ["Say hello.", "Say hello.", "```sql\nSELECT 1\n``` explain", "Name a color."]:
        messages = [{"role": "user", "content": text}]
        client.chat.completions.create(model="auto", messages=messages, max_tokens=3)


def wait_until(page: Page, expression: str, timeout_s: float = 30.0) -> None:
    """Polls from Python: playwright's wait_for_function evals strings in the page, which
    the dashboard's Content-Security-Policy (rightly) forbids."""
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(expression):
        assert time.monotonic() < deadline, f"still false after {timeout_s}s: {expression}"
        time.sleep(0.1)


def points(page: Page, chart: str) -> int:
    return int(page.get_attribute(f"#{chart}", "data-points") or 0)


def inked_pixels(page: Page, chart: str) -> int:
    """Pixels the chart painted: proof it drew, independent of its own bookkeeping."""
    return page.evaluate(
        """(id) => {
            const c = document.getElementById(id);
            const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
            let n = 0;
            for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++;
            return n;
        }""",
        chart,
    )


def test_dashboard_loads_asks_for_the_key_and_draws_live(
    url: str, page: Page, tmp_path_factory: pytest.TempPathFactory
) -> None:
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    script_errors: list[str] = []
    page.on("pageerror", lambda error: script_errors.append(str(error)))
    page.goto(f"{url}/admin?refresh=0.5")
    assert page.is_visible("#login") and not page.is_visible("#board")

    page.fill("#key", KEY)  # a tenant key is refused, and the page says so
    page.click("#login button[type=submit]")
    wait_until(page, "document.getElementById('login-error').textContent.length > 0")
    assert "admin key" in page.text_content("#login-error")
    assert page.evaluate("sessionStorage.getItem('tiergate-admin-key')") is None

    page.fill("#key", ADMIN)
    page.click("#login button[type=submit]")
    wait_until(page, "Number(document.body.dataset.updates || 0) >= 1")
    assert points(page, "chart-requests") == 0  # nothing served yet
    before = {chart: inked_pixels(page, chart) for chart in CHARTS}
    assert all(before.values())  # axes and "no data yet" are drawn already

    workload(url)
    wait_until(page, "Number(document.getElementById('chart-requests').dataset.points) > 0")
    wait_until(page, "Number(document.getElementById('chart-saved').dataset.points) > 0")
    assert points(page, "chart-latency") > 0
    for chart in ("chart-requests", "chart-latency"):
        # Redrawn with data: a line can ink fewer pixels than the "no data yet" text did.
        assert inked_pixels(page, chart) != before[chart], chart

    # Every request has finished: the next update shows all of them.
    done = page.evaluate("Number(document.body.dataset.updates)")
    wait_until(page, f"Number(document.body.dataset.updates) > {done}")
    table = page.text_content("#route-tenants")
    assert "auto" in table and "acme" in table
    spend = page.text_content("#spend-keys")  # spend by tenant and key: a label, not the key
    assert "acme" in spend and "sha256:" in spend and "$" in spend and KEY not in spend
    assert "auto" in page.text_content("#spend-routes")
    tiers = page.text_content("#tiers")
    assert "smollm2-135m" in tiers and "openai/gpt-4o" in tiers
    assert "smollm2-135m" in page.text_content("#engines")
    wait_until(page, "document.getElementById('policy').textContent.includes('tiers')")
    policy = page.text_content("#policy")
    assert ADMIN not in policy and KEY not in policy and "***" in policy

    shot = tmp_path_factory.mktemp("dashboard") / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"\ndashboard screenshot: {shot}")
    assert shot.stat().st_size > 10_000
    assert all(u.startswith(url) for u in requested), [u for u in requested if url not in u]
    assert script_errors == []


def test_dashboard_actions_show_the_gateways_answer(url: str, page: Page) -> None:
    page.goto(f"{url}/admin?refresh=60")
    if page.is_visible("#login"):
        page.fill("#key", ADMIN)
        page.click("#login button[type=submit]")
    wait_until(page, "Number(document.body.dataset.updates || 0) >= 1")
    page.click("#reload")  # this gateway's policy came from text, not a file
    wait_until(page, "document.getElementById('action-result').textContent.length > 0")
    assert "nothing to reload" in page.text_content("#action-result")
    assert page.get_attribute("#action-result", "class") == "error"
    page.fill("#report-entry", "entry-1")
    page.click("#report button[type=submit]")
    wait_until(page, "document.getElementById('action-result').textContent.includes('cache')")
    assert "cache is off" in page.text_content("#action-result")
    assert page.is_visible("#board")  # errors of actions do not sign out


def test_dashboard_page_is_public_and_holds_no_data(url: str) -> None:
    page = httpx.get(f"{url}/admin")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert "smollm2" not in page.text and '<script src="/admin/static/chart.js">' in page.text
    script = httpx.get(f"{url}/admin/static/chart.js")
    assert script.status_code == 200 and "lineChart" in script.text
    missing = httpx.get(f"{url}/admin/static/..%2Fadmin.py")
    assert missing.status_code == 404 and missing.json()["error"]["message"]
