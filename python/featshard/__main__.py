"""``python -m featshard``: the featshard command."""

from featshard.cli import main

main()
