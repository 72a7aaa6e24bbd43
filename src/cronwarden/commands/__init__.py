"""One module per group of CLI commands; each function takes parsed args and returns an exit status."""
