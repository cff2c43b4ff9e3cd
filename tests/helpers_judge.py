"""A fake OpenAI-compatible judge: a real HTTP server on loopback (stdlib http.server in a thread).

It implements POST /v1/chat/completions and GET /v1/models (one model, `MODEL_ID`). What a chat
request gets is steered by directives anywhere in its last (user) message:

    [[score:N]]       reply "SCORE: N" (the default reply is "SCORE: 7")
    [[has:WORD]]      reply "SCORE: 10" if WORD is in the text after "[Response]", else "SCORE: 0"
    [[reply:TEXT]]    reply TEXT
    [[sleep:S]]       wait S seconds first
    [[fail:N:TAG]]    HTTP 500 (echoing the request's Authorization header in the body) to the
                      first N requests carrying TAG, then "SCORE: 9"
    [[status:CODE]]   always HTTP CODE
    [[malformed]]     HTTP 200 with a non-JSON body
"""

from __future__ import annotations

import collections
import contextlib
import json
import re
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DIRECTIVE = re.compile(r"\[\[(\w+)(?::([^\]]*))?\]\]")
MODEL_ID = "stub-judge"


class FakeJudge(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.lock = threading.Lock()
        self.requests: list[dict] = []
        self.model_lookups = 0
        self.authorization: list[str | None] = []
        self.attempts: collections.Counter[str] = collections.Counter()
        self.in_flight = 0
        self.max_in_flight = 0

    def handle_error(self, request, client_address):
        # A client that timed out has closed its socket; writing the late reply fails.
        if not isinstance(sys.exc_info()[1], BrokenPipeError | ConnectionResetError):
            super().handle_error(request, client_address)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def user_messages(self) -> list[str]:
        with self.lock:
            return [r["messages"][-1]["content"] for r in self.requests]


class Handler(BaseHTTPRequestHandler):
    server: FakeJudge

    def log_message(self, *args):  # keep the test output quiet
        pass

    def _send(self, status: int, body: bytes) -> None:
        self._done()  # the reply may reach the client, which may send again, before we return
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path != "/v1/models":
            return self._send(404, b'{"error": "not found"}')
        with self.server.lock:
            self.server.model_lookups += 1
        self._send(200, json.dumps({"object": "list", "data": [{"id": MODEL_ID}]}).encode())

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server = self.server
        with server.lock:
            server.requests.append(request)
            server.authorization.append(self.headers.get("Authorization"))
            server.in_flight += 1
            server.max_in_flight = max(server.max_in_flight, server.in_flight)
        self._counted = True
        try:
            self._answer(request)
        finally:
            self._done()

    def _done(self) -> None:
        """This request stops counting as in flight (once)."""
        if getattr(self, "_counted", False):
            self._counted = False
            with self.server.lock:
                self.server.in_flight -= 1

    def _answer(self, request: dict) -> None:
        if self.path != "/v1/chat/completions":
            return self._send(404, b'{"error": "not found"}')
        user = request["messages"][-1]["content"]
        text = "Reasonable.\nSCORE: 7"
        for name, value in DIRECTIVE.findall(user):
            if name == "sleep":
                time.sleep(float(value))
            elif name == "score":
                text = f"The response is fine.\nSCORE: {value}"
            elif name == "has":
                met = value in user.split("[Response]")[-1]
                text = f"{'Met' if met else 'Not met'}.\nSCORE: {10 if met else 0}"
            elif name == "reply":
                text = value
            elif name == "status":
                return self._send(int(value), b'{"error": "no"}')
            elif name == "malformed":
                return self._send(200, b"<html>not json</html>")
            elif name == "fail":
                count, tag = value.split(":")
                with self.server.lock:
                    self.server.attempts[tag] += 1
                    attempt = self.server.attempts[tag]
                if attempt <= int(count):
                    echo = f"overloaded; you sent {self.headers.get('Authorization')}"
                    return self._send(500, json.dumps({"error": echo}).encode())
                text = "Recovered.\nSCORE: 9"
        reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
        self._send(200, json.dumps(reply).encode())


@contextlib.contextmanager
def fake_judge() -> Iterator[FakeJudge]:
    """A running `FakeJudge`, shut down on exit."""
    fake = FakeJudge()
    thread = threading.Thread(target=fake.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.shutdown()
        fake.server_close()
