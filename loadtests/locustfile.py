"""Locust's entry point for hand-run load tests of any Triton server (`tidepool load` runs the same
users): the users live in tidepool.clients.locustfile; see its docstring for the settings.

    TIDEPOOL_MODEL=encoder locust -f loadtests/locustfile.py --host 127.0.0.1:8001 TritonGrpcUser
"""

from tidepool.clients.locustfile import *  # noqa: F403  (Locust collects the classes it names)
