"""keys package."""
