"""Property-based fuzzing of every request message of every served gRPC service.

Messages are drawn from their protobuf descriptors (random field values, oversize repeated
fields, invalid ids, unknown enum values, nested messages), plus random bytes sent as the
message. A real server (OpenEngineTokenizer with cache keys, Control, Inference) answers each
with OK or a documented status, never UNKNOWN or INTERNAL, and keeps serving (Health after
every example). Budgets are bounded: a few dozen examples per method, derandomized.
"""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest
from engine_stack import default_models, start_stack
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenkeys._gen.openengine.v1 import (
    lifecycle_pb2,
    openengine_pb2,
    openengine_pb2_grpc,
    tokenizer_pb2,
)
from tokenkeys.engine.config import EngineConfig
from tokenkeys.keys.deployment import KeySpecOptions, build_spec
from tokenkeys.limits import Limits
from tokenkeys.serving.models import attach_cache_keys

ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.DATA_LOSS,
    grpc.StatusCode.DEADLINE_EXCEEDED,  # the fuzzer's own per-call deadline
}
SERVICES = ("OpenEngineTokenizer", "Control", "Inference")
# Limits small enough that oversize repeated fields reach them within a small example.
LIMITS = Limits(
    max_request_bytes=64 * 1024,
    max_texts_per_request=16,
    max_tokens_per_text=512,
    max_tokens_per_request=1024,
)
_TEXT = st.text(max_size=40) | st.sampled_from(["", "smollm2-135m-instruct", "\x00", "a" * 300])
_SCALARS = {
    FieldDescriptor.TYPE_BOOL: st.booleans(),
    FieldDescriptor.TYPE_STRING: _TEXT,
    FieldDescriptor.TYPE_BYTES: st.binary(max_size=40),
    FieldDescriptor.TYPE_DOUBLE: st.floats(allow_nan=True, allow_infinity=True),
    FieldDescriptor.TYPE_FLOAT: st.floats(width=32, allow_nan=True, allow_infinity=True),
    FieldDescriptor.TYPE_INT32: st.integers(-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: st.integers(-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: st.integers(-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: st.integers(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: st.integers(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: st.integers(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: st.integers(0, 2**32 - 1) | st.sampled_from([0, 1, 49151, 49152]),
    FieldDescriptor.TYPE_FIXED32: st.integers(0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: st.integers(0, 2**64 - 1) | st.sampled_from([0, 1, 2**63]),
    FieldDescriptor.TYPE_FIXED64: st.integers(0, 2**64 - 1),
}


def _repeated(field: FieldDescriptor) -> bool:
    # protobuf 6 (upb) has is_repeated; older releases only the label.
    if hasattr(field, "is_repeated"):
        return bool(field.is_repeated)
    return field.label == FieldDescriptor.LABEL_REPEATED


def _field_value(field: FieldDescriptor, depth: int) -> st.SearchStrategy:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return _message(field.message_type, depth + 1)
    if field.type == FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        return st.sampled_from(known) | st.integers(-5, 1000)  # unknown values too
    return _SCALARS[field.type]


def _message(descriptor, depth: int = 0) -> st.SearchStrategy:  # noqa: ANN001
    """Messages of ``descriptor``: each field present or not, repeated ones up to oversize."""
    cls = GetMessageClass(descriptor)
    if depth > 3 or descriptor.full_name.startswith("google.protobuf."):
        return st.just(cls())
    fields = {}
    for field in descriptor.fields:
        value = _field_value(field, depth)
        if _repeated(field):
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                continue
            big = st.lists(value, min_size=17, max_size=40) if depth == 0 else st.nothing()
            fields[field.name] = st.lists(value, max_size=4) | big
        else:
            fields[field.name] = st.none() | value

    @st.composite
    def build(draw) -> object:  # noqa: ANN001
        message = cls()
        for name, strategy in fields.items():
            value = draw(strategy)
            if value is None or value == []:
                continue
            field = descriptor.fields_by_name[name]
            try:
                if _repeated(field):
                    getattr(message, name).extend(value)
                elif field.type == FieldDescriptor.TYPE_MESSAGE:
                    getattr(message, name).CopyFrom(value)
                else:
                    setattr(message, name, value)
            except (ValueError, TypeError):
                continue  # e.g. a string with lone surrogates
        return message

    return build()


def _methods() -> list[tuple[str, object, object, bool]]:
    services = {
        **openengine_pb2.DESCRIPTOR.services_by_name,
        **tokenizer_pb2.DESCRIPTOR.services_by_name,
    }
    found = []
    for service in SERVICES:
        desc = services[service]
        for method in desc.methods:
            path = f"/openengine.v1.{service}/{method.name}"
            found.append((path, method.input_type, method.output_type, method.server_streaming))
    return found


METHODS = _methods()


class _Server:
    """The engine stack on its own loop and thread, for blocking hypothesis tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.stack = self._run(self._start())

    async def _start(self):  # noqa: ANN202
        models = default_models()
        attach_cache_keys(models, build_spec(KeySpecOptions(block_size=16)), LIMITS)
        return await start_stack(EngineConfig(kv_events=False), models=models, limits=LIMITS)

    def _run(self, coro):  # noqa: ANN001, ANN202
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def close(self) -> None:
        self._run(self.stack.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@pytest.fixture(scope="module")
def channel():
    server = _Server()
    with grpc.insecure_channel(server.stack.target) as ch:
        yield ch
    server.close()


def _call(channel: grpc.Channel, path: str, streaming: bool, payload: bytes) -> grpc.StatusCode:
    """Send raw bytes as the request; read a stream for a moment, then cancel it."""
    if not streaming:
        call = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
        try:
            call(payload, timeout=10)
            return grpc.StatusCode.OK
        except grpc.RpcError as error:
            return error.code()
    stream = channel.unary_stream(path, request_serializer=None, response_deserializer=None)
    # A valid subscription waits for events that never come: its deadline ends it.
    responses = stream(payload, timeout=0.2 if path.endswith("SubscribeKvEvents") else 10)
    try:
        for count, _ in enumerate(responses):
            if count >= 50:
                break
        code = grpc.StatusCode.OK
    except grpc.RpcError as error:
        code = error.code()
    finally:
        responses.cancel()
    return code


def _still_serving(channel: grpc.Channel) -> None:
    health = openengine_pb2_grpc.ControlStub(channel).Health(
        lifecycle_pb2.HealthRequest(), timeout=10
    )
    assert health.state == lifecycle_pb2.HEALTH_STATE_READY


def _assert_documented(code: grpc.StatusCode, path: str, message: object) -> None:
    assert code in ALLOWED, f"{path} answered {code.name} to {message!r}"


@pytest.mark.parametrize(("path", "request_type", "response_type", "streaming"), METHODS)
def test_random_messages_get_documented_statuses(
    channel, path: str, request_type, response_type, streaming: bool
) -> None:
    @settings(
        max_examples=25,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(_message(request_type))
    def check(message) -> None:  # noqa: ANN001
        payload = message.SerializeToString()
        _assert_documented(_call(channel, path, streaming, payload), path, message)

    check()
    _still_serving(channel)


@pytest.mark.parametrize(("path", "request_type", "response_type", "streaming"), METHODS)
def test_random_bytes_as_the_message(
    channel, path: str, request_type, response_type, streaming: bool
) -> None:
    @settings(max_examples=15, deadline=None, derandomize=True)
    @given(st.binary(max_size=64) | st.sampled_from([b"\xff" * 8, b"\x0a\xff\xff\xff\xff\x0f"]))
    def check(payload: bytes) -> None:
        _assert_documented(_call(channel, path, streaming, payload), path, payload)

    check()
    _still_serving(channel)


def test_every_served_method_is_fuzzed() -> None:
    paths = {m[0] for m in METHODS}
    assert "/openengine.v1.OpenEngineTokenizer/ComputeCacheKeys" in paths
    assert "/openengine.v1.Inference/Generate" in paths
    assert "/openengine.v1.Control/SubscribeKvEvents" in paths
