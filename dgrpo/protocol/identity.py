"""A node's Ed25519 identity: the key that signs dgrpo envelopes and that is also its libp2p host key.

Using one key for both means the libp2p PeerId that gossipsub's strict signing authenticates is exactly
the peer id derived from an envelope's ``author`` field, so a receiver can check that a message's sender
and its author agree (see ``docs/protocol.md``, "Author and peer id").

The PeerId derivation follows the libp2p peer-id spec
(https://github.com/libp2p/specs/blob/master/peer-ids/peer-ids.md): the protobuf ``PublicKey`` message
``{Type: Ed25519 (1), Data: 32-byte key}`` serializes to ``08 01 12 20 || key`` (36 bytes); keys of at
most 42 bytes are "inlined" with the identity multihash ``00 24 || protobuf``; the PeerId string is the
base58btc (Bitcoin alphabet) encoding of those 38 bytes, which always starts with ``12D3KooW``.
It is implemented here (a few lines) so the protocol does not depend on libp2p's internals; a test checks
it against ``libp2p.peer.id.ID.from_pubkey``.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dgrpo.atomic import write_atomically
from dgrpo.errors import DgrpoError

PUBLIC_KEY_BYTES = 32
SEED_BYTES = 32
SIGNATURE_BYTES = 64
_ED25519_PROTOBUF_PREFIX = bytes([0x08, 0x01, 0x12, 0x20])  # field 1 (Type) = 1 (Ed25519); field 2 (Data), 32 bytes
_IDENTITY_MULTIHASH = bytes([0x00, len(_ED25519_PROTOBUF_PREFIX) + PUBLIC_KEY_BYTES])
_B58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


class IdentityError(DgrpoError):
    """An identity file is missing, unreadable, corrupt, or not an Ed25519 key."""


def base58btc(data: bytes) -> str:
    """Base58 with the Bitcoin alphabet; each leading zero byte becomes a leading '1'."""
    n = int.from_bytes(data, "big")
    out = []
    while n:
        n, r = divmod(n, 58)
        out.append(_B58_ALPHABET[r])
    zeros = len(data) - len(data.lstrip(b"\x00"))
    return "1" * zeros + "".join(reversed(out))


def peer_id_bytes_from_public_bytes(pub: bytes) -> bytes:
    """The binary libp2p PeerId (identity multihash of the protobuf public key) of an Ed25519 key."""
    if len(pub) != PUBLIC_KEY_BYTES:
        raise ValueError(f"an Ed25519 public key has {PUBLIC_KEY_BYTES} bytes, got {len(pub)}")
    return _IDENTITY_MULTIHASH + _ED25519_PROTOBUF_PREFIX + pub


@functools.lru_cache(maxsize=4096)  # every message names its author: base58 of the same few keys, again and again
def peer_id_from_public_bytes(pub: bytes) -> str:
    """The libp2p PeerId string (base58btc, ``12D3KooW...``) of a raw 32-byte Ed25519 public key."""
    return base58btc(peer_id_bytes_from_public_bytes(pub))


@dataclass(frozen=True)
class Identity:
    """An Ed25519 private key with its raw public key and libp2p PeerId."""

    private_key: Ed25519PrivateKey = field(repr=False, compare=False)
    public_bytes: bytes = field(init=False)
    peer_id: str = field(init=False)

    def __post_init__(self) -> None:
        pub = self.private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        # frozen dataclass: derived fields are set once, here
        object.__setattr__(self, "public_bytes", pub)
        object.__setattr__(self, "peer_id", peer_id_from_public_bytes(pub))

    @classmethod
    def generate(cls) -> Identity:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        """The identity of a 32-byte Ed25519 seed (RFC 8032 private key); deterministic, for tests and tools."""
        if len(seed) != SEED_BYTES:
            raise ValueError(f"an Ed25519 seed has {SEED_BYTES} bytes, got {len(seed)}")
        return cls(Ed25519PrivateKey.from_private_bytes(bytes(seed)))

    @property
    def seed(self) -> bytes:
        return self.private_key.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )

    def sign(self, data: bytes) -> bytes:
        return self.private_key.sign(data)

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> None:
        """Write the key as unencrypted PKCS#8 PEM, mode 0600, atomically.

        Refuses to replace an existing file unless ``overwrite``: losing a node's key changes its identity.
        """
        pem = self.private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        target = Path(path)
        try:
            write_atomically(target, pem, overwrite=overwrite, mode=0o600)
        except FileExistsError as e:
            raise IdentityError(f"identity file {target} exists; pass overwrite=True to replace it") from e
        except OSError as e:
            raise IdentityError(f"cannot write identity file {target}: {e}") from e

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Identity:
        target = Path(path)
        try:
            pem = target.read_bytes()
        except FileNotFoundError as e:
            raise IdentityError(f"identity file {target} does not exist") from e
        except OSError as e:
            raise IdentityError(f"cannot read identity file {target}: {e}") from e
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as e:
            raise IdentityError(f"identity file {target} is not an unencrypted PEM private key: {e}") from e
        if not isinstance(key, Ed25519PrivateKey):
            raise IdentityError(f"identity file {target} holds a {type(key).__name__}, not an Ed25519 key")
        return cls(key)

    def to_libp2p_keypair(self) -> Any:
        """The same key as a ``libp2p.crypto.keys.KeyPair``, so the libp2p host's PeerId equals :attr:`peer_id`.

        libp2p is imported lazily: validating and signing messages does not need it (it takes ~1.5 s to import).
        """
        from libp2p.crypto.ed25519 import create_new_key_pair

        return create_new_key_pair(self.seed)
