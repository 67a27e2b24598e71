"""Framework integrations on the shared engine."""
