"""Run the vit-export command line from a checkout: `python cli.py --help`."""
from vit_export.cli import main

if __name__ == "__main__":
    main()
