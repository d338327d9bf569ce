"""Following workers' KV events into a prefix index: the ingestor and one consumer per transport."""
