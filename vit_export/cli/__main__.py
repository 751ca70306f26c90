"""`python -m vit_export.cli`: the command line."""
from . import main

main()
