"""A loopback HTTP server of images for the multimodal tests.

Paths: each given path answers its bytes; ``/redirect/<path>`` answers 302 to ``<path>``;
``/away?<url>`` answers 302 to the absolute ``<url>``; ``/slow`` never answers (until the server
closes); ``/endless`` sends bytes without a length until the client stops reading; ``/trickle``
sends one byte every 0.1 s (each in time for a read timeout, never done). Images are made by the
tests (Pillow); nothing is downloaded.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ImageServer:
    """Serves ``files`` (path to bytes) on 127.0.0.1 until :meth:`close`."""

    def __init__(self, files: dict[str, bytes], host: str = "127.0.0.1") -> None:
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
                if self.path.startswith("/away?"):
                    self.send_response(302)
                    self.send_header("Location", self.path[len("/away?") :])
                    self.end_headers()
                    return
                if self.path in ("/endless", "/trickle"):
                    self._stream(self.path == "/trickle")
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

            def _stream(self, slowly: bool) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.end_headers()  # no length: the body ends when the connection does
                try:
                    while not release.is_set():
                        self.wfile.write(b"\0" if slowly else b"\0" * 65536)
                        self.wfile.flush()
                        if slowly:
                            release.wait(0.1)
                except OSError:
                    pass  # the client stopped reading

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
