"""Model endpoints, per-framework clients with usage accounting, and the built-in gold server.

Imports here are light (no SDK or framework is imported until a client is built).
"""

from apps_bench.models.clients import MissingFrameworkError, ModelClients
from apps_bench.models.endpoint import Endpoint, ModelEndpointError, open_endpoint

__all__ = ["Endpoint", "MissingFrameworkError", "ModelClients", "ModelEndpointError", "open_endpoint"]
