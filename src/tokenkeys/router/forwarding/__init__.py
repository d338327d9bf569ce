"""The front door: route a request with the one Preprocessor's ids, then forward it whole.

``tokenkeys route`` decides as it always did (the pool's Preprocessor tokenizes, the keys are
matched against the prefix index, the policy prices the workers) and then sends the client's
own request to the chosen worker's OpenAI-compatible HTTP frontend, returning the worker's
answer as it is. Each concern has its module:

- :mod:`.routes`: which paths are forwarded, and how each one's prompt ids are found (one
  registration per route);
- :mod:`.frontends`: where a worker's HTTP frontend lives (advertised in
  ``ServerInfo.http_frontend``, or named with ``--worker GRPC,URL``);
- :mod:`.relay`: the request to a worker: headers in and out, events relayed whole;
- :mod:`.http1`: its HTTP/1.1 client (pooled keep-alive connections, httptools' parser);
- :mod:`.promise`: what the router expected a worker to serve from cache, against what it
  reported (one value per request, and its metrics);
- :mod:`.client_side`: the client's disconnect while a worker is awaited, its body given again;
- :mod:`.answer`: the worker's answer back to the client, whole or streamed, and what is kept
  of it once the client has it;
- :mod:`.door`: one request through all of them, with the retries before the first byte;
- :mod:`.asgi`: the forwarded routes' one ASGI layer in front of the frontend's app (guards,
  metrics, the ``x-tokenkeys-*`` headers, error answers).
"""
