"""Media of a request: fetched under a policy (``fetch``), decoded as vLLM does (``decode``)."""
