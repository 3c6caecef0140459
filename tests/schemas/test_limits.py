"""Untrusted bytes: nesting, absurd integers and bad names are refused with a reason, never a RecursionError."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dralloc.discovery.fleet import build_fleet
from dralloc.manifests import load_text
from dralloc.schemas import events as ev
from dralloc.schemas.limits import _BRACKETS_ONLY, MAX_DEPTH, _brackets, _without_strings, json_problem, tree_problem

DEEP = "[" * 1000 + "]" * 1000  # about 2 KB: what the 3 KB poison looks like


def claim_doc(name: str = "c", namespace: str = "team-a", **extra) -> dict:
    return {
        "type": "ClaimSubmitted",
        "claim": {
            "metadata": {"name": name, "namespace": namespace, "uid": "u-1"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
        },
        **extra,
    }


def with_parameters(doc: dict, parameters: object) -> dict:
    doc["claim"]["spec"]["devices"]["config"] = [{"opaque": {"driver": "gpu.nvidia.com", "parameters": parameters}}]
    return doc


def test_a_valid_claim_decodes():
    event = ev.decode(json.dumps(with_parameters(claim_doc(), {"a": [[1, 2], {"b": 9223372036854775807}]})).encode())
    assert isinstance(event, ev.ClaimSubmitted) and event.claim.key == "team-a/c"


@pytest.mark.parametrize(
    "payload",
    [
        # in a claim's opaque parameters (carried, never read), in an unknown field, and alone
        json.dumps(with_parameters(claim_doc(), "X")).replace('"X"', DEEP),
        json.dumps(claim_doc(unknownField="X")).replace('"X"', DEEP),
        json.dumps({"type": "ClaimDeleted", "namespace": "a", "name": "b", "x": "X"}).replace('"X"', '{"k":' * 1000 + "1" + "}" * 1000),
        DEEP,
    ],
    ids=["parameters", "unknown-field", "objects", "bare"],
)
def test_deep_nesting_is_refused_before_decoding(payload):
    with pytest.raises(ev.EventDecodeError, match=f"nested more than {MAX_DEPTH} levels"):
        ev.decode(payload.encode())


def test_nesting_just_within_the_limit_decodes_and_brackets_in_strings_do_not_count():
    inner = MAX_DEPTH - 7  # the event envelope around `parameters` takes 7 levels
    doc = with_parameters(claim_doc(), json.loads("[" * inner + "]" * inner))
    doc["claim"]["metadata"]["annotations"] = {"text": "[" * 5000 + '\\"{' * 100}
    assert isinstance(ev.decode(json.dumps(doc).encode()), ev.ClaimSubmitted)
    too_deep = with_parameters(claim_doc(), json.loads("[" * (inner + 1) + "]" * (inner + 1)))
    with pytest.raises(ev.EventDecodeError, match="nested more than"):
        ev.decode(json.dumps(too_deep).encode())


def test_an_integer_outside_int64_is_refused_at_decode():
    doc = claim_doc()
    doc["claim"]["metadata"]["generation"] = 1
    text = json.dumps(doc).replace('"generation": 1', '"generation": ' + "9" * 400)
    with pytest.raises(ev.EventDecodeError, match="an integer of 400 digits"):
        ev.decode(text.encode())
    edge = json.dumps(doc).replace('"generation": 1', '"generation": 9223372036854775808')
    with pytest.raises(ev.EventDecodeError, match="64-bit"):
        ev.decode(edge.encode())
    fine = json.dumps(doc).replace('"generation": 1', '"generation": 9223372036854775807')
    assert ev.decode(fine.encode()).claim.metadata.generation == 2**63 - 1
    # long digit runs that are not integers: a string, a fraction
    assert json_problem(b'{"a": "' + b"9" * 400 + b'", "b": 0.' + b"1" * 40 + b"}") is None


def test_a_slice_with_hundreds_of_brackets_is_judged_by_its_structure_not_its_strings():
    # An inventory slice: far more brackets than MAX_DEPTH, all structure, none in a string.
    ((_, slices),) = build_fleet([("h200-sxm-mig", 1)])
    published = [ev.encode(ev.ResourceSlicePublished(slice=s)) for s in slices]
    assert max(data.count(b"[") + data.count(b"{") for data in published) > 10 * MAX_DEPTH
    assert [json_problem(data) for data in published] == [None] * len(published)
    doc = json.loads(max(published, key=len))
    attributes = doc["slice"]["spec"]["devices"][0]["attributes"]
    # Brackets in a string are text, whether they would open levels or close them: closers in a
    # string before a nesting past the limit do not hide it, openers do not make a slice too deep.
    attributes["note"] = {"string": "]" * 2 * MAX_DEPTH}
    attributes["x"] = {"string": "[" * 2 * MAX_DEPTH}
    assert json_problem(json.dumps(doc, separators=(",", ":"))) is None
    deep = MAX_DEPTH  # (inside the slice's own levels: past the limit)
    attributes["y"] = {"string": json.loads("[" * deep + "]" * deep)}
    assert json_problem(json.dumps(doc, separators=(",", ":"))) == f"nested more than {MAX_DEPTH} levels deep"
    del attributes["note"], attributes["x"]
    assert json_problem(json.dumps(doc, separators=(",", ":"))) == f"nested more than {MAX_DEPTH} levels deep"


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet='[]{}"\\a:,', max_size=60))
def test_the_structure_is_the_same_by_either_path(text):
    # `_brackets` takes a shortcut when no string holds a bracket; any text (malformed, escaped
    # quotes, brackets in strings) gives the structure the strings-removed text gives.
    raw = text.encode()
    assert _brackets(raw) == _without_strings(raw).translate(*_BRACKETS_ONLY)


@pytest.mark.parametrize("name", ["a b", "a\tb", "a*", "a>", "a%20b", "a\x00b", "A", "-a", "a_b", "a/b", "x" * 254, ""])
def test_a_claim_name_the_api_server_refuses_is_refused_at_decode(name):
    with pytest.raises(ev.EventDecodeError, match="metadata.name: .* is not a DNS subdomain"):
        ev.decode(json.dumps(claim_doc(name=name)).encode())


def test_namespaces_are_dns_labels_so_claim_keys_are_injective():
    # team-a/b + c and team-a + b/c were one key (team-a/b/c) and one uid: neither is a valid name now.
    for namespace, name in (("team-a/b", "c"), ("team-a", "b/c")):
        with pytest.raises(ev.EventDecodeError):
            ev.decode(json.dumps(claim_doc(name=name, namespace=namespace)).encode())
        for kind in ("ClaimDeleted", "AllocationReleased"):
            with pytest.raises(ev.EventDecodeError, match="is not a DNS"):
                ev.decode(json.dumps({"type": kind, "namespace": namespace, "name": name, "uid": "u"}).encode())
    with pytest.raises(ev.EventDecodeError, match="DNS label"):
        ev.decode(json.dumps(claim_doc(namespace="a.b")).encode())  # a namespace is a label: no dots
    # A name may hold dots (a DNS subdomain): its subject token is still one token, and distinct.
    dotted = ev.decode(json.dumps(claim_doc(name="a.b")).encode())
    assert dotted.subject == "dra.claims.team-a.a%2Eb" != ev.ClaimDeleted(namespace="team-a", name="a-b").subject


def test_tree_problem_walks_without_recursion():
    deep: list = []
    node = deep
    for _ in range(50_000):  # far past the recursion limit
        node.append([])
        node = node[0]
    assert "nested more than" in tree_problem(deep)
    assert tree_problem({"a": [1, {"b": 10**30}]}) == "a.1.b: an integer of 31 digits, outside the 64-bit range"
    assert tree_problem({"a": [1, {"b": 2**63 - 1, "c": True, "d": 1.5e300}]}) is None


MANIFEST = """apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: NAME, namespace: ml}
spec:
  devices:
    requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]
    config: [{opaque: {driver: gpu.nvidia.com, parameters: PARAMS}}]
"""


def test_a_manifest_nested_past_the_limit_is_an_error_naming_file_object_and_field():
    deep = "[" * 990 + "]" * 990  # libyaml parses it (its own limit is 1,000); encoding it would recurse
    text = MANIFEST.replace("NAME", "deep").replace("PARAMS", deep) + "---\n" + MANIFEST.replace("NAME", "fine").replace("PARAMS", "{a: 1}")
    result = load_text(text, "claims.yaml")
    assert [item.obj.metadata.name for item in result.objects] == ["fine"]
    (error,) = result.errors
    assert str(error).startswith("claims.yaml (document 1): ResourceClaim/deep: spec.devices.config.0.opaque.parameters.0.0.")
    assert str(error).endswith(f"nested more than {MAX_DEPTH} levels deep")
    huge = load_text(MANIFEST.replace("NAME", "big").replace("PARAMS", "{a: 1}").replace("name: big,", "name: big, generation: " + "9" * 400 + ","), "g.yaml")
    assert not huge.objects and "metadata.generation: an integer of 400 digits" in str(huge.errors[0])
