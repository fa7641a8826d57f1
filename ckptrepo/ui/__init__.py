"""``ckpt ui``: a read-only local web app over the public API (``pip install 'ckptrepo[ui]'``).

``create_app(repo)`` is a Starlette application: HTML pages (the lineage graph, a commit, metric
curves, a tensor's history, a diff) and the JSON API they read (``/api/...``), GET and HEAD
only, every response with a strict Content-Security-Policy. It calls ``Repo`` methods that read
the catalog only, none of which imports torch. The modules: ``app`` (routes, error handlers,
headers), ``pages`` and ``api`` (the endpoints), ``graph`` (the graph's layout), ``data``
(shaping results for both), ``explore`` (annotations, merges, similar commits), ``templating``,
``urls``, ``params``, ``security``, ``failures``;
``templates/`` and ``static/`` (Jinja2 templates, vanilla JS and CSS) ship in the package.
"""

from ckptrepo.ui.app import create_app

__all__ = ["create_app"]
