"""`python -m cachesvc.cli` is `cachesvc`."""
from . import main

main()
