"""Exit codes of the ``telescope`` command."""

EXIT_OK = 0
EXIT_INVALID = 1  # the input (config, flags) was rejected
EXIT_USAGE = 2  # argparse's own code for a malformed command line
EXIT_INTERNAL = 70  # a bug in Telescope (EX_SOFTWARE)
EXIT_INTERRUPTED = 130
