"""The `simrun` command line: submit, follow and inspect runs of the service or the local one."""
