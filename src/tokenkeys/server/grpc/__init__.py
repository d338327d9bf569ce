"""The gRPC face of ``tokenkeys serve``: servicers, message conversion, guard, status, server."""
