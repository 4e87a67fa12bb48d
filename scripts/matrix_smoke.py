"""The matrix's smoke run: `hotspan run` profiles a small program and pushes to a real
`hotspan server`, whose flame graph must then name the program's function.  Standard library
only, so it runs in any of the matrix's venvs: ``python scripts/matrix_smoke.py``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

PROGRAM = """
import time
def matrix_smoke_burn():
    end = time.process_time() + 1.5
    while time.process_time() < end:
        sum(i * i for i in range(1000))
matrix_smoke_burn()
"""
CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    bindir = os.path.dirname(sys.executable)
    hotspan = os.path.join(bindir, "hotspan")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp, open(os.path.join(tmp, "server.log"), "w") as err:
        # HOTSPAN_TEST_SERVER_PYTHON: the server on another interpreter (see matrix.sh).
        server_python = os.environ.get("HOTSPAN_TEST_SERVER_PYTHON")
        server = subprocess.Popen(
            [
                *([server_python, "-m", "hotspan"] if server_python else [hotspan]),
                "server",
                "--port",
                str(port),
                "--data-dir",
                os.path.join(tmp, "data"),
                "--otlp-http-port",
                "0",
                "--otlp-grpc-port",
                "0",
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            for _ in range(150):
                try:
                    urllib.request.urlopen(url + "/ready", timeout=1)
                    break
                except OSError:
                    time.sleep(0.2)
            prog = os.path.join(tmp, "smoke_prog.py")
            with open(prog, "w") as f:
                f.write(PROGRAM)
            start = int(time.time()) - 5
            subprocess.run(
                [
                    hotspan,
                    "run",
                    "--server-address",
                    url,
                    "--application-name",
                    "matrix-smoke",
                    "--",
                    sys.executable,
                    prog,
                ],
                check=True,
                timeout=120,
            )
            body = json.dumps(
                {
                    "profileTypeID": CPU,
                    "labelSelector": '{service_name="matrix-smoke"}',
                    "start": start * 1000,
                    "end": (int(time.time()) + 5) * 1000,
                }
            ).encode()
            request = urllib.request.Request(
                url + "/querier.v1.QuerierService/SelectMergeStacktraces",
                data=body,
                headers={"Content-Type": "application/json"},
            )
            graph = json.loads(urllib.request.urlopen(request, timeout=30).read())
        finally:
            server.terminate()
            server.wait(timeout=30)
            err.flush()
            with open(os.path.join(tmp, "server.log")) as f:
                log = f.read()
    names = graph.get("flamegraph", {}).get("names", [])
    found = [n for n in names if "matrix_smoke_burn" in n]
    print(f"smoke: {len(names)} names in the flame graph; the program's function: {found}")
    if not found:
        print(log[-2000:], file=sys.stderr)
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
