"""The command line's clients of the bus: submit and delete, get, top (issue #12: not in the services)."""
