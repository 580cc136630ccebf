"""What a run tells the world: webhooks and experiment trackers."""
