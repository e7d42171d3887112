"""The `nodus` command-line interface."""
