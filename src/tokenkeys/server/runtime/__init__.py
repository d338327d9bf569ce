"""Engine hosting: the engines of the served models (local simulated or remote), all or nothing."""
