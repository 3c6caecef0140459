"""API validation: what the API server would reject is rejected, naming the field."""

import pytest

from dralloc.manifests import load_text
from dralloc.schemas.validation import REQUESTS_MAX, fully_qualified_name_error, is_dns_label, is_dns_subdomain, qualified_name_error, validate


def one(text: str):
    manifests = load_text(text)
    assert not manifests.errors, manifests.errors
    (item,) = manifests.objects
    return item.obj


def claim(requests: str, extra: str = "") -> str:
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: c}}
spec:
  devices:
    requests: {requests}
{extra}
"""


def messages(obj) -> list[str]:
    return [str(e) for e in validate(obj)]


def test_valid_claim_has_no_errors():
    assert messages(one(claim("[{name: gpu, exactly: {deviceClassName: gpu.nvidia.com, count: 2}}]"))) == []


@pytest.mark.parametrize(
    ("requests", "extra", "expected"),
    [
        ("[{name: Gpu_1, exactly: {deviceClassName: g}}]", "", "spec.devices.requests[0].name: 'Gpu_1' must be a DNS label"),
        ("[{name: a, exactly: {deviceClassName: g}}, {name: a, exactly: {deviceClassName: g}}]", "", "duplicate request name 'a'"),
        ("[{name: a}]", "", "exactly one of exactly and firstAvailable must be set"),
        ("[{name: a, exactly: {deviceClassName: g, count: 0}}]", "", "spec.devices.requests[0].exactly.count: must be greater than zero"),
        ("[{name: a, exactly: {deviceClassName: g, allocationMode: All, count: 2}}]", "", "must not be set when allocationMode is All"),
        (
            "[{name: a, exactly: {deviceClassName: g}}]",
            "    constraints: [{requests: [b], matchAttribute: gpu.nvidia.com/uuid}]",
            "spec.devices.constraints[0].requests[0]: 'b' is not the name of a request",
        ),
        (
            "[{name: a, exactly: {deviceClassName: g}}]",
            "    constraints: [{matchAttribute: numa}]",
            "must be fully qualified (domain/name)",
        ),
        (
            "[{name: a, firstAvailable: [{name: x, deviceClassName: g}, {name: x, deviceClassName: g}]}]",
            "",
            "spec.devices.requests[0].firstAvailable[1].name: duplicate subrequest name 'x'",
        ),
    ],
)
def test_invalid_claims_name_the_field(requests, extra, expected):
    found = messages(one(claim(requests, extra)))
    assert any(expected in m for m in found), found


def test_request_limit_is_named():
    requests = "[" + ", ".join(f"{{name: r{i}, exactly: {{deviceClassName: g}}}}" for i in range(REQUESTS_MAX + 1)) + "]"
    assert any(f"at most {REQUESTS_MAX} requests, has {REQUESTS_MAX + 1}" in m for m in messages(one(claim(requests))))


def test_slice_rules():
    obj = one(
        """
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: s}
spec:
  driver: nvidia.com/gpu
  pool: {name: p, generation: 1, resourceSliceCount: 1}
  nodeName: n
  allNodes: true
  devices:
  - {name: gpu-0, attributes: {model: {string: a, int: 1}}}
  - {name: gpu-0}
"""
    )
    found = messages(obj)
    assert "spec.driver: 'nvidia.com/gpu' must be a DNS subdomain (e.g. gpu.nvidia.com)" in found
    assert any("exactly one of nodeName, nodeSelector" in m for m in found)
    assert "spec.devices[1].name: duplicate device name 'gpu-0'" in found
    assert any("spec.devices[0].attributes[model]: exactly one of int, bool" in m for m in found)


def test_counter_sets_and_what_devices_consume_are_checked_as_the_api_server_does():
    obj = one(
        """
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: s}
spec:
  driver: gpu.nvidia.com
  pool: {name: p, generation: 1, resourceSliceCount: 1}
  nodeName: n
  sharedCounters:
  - {name: gpu-0, counters: {memory: {value: 80Gi}, SMs: {value: "132"}}}
  - {name: gpu-0, counters: {memory: {value: 80Gi}}}
  - {name: Board, counters: {}}
  devices:
  - name: a
    consumesCounters:
    - {counterSet: gpu-0, counters: {memory: {value: 1Gi}}}
    - {counterSet: gpu-0, counters: {"mem/x": {value: 1Gi}}}
  - name: b
    consumesCounters:
    - {counterSet: gpu-0, counters: {memory: {value: 1Gi}}}
    - {counterSet: gpu-1, counters: {memory: {value: 1Gi}}}
    - {counterSet: gpu-2, counters: {memory: {value: 1Gi}}}
  - name: c
    consumesCounters:
    - {counterSet: gpu-0, counters: {}}
  - name: d
    consumesCounters:
    - {counterSet: gpu-0, counters: {memory: {value: 1Gi}}, compatibilityGroups: [mig, mig]}
    - {counterSet: gpu-1, counters: {memory: {value: 1Gi}}, compatibilityGroups: [a, b, c]}
  - name: e
    consumesCounters:
    - {counterSet: gpu-0, counters: {memory: {value: 1Gi}}, compatibilityGroups: [mig, vgpu]}
