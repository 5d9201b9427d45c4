"""The fake OpenAI server as a process of its own on a given port, with /health: a stand-in for a real server
that the peers runner starts and stops.  python -m tests.unit.benchmarks.fake_server_process PORT"""

import sys
from http.server import ThreadingHTTPServer

from tests.unit.benchmarks.fake_openai_server import FakeState, _Handler


class _HealthHandler(_Handler):
    state = FakeState(chunk_delay_s=0.0)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._json(200, {"status": "ok"})
        else:
            super().do_GET()


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), _HealthHandler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
