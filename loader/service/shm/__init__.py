"""Shared memory for large rows: arenas, the daemon's pool, the client's cache, reference columns, the stale-file sweep."""
