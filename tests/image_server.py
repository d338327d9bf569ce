"""A loopback HTTP server of images for the multimodal tests.

Paths: each given path answers its bytes; ``/redirect/<path>`` answers 302 to ``<path>``;
``/slow`` never answers (until the server closes). Images are made by the tests (Pillow); nothing
is downloaded.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ImageServer:
    """Serves ``files`` (path to bytes) on 127.0.0.1 until :meth:`close`."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = dict(files)
        release = self.release = threading.Event()
        served = self.files

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/slow":
                    release.wait(30)
                    return
                if self.path.startswith("/redirect"):
                    self.send_response(302)
                    self.send_header("Location", self.path[len("/redirect") :] or "/img.png")
                    self.end_headers()
                    return
                body = served.get(self.path)
                if body is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
