"""LightningDataModules: toy feature streams, task prompts, text streams."""
