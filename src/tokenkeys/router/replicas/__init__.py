"""What router replicas share over Redis: the stream (``shared_stream``), the peers' requests
applied (``peer_flights``), the load object the router holds (``shared_load``), what replicas
deciding at the same instant miss of each other (``contention``) and its metrics
(``metrics``)."""
