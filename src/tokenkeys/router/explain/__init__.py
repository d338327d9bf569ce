"""Why did a request miss the cache: the router's own record, per worker, never a guess.

- :mod:`.removals`: a wrapper of the prefix index keeping, per worker, a bounded record of the
  keys its events removed (with the batch's sequence number and time) and of its last clear;
- :mod:`.causes`: the explanation of one prompt, per worker: blocks held, and the cause of the
  first block not held, from the index, the removals, the promises and the registry.
"""
