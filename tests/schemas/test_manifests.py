"""Reading manifests: every bad document gets one message naming file, document and field."""

from pathlib import Path

import msgspec

from dralloc.manifests import load_paths, load_text
from dralloc.schemas.resource import KINDS, Pod, ResourceClaim

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_corpus_round_trips_losslessly(shared_dir):
    import yaml

    for path in sorted((shared_dir / "corpus" / "upstream-verdicts").glob("*.yaml"))[:80]:
        for doc in list(yaml.safe_load_all(path.read_text()))[1:]:
            obj = msgspec.convert(doc, KINDS[(doc["apiVersion"], doc["kind"])])
            assert msgspec.to_builtins(obj) == doc, f"{path}: {doc['kind']}/{doc['metadata']['name']}"


def test_seed_manifest_reads_with_pod_kept(shared_dir):
    manifests = load_paths([shared_dir / "examples"])
    assert manifests.errors == []
    (pod,) = manifests.of_type(Pod)
    assert pod.spec.resource_claims[0].resource_claim_template_name == "h100-nvlink-template"


def test_errors_name_file_document_and_field_and_reading_goes_on():
    text = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: bad}
spec: {devices: {requests: [{name: a, exactly: {deviceClassName: g, count: two}}]}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: good, namespace: team}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
"""
    manifests = load_text(text, "claims.yaml")
    (error,) = manifests.errors
    assert str(error) == ("claims.yaml (document 1): ResourceClaim/bad: field spec.devices.requests[0].exactly.count: Expected `int | null`, got `str`")
    (good,) = manifests.of_type(ResourceClaim)
    assert good.key == "team/good"
    assert [s.kind for s in manifests.skipped] == ["Deployment"]


def test_yaml_syntax_error_names_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("kind: ResourceClaim\nmetadata: {name: x\n")
    (error,) = load_paths([path]).errors
    assert str(error).startswith(f"{path} (document 1): invalid YAML at line")


def test_old_api_version_is_an_error_not_a_skip():
    manifests = load_text("apiVersion: resource.k8s.io/v1beta1\nkind: DeviceClass\nmetadata: {name: x}\n")
    assert "use resource.k8s.io/v1" in str(manifests.errors[0])


def test_unreadable_and_directory_inputs(tmp_path):
    (tmp_path / "b.yaml").write_text("apiVersion: v1\nkind: Node\nmetadata: {name: b}\n")
    (tmp_path / "a.json").write_text('{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "a"}}')
    (tmp_path / "notes.txt").write_text("ignored")
    manifests = load_paths([tmp_path, tmp_path / "missing.yaml"])
    assert [item.obj.metadata.name for item in manifests.objects] == ["a", "b"]
    assert "cannot read file" in str(manifests.errors[0])


def test_a_file_with_no_size_to_trust_is_read_only_up_to_the_limit():
    """/dev/zero says it holds 0 bytes and never ends: refused at the limit with a message, not
    read until memory runs out (a file still growing, or a pipe, is the same)."""
    manifests = load_paths(["/dev/zero", EXAMPLES / "deviceclasses.yaml"])
    assert [str(e) for e in manifests.errors] == ["/dev/zero: cannot read file: larger than 16 MiB"]
    assert manifests.objects  # reading goes on


def test_windows_line_ends_read_as_unix_ones(tmp_path):
    text = "apiVersion: v1\nkind: Node\nmetadata:\n  name: a\n  labels: {zone: x}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: b}\n"
    (tmp_path / "unix.yaml").write_bytes(text.encode())
    (tmp_path / "windows.yaml").write_bytes(text.replace("\n", "\r\n").encode())
    unix, windows = load_paths([tmp_path / "unix.yaml"]), load_paths([tmp_path / "windows.yaml"])
    assert not windows.errors
    assert [msgspec.to_builtins(item.obj) for item in windows.objects] == [msgspec.to_builtins(item.obj) for item in unix.objects]
    assert len(unix.objects) == 2


CLAIM_JSON = (
    '{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c", "namespace": "ns"},'
    ' "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2,'
    ' "selectors": [{"cel": {"expression": "device.attributes[\\"gpu.nvidia.com\\"].productName == \\"H100\\""}}]}}]}}}'
)


def test_a_json_file_reads_as_the_yaml_parser_reads_it(tmp_path):
    # .json takes msgspec's decoder; the same text as .yaml the YAML parser: the objects are equal
    (tmp_path / "c.json").write_text(CLAIM_JSON)
    (tmp_path / "c.yaml").write_text(CLAIM_JSON)
    as_json, as_yaml = load_paths([tmp_path / "c.json"]), load_paths([tmp_path / "c.yaml"])
    assert not as_json.errors and not as_yaml.errors
    assert as_json.objects[0].obj == as_yaml.objects[0].obj
    assert str(as_json.objects[0].source) == f"{tmp_path / 'c.json'} (document 1)"


def test_a_json_file_that_is_not_one_json_object_goes_to_the_yaml_parser(tmp_path):
    yaml_in_json = tmp_path / "yaml.json"  # YAML under a .json name: read as before
    yaml_in_json.write_text("apiVersion: v1\nkind: Node\nmetadata: {name: n}\n")
    broken = tmp_path / "broken.json"  # neither: the YAML parser names the problem
    broken.write_text('{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "x"}')
    deep = tmp_path / "deep.json"  # beyond the nesting limit: refused, not decoded
    deep.write_text('{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "d", "labels": ' + "[" * 200 + "]" * 200 + "}}")
    manifests = load_paths([yaml_in_json, broken, deep])
    assert [item.obj.metadata.name for item in manifests.objects] == ["n"]
    assert len(manifests.errors) == 2
    assert "invalid YAML" in str(manifests.errors[0])
    assert "deep" in str(manifests.errors[1]) and "nested" in str(manifests.errors[1])


def test_a_json_object_checked_as_text_is_not_walked_again(tmp_path, monkeypatch):
    # json_problem passed its text, so tree_problem's walk of the decoded object is skipped (the submit path's per-claim cost)
    import dralloc.manifests as manifests_module

    walked = []
    monkeypatch.setattr(manifests_module, "tree_problem", lambda doc, where="": walked.append(doc))
    (tmp_path / "c.json").write_text(CLAIM_JSON)
    (tmp_path / "c.yaml").write_text(CLAIM_JSON)
    assert not load_paths([tmp_path / "c.json"]).errors and walked == []
    assert not load_paths([tmp_path / "c.yaml"]).errors and len(walked) == 1  # YAML is still walked


def test_json_and_yaml_refuse_the_same_depth_and_integers(tmp_path):
    # what skips the walk for JSON is refused as the walk refuses it: depth exactly at and past the limit, int64's edges
    from dralloc.schemas.limits import INT_MAX, INT_MIN, MAX_DEPTH

    def node(labels: str) -> str:
        return '{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "annotations": {"x": "y"}}, "extra": ' + labels + "}"

    # the object itself is 1 level, "extra" a 2nd: the list nesting brings it to `levels`
    cases = {f"depth{levels}": node("[" * (levels - 1) + "]" * (levels - 1)) for levels in (MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, MAX_DEPTH + 2)}
    cases |= {f"int{i}": node(f"[{value}]") for i, value in enumerate((INT_MAX, INT_MAX + 1, INT_MIN, INT_MIN - 1, 10**30))}
    refused = {}
    for name, text in cases.items():
        (tmp_path / f"{name}.json").write_text(text)
        (tmp_path / f"{name}.yaml").write_text(text)
        as_json, as_yaml = load_paths([tmp_path / f"{name}.json"]), load_paths([tmp_path / f"{name}.yaml"])
        assert bool(as_json.errors) == bool(as_yaml.errors), name
        refused[name] = bool(as_json.errors)
    assert refused == {
        f"depth{MAX_DEPTH - 1}": False, f"depth{MAX_DEPTH}": False, f"depth{MAX_DEPTH + 1}": True, f"depth{MAX_DEPTH + 2}": True,
        "int0": False, "int1": True, "int2": False, "int3": True, "int4": True,
    }  # fmt: skip


def test_unknown_fields_are_refused_and_named_as_kubectl_strict_validation_does():
    """A misspelt field would otherwise be dropped in silence: `selector` for `selectors` makes a
    claim for any device of its class."""
    text = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: typo}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        selector: [{cel: {expression: 'device.attributes["gpu.nvidia.com"].productName == "H200"'}}]
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: many, namspace: x}
spec:
  driver: gpu.nvidia.com
  pool: {name: p, generation: 1, resourceSliceCount: 1, size: 3}
  nodeName: n
  devices:
  - {name: gpu-0, attributes: {model: {strng: H200}}, capacty: {}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: exported
  namespace: ml
  selfLink: /apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/exported
  deletionGracePeriodSeconds: 0
  managedFields: [{manager: kubectl, operation: Update, fieldsV1: {f:spec: {}}}]
spec:
  devices:
    requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]
    config: [{opaque: {driver: gpu.nvidia.com, parameters: {anything: {the: driver reads}}}}]
status:
  devices: [{driver: gpu.nvidia.com, pool: p, device: gpu-0, networkData: {interfaceName: eth1}}]
  somethingNewer: true
---
apiVersion: v1
kind: Pod
metadata: {name: trainer}
spec:
  containers: [{name: main, image: trainer, imagePullPolicy: Always}]
  priorityClassName: high
"""
    manifests = load_text(text, "typo.yaml")
    assert [str(e) for e in manifests.errors] == [
        'typo.yaml (document 1): ResourceClaim/typo: unknown field "spec.devices.requests[0].exactly.selector": not in resource.k8s.io/v1 '
        "as dralloc reads it (Kubernetes 1.37); a misspelt field, or a newer Kubernetes field dralloc does not support",
        'typo.yaml (document 2): ResourceSlice/many: unknown fields "metadata.namspace", "spec.devices[0].attributes[model].strng", '
        '"spec.devices[0].capacty" and 1 more: not in resource.k8s.io/v1 as dralloc reads it (Kubernetes 1.37); '
        "a misspelt field, or a newer Kubernetes field dralloc does not support",
    ]
    # ObjectMeta's fields dralloc does not read, a status a cluster wrote and a driver's opaque
    # parameters are not dralloc's to judge; other API groups (a Pod) are read as before
    assert [item.obj.metadata.name for item in manifests.objects] == ["exported", "trainer"]


def test_a_flood_of_long_unknown_fields_gets_one_short_message():
    """Hostile input: 10,000 unknown keys of 500 characters name three, cut, and the count."""
    doc = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "flood"}, "spec": {}}
    doc["spec"].update({f"{i:05d}" + "x" * 495: 1 for i in range(10_000)})
    (error,) = load_text(msgspec.json.encode(doc).decode(), "flood.json").errors
    assert len(str(error)) < 800
    assert str(error).count('"spec.') == 3 and "and 9997 more" in str(error)
