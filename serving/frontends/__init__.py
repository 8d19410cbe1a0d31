"""The front ends over the one ``search()`` (``serving/search.py``), and what runs a server.

* `.cli`          the ``funnel`` command: a thin dispatcher that imports each side lazily
* `.http`         ``funnel serve``: the HTTP API (FastAPI)
* `.mcp`          ``funnel mcp``: the MCP tools an agent calls
* `.connections`  connection limits of the HTTP servers
* `.safejson`     how deep a JSON text nests, measured before it is parsed
* `.warmup`       a server's warm-up, before it answers and after a new version is published
* `.scrub`        the background scrub: a long-running server re-hashes the files it serves
"""
