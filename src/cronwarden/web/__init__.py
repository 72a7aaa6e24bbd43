"""The dashboard: what on-call reads, in a browser, over one store, read-only
(``web.dashboard``), its HTML (``web.render``) and its HTTP server
(``web.server``)."""

from cronwarden.web.dashboard import DEFAULT_REFRESH, BadRequest, Dashboard, NotFound, Response
from cronwarden.web.server import bind, serve, url_of

__all__ = ["DEFAULT_REFRESH", "BadRequest", "Dashboard", "NotFound", "Response", "bind", "serve", "url_of"]
