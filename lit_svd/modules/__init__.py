"""LightningModules: what is trained or evaluated."""
