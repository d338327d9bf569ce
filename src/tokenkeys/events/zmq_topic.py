"""The ZMQ topic of a model's KV-event stream: one builder, refusing what consumers cannot parse.

The topic is ``kv@<host:port>@<model>`` by default (vLLM's own publisher leaves it empty; llm-d
named this form). llm-d's subscriber reads the pod and the model back by splitting the topic on
``'@'`` and taking the parts only when there are exactly three (llm-d-kv-cache
``pkg/kvevents/engineadapter/common.go`` ``parseTopic``, commit 4c8e9ef9; otherwise the whole
topic becomes the pod and the model is lost). A served name or an address holding ``'@'``
would shift that split, so :func:`make_topic` refuses it at start instead of publishing
events nobody can attribute.
"""

from __future__ import annotations

import string

from tokenkeys.errors import ConfigError

#: Topic of each model's stream unless configured; ``{address}`` is this server's routable
#: gRPC ``host:port``, ``{model}`` the served name.
DEFAULT_TOPIC = "kv@{address}@{model}"
#: The placeholders a topic template may use.
TOPIC_FIELDS = frozenset({"address", "model"})
#: The separator consumers split a topic on (llm-d's ``parseTopic``).
SEPARATOR = "@"
#: How each placeholder's value is named in a refusal (the flag that sets it).
_NAMED = {
    "address": ("advertised gRPC address", "--advertise-host, --grpc-port"),
    "model": ("served model name", "--served-model-name, --model NAME=DIR"),
}


def check_template(template: str) -> None:
    """A topic template is valid ``str.format`` text using only :data:`TOPIC_FIELDS`."""
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as exc:
        raise ConfigError(
            f"kv_events_topic {template!r} is not a valid template: {exc}",
            field="kv_events_topic",
        ) from None
    unknown = sorted(fields - TOPIC_FIELDS)
    if unknown:
        raise ConfigError(
            f"kv_events_topic {template!r} uses {unknown}; the placeholders are {{address}} "
            "(this server's host:port) and {model} (the served name)",
            field="kv_events_topic",
        )


def make_topic(address: str, model: str, template: str = DEFAULT_TOPIC) -> str:
    """The topic of ``model``'s stream from ``template``; a value consumers cannot split back
    (empty, or holding ``'@'``) is refused naming the setting and the consumer's rule."""
    check_template(template)
    for name, value in (("address", address), ("model", model)):
        if f"{{{name}}}" not in template:
            continue
        if not value or SEPARATOR in value:
            field = "served-model-name" if name == "model" else "advertise-host"
            label, flags = _NAMED[name]
            raise ConfigError(
                f"{label} {value!r} (set by {flags}) cannot go into the KV-event topic "
                f"{template!r}: it must be non-empty and contain no {SEPARATOR!r}, because "
                f"subscribers split kv@<host:port>@<model> on {SEPARATOR!r} into "
                "exactly three parts (llm-d's parseTopic); serve the model under a name without it",
                field=field,
            )
    return template.format(address=address, model=model)
