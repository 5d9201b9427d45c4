"""Priority and tenant reach the scheduler's Generate request when its message type has the fields, and a message
without them is sent as before (the contract may come with or after the gateway)."""

from __future__ import annotations

from types import SimpleNamespace

from services.gateway.routing.scheduler_client import with_tenant
from services.proto_convert.scheduler_contract import generate_request_to_pb
from shared.request_io import GenerateRequest
from shared.sampling_params import SamplingParams

REQUEST = GenerateRequest("r1", [1, 2, 3], SamplingParams(max_tokens=4), priority=7, tenant="team-a")


class MessageWithTenantFields:
    """A stand-in for a generated GenerateRequest that has `priority` and `tenant`."""

    DESCRIPTOR = SimpleNamespace(fields_by_name={"req_id": None, "priority": None, "tenant": None})

    def __init__(self) -> None:
        self.priority = 0
        self.tenant = ""


class MessageWithout:
    DESCRIPTOR = SimpleNamespace(fields_by_name={"req_id": None})


def test_the_fields_are_set_where_the_message_has_them():
    sent = with_tenant(MessageWithTenantFields(), REQUEST)
    assert (sent.priority, sent.tenant) == (7, "team-a")


def test_a_message_without_the_fields_is_left_alone():
    sent = with_tenant(MessageWithout(), REQUEST)
    assert not hasattr(sent, "priority") and not hasattr(sent, "tenant")


def test_the_real_message_takes_them_if_its_contract_has_them():
    pb = with_tenant(generate_request_to_pb(REQUEST), REQUEST)
    fields = pb.DESCRIPTOR.fields_by_name
    assert pb.req_id == "r1"
    assert ("priority" not in fields or pb.priority == 7) and ("tenant" not in fields or pb.tenant == "team-a")
