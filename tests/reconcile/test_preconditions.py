"""The token Secret's preconditions, hashed as HyperShift hashes them (util.HashSimple).

The expected hashes were printed by Go 1.27 running HashSimple as HyperShift writes it
(`fnv.New32a` over `fmt.Sprintf("%v", o)`, printed with `%08x`), on these same inputs. The
inputs were chosen so that each form's hash begins with a zero: a hash printed without Go's
padding is one digit short for one pull secret in sixteen, and that cluster's base is held
back for ever ("pull secret does not match hash")."""

from __future__ import annotations

import pytest

from ignition_server.reconcile.generated_bases import hash_simple, precondition_failure

# input: (string, []byte, map[string]string{"a": "b", "cloud.conf": input}), as Go printed them
GO_HASH_SIMPLE = {
    "secret-63": ("9a73c54f", "013e43c4", "15d3a359"),
    "secret-64": ("9773c096", "013787ff", "15da5f1e"),
    "secret-130": ("d43e591c", "8edce400", "0e23684e"),
    "secret-642": ("0f38422c", "dc60c598", "aa06dc66"),
    "": ("811c9dc5", "741638a5", "6bb0df75"),
    "héllo": ("4aa48540", "dab29a3a", "ab55c00e"),
}


@pytest.mark.parametrize("value", sorted(GO_HASH_SIMPLE))
def test_hash_simple_prints_what_go_prints(value: str) -> None:
    as_string, as_bytes, as_map = GO_HASH_SIMPLE[value]
    assert hash_simple(value) == as_string
    assert hash_simple(value.encode()) == as_bytes
    assert hash_simple({"cloud.conf": value, "a": "b"}) == as_map


def test_a_pull_secret_whose_hash_begins_with_zero_is_accepted() -> None:
    pull_secret = "secret-63"  # HyperShift's NodePool controller wrote 013e43c4 for it
    wanted = {"pull-secret-hash": "013e43c4", "hc-configuration-hash": "c1"}
    assert precondition_failure(wanted, pull_secret, None, "c1") is None
    assert precondition_failure({**wanted, "pull-secret-hash": "13e43c4"}, pull_secret, None, "c1") \
        == "pull secret does not match hash"


def test_a_trust_bundle_whose_hash_begins_with_zero_is_accepted() -> None:
    wanted = {"additional-trust-bundle-hash": "0f38422c"}  # HashSimple of the string "secret-642"
    assert precondition_failure(wanted, None, "secret-642", "") is None
    assert precondition_failure(wanted, None, "secret-643", "") == "additionalTrustBundle does not match hash"
