"""What router replicas share over Redis: the stream (``shared_stream``), their decisions placed
in groups (``placement_groups``), the peers' requests applied (``peer_flights``), and the load
object the router holds (``shared_load``)."""
