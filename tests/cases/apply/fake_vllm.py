"""A stand-in for vLLM's command line, installed as the ``vllm`` console script of the tests'
fake ``vllm`` wheel: ``vllm serve MODEL ...`` checks that the model's snapshot is in the HF cache
the unit names, then serves ``GET /health`` on --host/--port until it is stopped.

Test switches (passed through [serve] extra_args): ``--fake-crash`` exits at once,
``--fake-unhealthy`` answers /health with 503.
"""

import hashlib
import http.server
import json
import os
import sys

VERSION = "@VERSION@"


def _opt(args, name, default=None):
    return args[args.index(name) + 1] if name in args else default


def main():
    args = sys.argv[1:]
    if not args or args[0] != "serve":
        print("usage: vllm serve MODEL [options]", file=sys.stderr)
        return 2
    model, revision = args[1], _opt(args, "--revision", "main")
    token = os.environ.get("HF_TOKEN")
    print(
        json.dumps(
            {
                "vllm": VERSION,
                "argv": args,
                "hf_home": os.environ.get("HF_HOME"),
                "offline": os.environ.get("HF_HUB_OFFLINE"),
                "token_sha256": hashlib.sha256(token.encode()).hexdigest() if token else None,
                "extra_env": os.environ.get("FAKE_EXTRA"),
            },
            sort_keys=True,
        ),
        flush=True,
    )
    if "--fake-crash" in args:
        print("fake vllm: crashing as asked", flush=True)
        return 3
    hub = os.path.join(os.environ.get("HF_HOME", ""), "hub")
    snap = os.path.join(hub, "models--" + model.replace("/", "--"), "snapshots", revision)
    if not os.path.isfile(os.path.join(snap, "config.json")):
        print(f"fake vllm: {model}@{revision} is not in {hub}", flush=True)
        return 4
    status = 503 if "--fake-unhealthy" in args else 200

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            code = status if self.path == "/health" else 404
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    server = http.server.HTTPServer((_opt(args, "--host"), int(_opt(args, "--port"))), Handler)
    print(f"fake vllm {VERSION}: serving {model} on port {server.server_address[1]}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
