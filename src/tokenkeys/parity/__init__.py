"""Render parity per request shape: an engine's token ids against tokenkeys' own.

``tokenkeys parity`` sends each request shape of a corpus (:mod:`.corpus`) to a live engine's
render routes (:mod:`.engine`) and to the model's one Preprocessor (:mod:`.local`), then names
per shape whether the ids are the same or where they first differ (:mod:`.compare`). It is the
check an operator runs before a router is trusted to tokenize for that engine.
"""
