"""HTTP API, one blueprint per resource, all under /api/v1 (health at /healthz)."""
from flask import current_app


def services():
    """The app's Database, Storage and settings (set up by create_app)."""
    return current_app.extensions["cachesvc"]
