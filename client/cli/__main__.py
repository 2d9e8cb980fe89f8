"""``python -m cachesvc_client.cli``: the same command line as the ``cachesvc-client`` script."""
from . import main

main()
