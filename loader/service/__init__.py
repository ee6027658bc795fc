"""The data-loading service: wire protocol, transport, coordinator, stage, daemon, client.

``loader.service.client.client.Client`` and ``loader.service.local.Loader`` are what a
training script uses; ``loader.service.daemon.loop.Daemon`` is what ``loader serve``
runs. Submodules are imported on use so ``import loader.service`` stays cheap.
"""
