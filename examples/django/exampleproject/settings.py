"""The smallest Django project a management command needs."""

import os

SECRET_KEY = "example-only-not-secret"
DEBUG = False
INSTALLED_APPS = ["reports"]
USE_TZ = True

# The store every host running the command shares; None: $CRONWARDEN_STORE,
# else the SQLite file in the user's state directory.
CRONWARDEN_STORE = os.environ.get("CRONWARDEN_STORE")
