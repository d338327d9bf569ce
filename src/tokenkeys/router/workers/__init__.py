"""Workers: discovery, admission into pools, the registry and its status view."""
