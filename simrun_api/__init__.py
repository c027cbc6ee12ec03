"""The service: the litestar app, its run actors and supervisor, the backends and the index."""
