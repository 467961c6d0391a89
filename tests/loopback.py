"""httpx's functions for the tests' calls to their servers, with one TLS context for the whole run.

httpx builds a TLS context for every client it makes, loading the CA bundle (about 20 ms of CPU), and its module
functions make a client per call, as the SDKs' constructors do. The servers here speak plain HTTP on 127.0.0.1,
so that context is never used, yet building it was three minutes of the suite's CPU, half of the test processes'
own (py-spy of both xdist workers; a server start's health polls alone, 80 s). These take the run's one context
instead and are otherwise httpx's: each call still opens and closes its own connection.
"""

from __future__ import annotations

import functools
import ssl

import httpx

TLS = ssl.create_default_context()

get = functools.partial(httpx.get, verify=TLS)
post = functools.partial(httpx.post, verify=TLS)
request = functools.partial(httpx.request, verify=TLS)
stream = functools.partial(httpx.stream, verify=TLS)
