"""The daemon process: its loop, the coordinator, the worker pool and launcher, the client desk, the stage."""
