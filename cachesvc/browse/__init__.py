"""Browse: what people and dashboards read; nothing here writes the index except through a door.

::

    GET /                   pages    entries (search, problems), an entry's versions and files with a
    GET /entries/<id>                restore command each and the shapes the fleet served (charts.py),
                                     stats (hit rate, top entries, devices, torch)
    GET /stats
    /login, /logout         signin   a token pasted once, a signed session cookie, CSRF on every form
    /admin/...              admin_pages  purge (preview, then confirm), audit log, tokens: through
                                     cachesvc.lifecycle's actions

The door is ``register_pages``. The rows the pages show are ``cachesvc.readmodel``'s, which the JSON API
(``/api/v1/entries``, ``/api/v1/stats``) and ``/metrics`` read too; the app's parts come from
``cachesvc.services``. Nothing here imports ``cachesvc.api``, nor it this (``tests/test_layers.py``).
"""
from flask import Flask

from ..config import Settings


def register_pages(app: Flask, settings: Settings) -> None:
    """Sign-in (its session cookie and CSRF) and the HTML pages' blueprints (auth.PAGE_BLUEPRINTS)."""
    from . import admin_pages, filters, pages, signin

    signin.install(app, settings)
    filters.install(app)
    for page_bp in (pages.bp, signin.bp, admin_pages.bp):
        app.register_blueprint(page_bp)


__all__ = ["register_pages"]
