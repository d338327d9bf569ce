"""Choosing a worker: the Router, the scorer and the text-chunk baseline."""
