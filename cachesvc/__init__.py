"""cachesvc: the service half (Flask app, database index, blob storage).

``create_app`` builds the WSGI app; ``cachesvc.cli`` holds the commands.
"""
__version__ = "0.1.0"


def create_app(config=None):
    from .app import create_app as _create_app

    return _create_app(config)
