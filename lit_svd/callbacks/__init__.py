"""Observers that compute an analysis during or after a run and write it out."""
