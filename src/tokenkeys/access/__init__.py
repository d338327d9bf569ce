"""Access control: TLS certificates and bearer tokens, for servers and their clients.

``tls`` loads certificate files into gRPC credentials and uvicorn options; ``token`` loads and
checks bearer tokens (never printed); ``channel`` opens client channels with both.
"""

from tokenkeys.access.channel import ChannelSecurity
from tokenkeys.access.tls import ClientTls, ServerTls
from tokenkeys.access.token import BearerTokens, load_token

__all__ = ["BearerTokens", "ChannelSecurity", "ClientTls", "ServerTls", "load_token"]
