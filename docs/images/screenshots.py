"""Makes the UI screenshots of the docs and the README (docs/images/ui-*.png) from real data.

It starts a real ``hotspan server`` on a fresh data directory, runs a small checkout service
for a while (OpenTelemetry SDK spans sent over OTLP/HTTP, the hotspan agent uploading its
profiles), and photographs the trace view of its slowest request and the Profiles page with
Debian's Chromium driven by Playwright, as the UI tests launch it.

    python3 docs/images/screenshots.py [--seconds 25] [--chromium /usr/bin/chromium]

Needs the ``otel`` and ``test`` extras (the OpenTelemetry SDK, Playwright).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

IMAGES = Path(__file__).resolve().parent

# The service: a checkout request loads a cart (a database call), prices it (a fraud check
# that computes), charges a card (a call to a payment service that makes the slow requests
# wait) and renders JSON.  Every 40th request is slow.
SERVICE = """
import hashlib, json, random, sys, time
import hotspan
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

server, seconds = sys.argv[1], float(sys.argv[2])
provider = TracerProvider(resource=Resource.create({"service.name": "checkout"}))
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=server + "/v1/traces")))
trace.set_tracer_provider(provider)
hotspan.configure(application_name="checkout", server_address=server, upload_interval=2,
                  tags={"env": "prod", "version": "1.4.2"})
tracer = trace.get_tracer("checkout")


def load_cart(n):
    with tracer.start_as_current_span("SELECT cart_items", kind=trace.SpanKind.CLIENT) as span:
        span.set_attribute("db.system", "postgresql")
        time.sleep(0.004 + 0.002 * random.random())
        return [{"sku": f"sku-{i}", "price": random.random() * 100, "qty": 1 + i % 3}
                for i in range(n)]


def apply_discounts(items):
    total = 0.0
    for item in items:
        for _ in range(300):
            total += (item["price"] * item["qty"]) ** 0.5
    return total


def velocity(item, seen):
    seen[item["sku"]] = seen.get(item["sku"], 0) + item["qty"]
    return sum(seen.values()) / (1 + len(seen))


def card_hash(digest, item):
    return hashlib.sha256(digest + repr(sorted(item.items())).encode()).digest()


def fraud_score(items, slow):
    digest, seen, score = b"", {}, 0.0
    for i in range(6000 if slow else 100):
        item = items[i % len(items)]
        digest = card_hash(digest, item)
        score += velocity(item, seen)
    return score + digest[0]


def price_items(items, slow):
    with tracer.start_as_current_span("price_items"):
        total = apply_discounts(items)
        with tracer.start_as_current_span("fraud_check"):
            fraud_score(items, slow)
        return total


def charge_card(total, slow):
    with tracer.start_as_current_span("POST payments/charge", kind=trace.SpanKind.CLIENT) as span:
        span.set_attribute("server.address", "payments")
        time.sleep(0.35 if slow else 0.008)


def render(items, total):
    with tracer.start_as_current_span("render_json"):
        for _ in range(20):
            body = json.dumps({"items": items, "total": total}, sort_keys=True, indent=1)
        return body


def handle(i):
    slow = i % 40 == 7
    with tracer.start_as_current_span("POST /checkout", kind=trace.SpanKind.SERVER) as span:
        span.set_attribute("http.route", "/checkout")
        span.set_attribute("http.response.status_code", 200)
        items = load_cart(40)
        total = price_items(items, slow)
        charge_card(total, slow)
        render(items, total)


end, i = time.time() + seconds, 0
while time.time() < end:
    handle(i)
    i += 1
    time.sleep(0.01)
provider.shutdown()
hotspan.shutdown()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/ready", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"the server at {url} did not become ready")


def slowest_trace(url: str) -> tuple:
    query = "/api/search?tags=service.name=checkout&sort=duration&limit=1"
    with urllib.request.urlopen(url + query, timeout=30) as answer:
        found = json.load(answer)["traces"][0]
    return found["traceID"], found["spanSet"]["spans"][0]["spanID"]


def photograph(url: str, chromium: str, seconds: float) -> None:
    from playwright.sync_api import sync_playwright

    trace_id, root = slowest_trace(url)
    window = f"now-{int(seconds) + 60}s"
    selector = '{service_name="checkout"}'
    views = {
        "ui-trace.png": f"{url}/traces/{trace_id}?span={root}&descendants=1",
        "ui-profiles.png": f"{url}/profiles?query={selector}&from={window}&until=now",
    }
    with sync_playwright() as playwright:
        # --no-sandbox: as in tests/ui/conftest.py, for containers that run as root.
        browser = playwright.chromium.launch(
            executable_path=chromium, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        for name, address in views.items():
            page.goto(address)
            page.wait_for_load_state("networkidle")
            page.wait_for_timeout(1000)  # the canvas draws after the last answer
            page.screenshot(path=str(IMAGES / name))
            print(f"{IMAGES / name}: {address}")
        browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=25.0, help="how long the service runs")
    parser.add_argument("--chromium", default="/usr/bin/chromium", help="the browser to drive")
    options = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hotspan",
                "server",
                "--port",
                str(port),
                "--data-dir",
                os.path.join(tmp, "data"),
                "--otlp-http-port",
                "off",
                "--otlp-grpc-port",
                "off",
            ],
        )
        try:
            wait_ready(url)
            program = Path(tmp) / "checkout.py"
            program.write_text(SERVICE)
            subprocess.run([sys.executable, str(program), url, str(options.seconds)], check=True)
            time.sleep(1)
            photograph(url, options.chromium, options.seconds)
        finally:
            server.terminate()
            server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
