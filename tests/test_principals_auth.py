"""Authenticator: each configured key maps to its own principal; nothing else is accepted."""

from __future__ import annotations

import hashlib
import hmac

from werk_host.service.principals import Authenticator, Principal

SECRET = bytes(range(32))


def _expected(key: str, secret: bytes = SECRET) -> Principal:
    return Principal(hmac.new(secret, b"principal:" + key.encode(), hashlib.sha256).hexdigest())


def test_each_key_maps_to_its_own_principal_every_time() -> None:
    auth = Authenticator(("key-one", "key-two"), SECRET)
    for _ in range(3):
        assert auth.authenticate("key-one") == _expected("key-one")
        assert auth.authenticate("key-two") == _expected("key-two")
    assert auth.authenticate("key-one") != auth.authenticate("key-two")


def test_other_keys_are_rejected_even_after_a_valid_key_was_seen() -> None:
    auth = Authenticator(("key-one",), SECRET)
    assert auth.authenticate("key-one") is not None
    for presented in ("key-two", "key-on", "key-one ", "KEY-ONE", "", None):
        assert auth.authenticate(presented) is None


def test_a_revoked_key_is_rejected_by_the_reconfigured_authenticator() -> None:
    before = Authenticator(("old-key", "kept-key"), SECRET)
    assert before.authenticate("old-key") == _expected("old-key")
    after = Authenticator(("kept-key",), SECRET)
    assert after.authenticate("old-key") is None
    assert after.authenticate("kept-key") == _expected("kept-key")


def test_principal_depends_on_the_namespace_secret() -> None:
    other = bytes(reversed(range(32)))
    assert Authenticator(("k",), other).authenticate("k") == _expected("k", other) != _expected("k")


def test_auth_off_gives_the_local_principal() -> None:
    auth = Authenticator((), SECRET)
    local = auth.authenticate(None)
    assert local is not None and local == auth.authenticate("anything") and local != _expected("anything")
