"""stripe-python, the real client, against `idem serve` fronting a small
fake of Stripe's charges API: a key reused with another request raises
stripe's own IdempotencyError when the route declares
error_dialect = "stripe", and a generic APIError when it does not (the
check that this test can fail). Run by scripts/test.sh with the path of
the idem binary; exits non-zero on any mismatch.
"""

import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import stripe

START_TIMEOUT_S = 30


class Charges(BaseHTTPRequestHandler):
    """POST /v1/charges: a charge object, as Stripe answers one."""

    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        body = json.dumps({"id": "ch_1", "object": "charge", "amount": 100}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def gateway(idem, workdir, upstream, dialect):
    """`idem serve` with one route, /v1/charges, in `dialect` (or none)."""
    route = '[[route]]\nname = "charges"\nmethods = ["POST"]\npath = "/v1/charges"\n'
    if dialect:
        route += f'error_dialect = "{dialect}"\n'
    config = Path(workdir) / "idem.toml"
    config.write_text(route)
    port = free_port()
    proc = subprocess.Popen(
        [idem, "serve", "--listen", f"127.0.0.1:{port}", "--upstream", upstream,
         "--store", f"sqlite://{workdir}/idem.db", "--config", str(config)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    while not answers(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            sys.exit(f"idem serve did not start: {proc.stderr.read().decode()}")
        time.sleep(0.05)
    return proc, port


def reuse_a_key(port):
    """The exception stripe-python raises for a key reused with another amount."""
    stripe.api_key = "sk_test_idem"
    stripe.api_base = f"http://127.0.0.1:{port}"
    stripe.max_network_retries = 0
    first = stripe.Charge.create(amount=100, currency="eur", idempotency_key="order-1")
    assert first.id == "ch_1", first
    try:
        stripe.Charge.create(amount=200, currency="eur", idempotency_key="order-1")
    except stripe.StripeError as e:
        return e
    sys.exit("a key reused with another amount was not refused")


def main():
    idem = sys.argv[1]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Charges)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    upstream = f"http://127.0.0.1:{server.server_address[1]}"
    failures = []
    for dialect, expect in (("stripe", stripe.IdempotencyError), (None, stripe.APIError)):
        with tempfile.TemporaryDirectory() as workdir:
            proc, port = gateway(idem, workdir, upstream, dialect)
            try:
                raised = reuse_a_key(port)
            finally:
                proc.kill()
                proc.wait()
        name = type(raised).__name__
        ok = type(raised) is expect
        print(f"==> error_dialect={dialect or 'rfc9457'}: stripe-python raised {name} "
              f"(HTTP {raised.http_status}): {'as expected' if ok else 'NOT ' + expect.__name__}")
        if not ok:
            failures.append(f"{dialect or 'rfc9457'}: {name}: {raised}")
    server.shutdown()
    if failures:
        sys.exit("stripe-python against idem: " + "; ".join(failures))


if __name__ == "__main__":
    main()
