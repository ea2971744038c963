"""ringtorch.distributed.nn.api: where ``RemoteModule`` lives (``api.remote_module``), as in torch."""
