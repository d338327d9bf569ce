"""What every face of a server shares: the served models, the lifecycle, the call guards."""
