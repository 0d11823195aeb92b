"""``python -m skiplock`` runs the command line."""

from .cli import main

main()
