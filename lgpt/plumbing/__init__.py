"""Plumbing: checkpoints (staged, checked writes), datasets, devices, logging, the command line and its config
files, and the one error type a command turns into one line. It never imports the method or the formats."""
