"""Private runtime helpers: threads, processes, imports by name, and the sample codec."""
