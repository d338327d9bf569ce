"""Engine hosting: the engines of the served models, of any kind, all or nothing.

Modules: ``engines`` (the runtime: kind from the registry, lifecycle), ``state`` (what the
runtime hands its hosting), ``hosting`` (the interface the servicers call), ``streamed`` (kinds
whose KV events this process streams), ``forwarded`` (kinds that are OpenEngine servers of their
own), ``discovery_messages`` (the ``Control`` answers the hostings build), ``loading``
(``--model`` arguments to served models).
"""
