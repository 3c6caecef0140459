"""API validation: what the API server would reject is rejected, naming the field."""

import pytest

from dralloc.manifests import load_text
from dralloc.schemas.validation import REQUESTS_MAX, validate


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


def test_every_corpus_object_is_valid(shared_dir):
    from dralloc.manifests import load_paths

    manifests = load_paths([shared_dir / "corpus" / "upstream-verdicts"])
    assert len(manifests.objects) > 3000
    invalid = [(str(item.source), messages(item.obj)) for item in manifests.objects if validate(item.obj)]
    assert invalid == []
