"""The `resource.k8s.io/v1` object model (Kubernetes 1.34-1.37) as msgspec Structs.

Field names are the API's camelCase on the wire (``rename="camel"``), empty
fields are omitted when encoding, so a manifest decoded here encodes back to
the same JSON for every field modelled. Fields the model does not know are
ignored on decode, as a client built for an older API version would.

Quantities (``"80Gi"``, ``8``) are kept as written; the engine parses them.
Opaque driver parameters are kept as arbitrary JSON.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

API_VERSION = "resource.k8s.io/v1"

Quantity = str | int | float
"""A Kubernetes resource.Quantity as written in a manifest."""


_Int = int  # DeviceAttribute's fields are named `int` and `bool`
_Bool = bool


class _Obj(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    """Base: camelCase on the wire, defaults omitted, keyword construction."""


# --- core/v1 pieces -------------------------------------------------------------


class OwnerReference(_Obj, kw_only=True):
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(_Obj, kw_only=True):
    name: str = ""
    generate_name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    owner_references: list[OwnerReference] = []
    finalizers: list[str] = []


class NodeSelectorRequirement(_Obj, kw_only=True):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[str] = []


class NodeSelectorTerm(_Obj, kw_only=True):
    match_expressions: list[NodeSelectorRequirement] = []
    match_fields: list[NodeSelectorRequirement] = []


class NodeSelector(_Obj, kw_only=True):
    node_selector_terms: list[NodeSelectorTerm]


class Node(_Obj, kw_only=True):
    """core/v1 Node: only what allocation needs (name and labels)."""

    api_version: str = "v1"
    kind: str = "Node"
    metadata: ObjectMeta


# --- shared pieces ---------------------------------------------------------------


class CELDeviceSelector(_Obj, kw_only=True):
    expression: str


class DeviceSelector(_Obj, kw_only=True):
    cel: CELDeviceSelector | None = None


class OpaqueDeviceConfiguration(_Obj, kw_only=True):
    driver: str
    parameters: Any = None


class DeviceToleration(_Obj, kw_only=True):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None  # None: Equal
    value: str | None = None
    effect: Literal["NoSchedule", "NoExecute", "None"] | None = None
    toleration_seconds: int | None = None


# --- DeviceClass -----------------------------------------------------------------


class DeviceClassConfiguration(_Obj, kw_only=True):
    opaque: OpaqueDeviceConfiguration | None = None


class DeviceClassSpec(_Obj, kw_only=True):
    selectors: list[DeviceSelector] = []
    config: list[DeviceClassConfiguration] = []
    extended_resource_name: str | None = None


class DeviceClass(_Obj, kw_only=True):
    api_version: str = API_VERSION
    kind: str = "DeviceClass"
    metadata: ObjectMeta
    spec: DeviceClassSpec = msgspec.field(default_factory=DeviceClassSpec)


# --- ResourceSlice ---------------------------------------------------------------


class DeviceAttribute(_Obj, kw_only=True):
    """Exactly one of the eight is set: a scalar (`int`, `bool`, `string`, `version`)
    or a non-empty list (`ints`, `bools`, `strings`, `versions`; KEP-5491)."""

    int: _Int | None = None
    bool: _Bool | None = None
    string: str | None = None
    version: str | None = None
    ints: list[_Int] | None = None
    bools: list[_Bool] | None = None
    strings: list[str] | None = None
    versions: list[str] | None = None


class CapacityRequestPolicyRange(_Obj, kw_only=True):
    min: Quantity
    max: Quantity | None = None
    step: Quantity | None = None


class CapacityRequestPolicy(_Obj, kw_only=True):
    default: Quantity | None = None
    valid_values: list[Quantity] = []
    valid_range: CapacityRequestPolicyRange | None = None


class DeviceCapacity(_Obj, kw_only=True):
    value: Quantity
    request_policy: CapacityRequestPolicy | None = None


class Counter(_Obj, kw_only=True):
    value: Quantity


class CounterSet(_Obj, kw_only=True):
    name: str
    counters: dict[str, Counter]


class DeviceCounterConsumption(_Obj, kw_only=True):
    counter_set: str
    counters: dict[str, Counter]
    compatibility_groups: list[str] | None = None
    """Kubernetes 1.37's alpha DRADeviceCompatibilityGroups (KEP-5963): devices drawing on one
    counter set may be co-allocated only when all their groups intersect. dralloc does not
    implement it: a pool where any device names groups is not allocated from (the engine's pool
    validation says so), as the 1.37 scheduler skips such a pool with the feature off (its
    default). Read, not dropped as an unknown field would be, so that it cannot be ignored."""


class DeviceTaint(_Obj, kw_only=True):
    key: str
    value: str | None = None
    effect: Literal["NoSchedule", "NoExecute", "None"]
    time_added: str | None = None


# --- DeviceTaintRule (resource.k8s.io/v1 since 1.37) ---------------------------------


class DeviceTaintSelector(_Obj, kw_only=True):
    """Which devices a rule taints: every field set must match; an empty selector matches all."""

    driver: str | None = None
    pool: str | None = None
    device: str | None = None


class DeviceTaintRuleSpec(_Obj, kw_only=True):
    device_selector: DeviceTaintSelector | None = None  # None: no device
    taint: DeviceTaint


class DeviceTaintRuleStatus(_Obj, kw_only=True):
    conditions: list[Any] = []


class DeviceTaintRule(_Obj, kw_only=True):
    """Taints the devices it selects exactly as a taint in their ResourceSlice would."""

    api_version: str = API_VERSION
    kind: str = "DeviceTaintRule"
    metadata: ObjectMeta
    spec: DeviceTaintRuleSpec
    status: DeviceTaintRuleStatus | None = None


class NodeAllocatableMapping(_Obj, kw_only=True):
    """How an allocation counts as a node resource: its consumed capacity times a multiplier, or
    its device count times one (1.37 alpha DRANodeAllocatableResources; exactly one way)."""

    capacity_key: str | None = None
    capacity_multiplier: Quantity | None = None
    device_multiplier: Quantity | None = None


class NodeAllocatableOverhead(_Obj, kw_only=True):
    per_pod: Quantity | None = None
    per_container: Quantity | None = None


class NodeAllocatableResource(_Obj, kw_only=True):
    """What allocating a device costs of a node resource (cpu, memory, hugepages): read and carried,
    not accounted by dralloc, which allocates devices, not node resources (the kubelet and the
    scheduler's node fit account it)."""

    mapping: NodeAllocatableMapping | None = None
    overhead: NodeAllocatableOverhead | None = None


class Device(_Obj, kw_only=True):
    name: str
    attributes: dict[str, DeviceAttribute] = {}
    capacity: dict[str, DeviceCapacity] = {}
    consumes_counters: list[DeviceCounterConsumption] = []
    node_name: str | None = None
    node_selector: NodeSelector | None = None
    all_nodes: bool | None = None
    taints: list[DeviceTaint] = []
    binds_to_node: bool | None = None
    binding_conditions: list[str] = []
    binding_failure_conditions: list[str] = []
    allow_multiple_allocations: bool | None = None
    node_allocatable_resources: dict[str, NodeAllocatableResource] | None = None  # (None, not {}: no dict per device)


class ResourcePool(_Obj, kw_only=True):
    name: str
    generation: int
    resource_slice_count: int


class ResourceSliceSpec(_Obj, kw_only=True):
    driver: str
    pool: ResourcePool
    node_name: str | None = None
    node_selector: NodeSelector | None = None
    all_nodes: bool | None = None
    per_device_node_selection: bool | None = None
    devices: list[Device] = []
    shared_counters: list[CounterSet] = []
    skip_node_operations: list[str] = []
    """The node-local operations (kubelet gRPC calls) its devices need not (1.37 alpha
    DRAOptionalNodeOperations): copied into each of their allocation results."""
    partition_type_attribute: str | None = None
    """The string attribute naming each partitionable device's partition type (1.37 alpha
    DRAPartitionableDevicesType, for pool status): validated, not needed to allocate."""


class ResourceSlice(_Obj, kw_only=True):
    api_version: str = API_VERSION
    kind: str = "ResourceSlice"
    metadata: ObjectMeta
    spec: ResourceSliceSpec


# --- ResourceClaim ---------------------------------------------------------------


class CapacityRequirements(_Obj, kw_only=True):
    requests: dict[str, Quantity] = {}


AllocationMode = Literal["ExactCount", "All"]


class ExactDeviceRequest(_Obj, kw_only=True):
    device_class_name: str
    selectors: list[DeviceSelector] = []
    allocation_mode: AllocationMode | None = None  # None: ExactCount
    count: int | None = None
    admin_access: bool | None = None
    tolerations: list[DeviceToleration] = []
    capacity: CapacityRequirements | None = None


class DeviceSubRequest(_Obj, kw_only=True):
    name: str
    device_class_name: str
    selectors: list[DeviceSelector] = []
    allocation_mode: AllocationMode | None = None  # None: ExactCount
    count: int | None = None
    tolerations: list[DeviceToleration] = []
    capacity: CapacityRequirements | None = None


class DeviceRequest(_Obj, kw_only=True):
    """Exactly one of `exactly` and `first_available` is set."""

    name: str
    exactly: ExactDeviceRequest | None = None
    first_available: list[DeviceSubRequest] = []


class DeviceConstraint(_Obj, kw_only=True):
    requests: list[str] = []
    match_attribute: str | None = None
    distinct_attribute: str | None = None


class DeviceClaimConfiguration(_Obj, kw_only=True):
    requests: list[str] = []
    opaque: OpaqueDeviceConfiguration | None = None


class DeviceClaim(_Obj, kw_only=True):
    requests: list[DeviceRequest] = []
    constraints: list[DeviceConstraint] = []
    config: list[DeviceClaimConfiguration] = []


class ResourceClaimSpec(_Obj, kw_only=True):
    devices: DeviceClaim = msgspec.field(default_factory=DeviceClaim)


class DeviceRequestAllocationResult(_Obj, kw_only=True):
    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool | None = None
    tolerations: list[DeviceToleration] = []
    binding_conditions: list[str] = []
    binding_failure_conditions: list[str] = []
    share_id: str | None = msgspec.field(default=None, name="shareID")
    consumed_capacity: dict[str, Quantity] = {}
    skip_node_operations: list[str] = []
    """Its slice's `skipNodeOperations` when it was allocated: the kubelet skips an operation
    for a driver when every device of the claim from that driver lists it."""


class DeviceAllocationConfiguration(_Obj, kw_only=True):
    source: Literal["FromClass", "FromClaim"]
    requests: list[str] = []
    opaque: OpaqueDeviceConfiguration | None = None


class DeviceAllocationResult(_Obj, kw_only=True):
    results: list[DeviceRequestAllocationResult] = []
    config: list[DeviceAllocationConfiguration] = []


class AllocationResult(_Obj, kw_only=True):
    devices: DeviceAllocationResult = msgspec.field(default_factory=DeviceAllocationResult)
    node_selector: NodeSelector | None = None
    allocation_timestamp: str | None = None


class ResourceClaimConsumerReference(_Obj, kw_only=True):
    api_group: str | None = None
    resource: str
    name: str
    uid: str


class AllocatedDeviceStatus(_Obj, kw_only=True):
    driver: str
    pool: str
    device: str
    share_id: str | None = msgspec.field(default=None, name="shareID")
    conditions: list[Any] = []
    data: Any = None
    network_data: Any = None


class ResourceClaimStatus(_Obj, kw_only=True):
    allocation: AllocationResult | None = None
    reserved_for: list[ResourceClaimConsumerReference] = []
    devices: list[AllocatedDeviceStatus] = []


class ResourceClaim(_Obj, kw_only=True):
    api_version: str = API_VERSION
    kind: str = "ResourceClaim"
    metadata: ObjectMeta
    spec: ResourceClaimSpec = msgspec.field(default_factory=ResourceClaimSpec)
    status: ResourceClaimStatus | None = None

    @property
    def key(self) -> str:
        """`namespace/name`, the claim's identity (namespace `default` when unset)."""
        return f"{self.metadata.namespace or 'default'}/{self.metadata.name}"


class ResourceClaimTemplateSpec(_Obj, kw_only=True):
    metadata: ObjectMeta | None = None
    spec: ResourceClaimSpec = msgspec.field(default_factory=ResourceClaimSpec)


class ResourceClaimTemplate(_Obj, kw_only=True):
    api_version: str = API_VERSION
    kind: str = "ResourceClaimTemplate"
    metadata: ObjectMeta
    spec: ResourceClaimTemplateSpec


# --- core/v1 Pod: the claim references and the containers' resources -------------


class PodResourceClaim(_Obj, kw_only=True):
    name: str
    resource_claim_name: str | None = None
    resource_claim_template_name: str | None = None


class ContainerResourceClaim(_Obj, kw_only=True):
    """A container's use of a Pod claim entry (`resources.claims[]`)."""

    name: str
    request: str | None = None


class ResourceRequirements(_Obj, kw_only=True):
    """A container's `resources`: extended resources (`nvidia.com/gpu: 2`) may be backed by DRA (KEP-5004)."""

    requests: dict[str, Quantity] = {}
    limits: dict[str, Quantity] = {}
    claims: list[ContainerResourceClaim] = []


class Container(_Obj, kw_only=True):
    name: str
    resources: ResourceRequirements = msgspec.field(default_factory=ResourceRequirements)
    restart_policy: str | None = None  # "Always" on an init container: a sidecar


class PodSpec(_Obj, kw_only=True):
    resource_claims: list[PodResourceClaim] = []
    node_name: str | None = None
    containers: list[Container] = []
    init_containers: list[Container] = []


class Pod(_Obj, kw_only=True):
    api_version: str = "v1"
    kind: str = "Pod"
    metadata: ObjectMeta
    spec: PodSpec = msgspec.field(default_factory=PodSpec)


KINDS: dict[tuple[str, str], type[Object]] = {
    ("v1", "Node"): Node,
    ("v1", "Pod"): Pod,
    (API_VERSION, "DeviceClass"): DeviceClass,
    (API_VERSION, "ResourceSlice"): ResourceSlice,
    (API_VERSION, "ResourceClaim"): ResourceClaim,
    (API_VERSION, "ResourceClaimTemplate"): ResourceClaimTemplate,
    (API_VERSION, "DeviceTaintRule"): DeviceTaintRule,
}
"""(apiVersion, kind) -> Struct, for every object the system reads."""

Object = Node | Pod | DeviceClass | ResourceSlice | ResourceClaim | ResourceClaimTemplate | DeviceTaintRule


def to_builtins(obj: Object) -> dict[str, Any]:
    """A whole object as JSON-ready builtins, as the API server takes and writes it.

    `apiVersion` and `kind` are defaults, so plain encoding omits them (events
    carry objects that way, their type being known); an object sent to the API
    server or printed for people must say what it is.
    """
    return {"apiVersion": obj.api_version, "kind": obj.kind, **msgspec.to_builtins(obj)}
