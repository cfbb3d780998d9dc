"""nanoLGPT's library: ``method`` (the width transform's rules), ``plumbing`` (checkpoints, data, devices, logging,
command lines) and ``formats`` (one file per model family). The commands at the top level use it; it never imports
them or ``scripts/`` (tests/commands/test_imports.py keeps the rules)."""
