"""The serving process itself, beside what it serves: workers, allocator, encode lanes.

Modules: ``supervisor`` (``serve --processes N`` and ``route --processes N``: worker processes
sharing the ports, restarted when they exit, drained on a signal), ``allocator`` (the C
allocator setting a serving process starts with), ``encode_lanes`` (where a Preprocessor call
runs: inline when small, on the process's encode threads when large).
"""
