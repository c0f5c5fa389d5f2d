"""Request control: one request's way from its bytes to a chosen endpoint and back.

- :mod:`~sluicegate.requestcontrol.parse` — reading an OpenAI-style request
  (``parse_request`` → ``ParsedRequest``) and the control headers;
- :mod:`~sluicegate.requestcontrol.models` — model routing (``ModelTable``, ``ModelRoute``);
- :mod:`~sluicegate.requestcontrol.director` — ``Director``: admission, flow control,
  scheduling; its queues in :mod:`~sluicegate.requestcontrol.waiting`, the 503s for a
  request nothing can serve in :mod:`~sluicegate.requestcontrol.refusals`;
- :mod:`~sluicegate.requestcontrol.dispatch` — ``Dispatch``, one routed request and what it
  charges to its endpoint;
- :mod:`~sluicegate.requestcontrol.responses` — what an answer tells (``Usage``,
  ``ResponseStats``) and restoring the public model name in it;
- :mod:`~sluicegate.requestcontrol.ids` — request ids;
- :mod:`~sluicegate.requestcontrol.jsonbytes` — exact edits of JSON bytes, the JSON depth
  limit.

The names are imported on first use (lazy): the hosts import the parser and the response
readers alone, and the director would bring the scheduling and flow-control layers with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluicegate import lazy

_EXPORTS = {
    "Admitted": "sluicegate.requestcontrol.director",
    "Director": "sluicegate.requestcontrol.director",
    "Dispatch": "sluicegate.requestcontrol.dispatch",
    "MAX_REQUEST_ID_LENGTH": "sluicegate.requestcontrol.ids",
    "new_request_id": "sluicegate.requestcontrol.ids",
    "request_id_from": "sluicegate.requestcontrol.ids",
    "MAX_JSON_DEPTH": "sluicegate.requestcontrol.jsonbytes",
    "replace_top_level_string": "sluicegate.requestcontrol.jsonbytes",
    "within_depth": "sluicegate.requestcontrol.jsonbytes",
    "CRITICALITY_PRIORITY": "sluicegate.requestcontrol.models",
    "ModelRoute": "sluicegate.requestcontrol.models",
    "ModelTable": "sluicegate.requestcontrol.models",
    "CONTROL_HEADERS": "sluicegate.requestcontrol.parse",
    "ROUTING_HEADERS": "sluicegate.requestcontrol.parse",
    "ParsedRequest": "sluicegate.requestcontrol.parse",
    "RequestKind": "sluicegate.requestcontrol.parse",
    "parse_request": "sluicegate.requestcontrol.parse",
    "without_routing_headers": "sluicegate.requestcontrol.parse",
    "EventRewriter": "sluicegate.requestcontrol.responses",
    "ModelNameRewriter": "sluicegate.requestcontrol.responses",
    "ResponseStats": "sluicegate.requestcontrol.responses",
    "Usage": "sluicegate.requestcontrol.responses",
    "restore_model_name": "sluicegate.requestcontrol.responses",
}

if TYPE_CHECKING:
    from sluicegate.requestcontrol.director import Admitted, Director
    from sluicegate.requestcontrol.dispatch import Dispatch
    from sluicegate.requestcontrol.ids import MAX_REQUEST_ID_LENGTH, new_request_id, request_id_from
    from sluicegate.requestcontrol.jsonbytes import (
        MAX_JSON_DEPTH,
        replace_top_level_string,
        within_depth,
    )
    from sluicegate.requestcontrol.models import CRITICALITY_PRIORITY, ModelRoute, ModelTable
    from sluicegate.requestcontrol.parse import (
        CONTROL_HEADERS,
        ROUTING_HEADERS,
        ParsedRequest,
        RequestKind,
        parse_request,
        without_routing_headers,
    )
    from sluicegate.requestcontrol.responses import (
        EventRewriter,
        ModelNameRewriter,
        ResponseStats,
        Usage,
        restore_model_name,
    )


__getattr__ = lazy.exports(__name__, _EXPORTS, globals())


__all__ = [
    "CONTROL_HEADERS",
    "CRITICALITY_PRIORITY",
    "MAX_JSON_DEPTH",
    "MAX_REQUEST_ID_LENGTH",
    "ROUTING_HEADERS",
    "Admitted",
    "Director",
    "Dispatch",
    "EventRewriter",
    "ModelNameRewriter",
    "ModelRoute",
    "ModelTable",
    "ParsedRequest",
    "RequestKind",
    "ResponseStats",
    "Usage",
    "new_request_id",
    "parse_request",
    "replace_top_level_string",
    "request_id_from",
    "restore_model_name",
    "within_depth",
    "without_routing_headers",
]
