"""Private runtime helpers: threads, processes, imports by name, the sample codec, worker memory and file limits."""
