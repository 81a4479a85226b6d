"""``success_json`` writes the envelope's text itself (so a serialized ``data`` can be reused):
it must equal the text of the :class:`SuccessEnvelope` model, which the OpenAPI document
describes, for every kind of ``data`` a route answers with."""

from __future__ import annotations

import pytest

from werk_host.protocol import Capability, CapabilityId, CapabilityStatus, StatePage, TokenCount
from werk_host.protocol.envelope import ProtocolVersion, SuccessEnvelope, data_json, success_json, success_json_text

_CAPS = tuple(
    Capability(id=cap_id, status=CapabilityStatus.SUPPORTED, detail='naïve "quoted" \\ détail\n', operations=["x"])
    for cap_id in list(CapabilityId)[:4]
)
DATA: list[object] = [
    _CAPS,
    list(_CAPS),
    StatePage(states=[], next_cursor="abc.def"),
    TokenCount(model="m\u2028odel", input_tokens=7),
    {"nested": [1, 2.5, None, True, {"k": "ü"}]},
    None,
]


@pytest.mark.parametrize("data", DATA, ids=lambda d: type(d).__name__)
@pytest.mark.parametrize("request_id", ["req_AbC-_09", 'req_"odd"\\id\u00e9'])
def test_success_text_equals_the_model_s_serialization(data: object, request_id: str) -> None:
    expected = SuccessEnvelope(protocol=ProtocolVersion(), request_id=request_id, data=data).model_dump_json()
    assert success_json(request_id, data) == expected
    assert success_json_text(request_id, data_json(data)) == expected
