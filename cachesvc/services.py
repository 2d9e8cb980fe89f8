"""The service lookup: the running app's ``Services`` (its Database, Storage, settings, hit log and token
cache; ``cachesvc.app.build_services``), for the API's views (``cachesvc.api``) and the pages
(``cachesvc.browse``) alike. A module of its own so that neither imports the other for it
(``tests/test_layers.py``); it imports nothing of the service.
"""
from __future__ import annotations

from flask import current_app


def services():
    """The app's Database, Storage and settings (set up by create_app)."""
    return current_app.extensions["cachesvc"]
