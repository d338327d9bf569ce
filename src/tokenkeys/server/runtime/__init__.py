"""Engine hosting: the engines of the served models, of any kind, all or nothing.

Modules: ``engines`` (the runtime: kind from the registry, lifecycle), ``hosting`` (the
interface the servicers call), ``streamed`` (kinds whose KV events this process streams),
``forwarded`` (kinds that are OpenEngine servers of their own), ``loading`` (``--model``
arguments to served models).
"""
