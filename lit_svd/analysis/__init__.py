"""The methods as pure functions over model views and activations (no Lightning)."""