"""
    )
    assert messages(obj) == [
        "spec.sharedCounters[0].counters[SMs]: 'SMs' is not a DNS label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit",
        "spec.sharedCounters[1].name: duplicate counter set 'gpu-0'",
        "spec.sharedCounters[2].name: 'Board' is not a DNS label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit",
        "spec.sharedCounters[2].counters: must name at least one counter",
        "spec.devices[0].consumesCounters[1].counterSet: duplicate counter set 'gpu-0'",
        "spec.devices[0].consumesCounters[1].counters[mem/x]: 'mem/x' is not a DNS label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit",
        "spec.devices[1].consumesCounters: must have at most 2 entries, has 3",
        "spec.devices[2].consumesCounters[0].counters: must name at least one counter",
        "spec.devices[3].consumesCounters[0].compatibilityGroups: must have at most 2 names, each once",
        "spec.devices[3].consumesCounters[1].compatibilityGroups: must have at most 2 names, each once",
    ]


@pytest.mark.parametrize(
    "operations,problem",
    [
        ([], None),
        (["*"], None),
        (["NodeUnprepareResources"], None),
        (["NodePrepareResources", "NodeUnprepareResources"], None),
        (["NodePrepareResources", "*"], None),
        (["NodePrepareResources"], 'NodePrepareResources may be skipped only with NodeUnprepareResources (or with "*")'),
        (["*", "*"], "each operation at most once"),
        (["NodeUnprepareResources", "Attach"], 'unsupported value \'Attach\': supported values: "*", "NodePrepareResources", "NodeUnprepareResources"'),
        (["x" * 5_000], f"unsupported value {'x' * 64!r}: supported values: " + '"*", "NodePrepareResources", "NodeUnprepareResources"'),
        (["*"] * 100_000, "each operation at most once"),
    ],
)
def test_skip_node_operations_are_a_set_of_the_operations_kubernetes_knows(operations, problem):
    obj = one(
        """
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: s}
spec:
  driver: nic.example.com
  pool: {name: p, generation: 1, resourceSliceCount: 1}
  nodeName: n
  devices: [{name: nic-0}]
"""
    )
    obj.spec.skip_node_operations = operations
    assert messages(obj) == ([] if problem is None else [f"spec.skipNodeOperations: {problem}"])


def test_node_allocatable_resources_and_the_partition_type_attribute_are_checked_as_the_api_server_does():
    """1.37's alpha fields dralloc reads and carries without allocating by them."""
    obj = one(
        """
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: s}
spec:
  driver: cpu.example.com
  pool: {name: p, generation: 1, resourceSliceCount: 1}
  nodeName: n
  partitionTypeAttribute: "cpu.example.com/profile kind"
  devices:
  - name: ccx-0
    capacity: {cores: {value: "8"}}
    nodeAllocatableResources:
      cpu: {mapping: {capacityKey: cores, capacityMultiplier: "2"}}
      memory: {overhead: {perPod: 1Gi, perContainer: 64Mi}}
      hugepages-2Mi: {mapping: {deviceMultiplier: "4"}}
  - name: ccx-1
    nodeAllocatableResources:
      example.com/widgets: {mapping: {deviceMultiplier: "1", capacityKey: cores}}
      cpu: {}
      memory: {mapping: {capacityKey: cores}, overhead: {perPod: lots}}
"""
    )
    assert messages(obj) == [
        "spec.partitionTypeAttribute: " + fully_qualified_name_error("cpu.example.com/profile kind"),
        "spec.devices[1].nodeAllocatableResources[example.com/widgets]: 'example.com/widgets' is an extended resource: only node resources such as cpu and memory",
        "spec.devices[1].nodeAllocatableResources[example.com/widgets].mapping: exactly one of capacityKey (with capacityMultiplier) and deviceMultiplier",
        "spec.devices[1].nodeAllocatableResources[cpu]: needs a mapping, an overhead or both",
        "spec.devices[1].nodeAllocatableResources[memory].mapping: capacityKey and capacityMultiplier go together",
        "spec.devices[1].nodeAllocatableResources[memory].overhead.perPod: invalid quantity 'lots': expected a number with an optional suffix such as 80Gi, 500m, 2",
    ]


def test_every_corpus_object_is_valid(shared_dir):
    from dralloc.manifests import load_paths

    manifests = load_paths([shared_dir / "corpus" / "upstream-verdicts"])
    assert len(manifests.objects) > 3000
    invalid = [(str(item.source), messages(item.obj)) for item in manifests.objects if validate(item.obj)]
    assert invalid == []


@pytest.mark.parametrize(
    ("check", "valid"),
    [
        (is_dns_subdomain, "gpu.nvidia.com"),
        (is_dns_label, "node-0"),
        (lambda name: qualified_name_error(name) is None, "gpu.nvidia.com/productName"),
    ],
)
def test_a_name_with_a_trailing_newline_is_not_valid(check, valid):
    """Python's `$` also matches before a final newline (Go's does not): the patterns end at `\\Z`,
    so `gpu\\n` is not a name the API server would take, nor a subject or key dralloc writes."""
    assert check(valid)
    assert not check(valid + "\n")
    assert not check(valid + "\n" + "x")


def test_a_dns_subdomain_is_at_most_253_characters():
    assert is_dns_subdomain(".".join(["a" * 63] * 4)[:253])
    assert not is_dns_subdomain(".".join(["a" * 63] * 4)[:252] + "ab")
    assert not is_dns_subdomain("")


def test_a_claim_named_with_a_newline_is_refused_by_the_engine():
    from dralloc.allocator.engine import Engine
    from dralloc.schemas.resource import ResourceClaim

    obj = one(claim("[{name: gpu, exactly: {deviceClassName: gpu.example.com}}]"))
    bad = ResourceClaim(metadata=obj.metadata.__class__(name="c\n", namespace="default"), spec=obj.spec)
    (outcome,) = Engine().allocate([bad])
    assert outcome.status == "error" and "metadata.name" in outcome.message
