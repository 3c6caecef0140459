"""GPU Feature Discovery labels become CEL selectors with the same meaning: on a fleet of two GPU
products, the migrated claim lands exactly where the labels would have sent the pod."""

from __future__ import annotations

import pytest
from migrate_helpers import allocate, documents, migrate

from dralloc.migrate import gfd

TWO_PRODUCTS = [("h100-sxm", 1), ("l40s-pcie", 1)]  # H100 80GB (Hopper, 9.0, 81559 MiB) and L40S (Ada, 8.9, 46068 MiB)


def pod(selection: str, resource: str = "nvidia.com/gpu") -> str:
    return f"""apiVersion: v1
kind: Pod
metadata:
  name: p
  namespace: ns
spec:
{selection}  containers:
  - name: main
    image: cuda
    resources:
      limits:
        {resource}: 1
"""


def node_selector(labels: dict[str, str]) -> str:
    return "  nodeSelector:\n" + "".join(f'    {k}: "{v}"\n' for k, v in labels.items())


def required(*terms: list[tuple[str, str, list[str]]]) -> str:
    text = "  affinity:\n    nodeAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n        nodeSelectorTerms:\n"
    for term in terms:
        text += "        - matchExpressions:\n"
        for key, op, values in term:
            text += f"          - {{key: {key}, operator: {op}, values: {values!r}}}\n".replace("'", '"')
    return text


def landed(text: str, **options) -> str:
    result = migrate(text, **options)
    assert result.exit_code == 0, result.report.problems
    ((_, node, _),) = allocate(documents(result.stdout), TWO_PRODUCTS).values()
    return node.rsplit("-", 1)[0]


@pytest.mark.parametrize(
    "selection, expected",
    [
        (node_selector({gfd.PRODUCT: "NVIDIA-L40S"}), "l40s-pcie"),
        (node_selector({gfd.PRODUCT: "NVIDIA-H100-80GB-HBM3"}), "h100-sxm"),  # dashes were spaces
        (node_selector({gfd.PRODUCT: "NVIDIA-L40S-SHARED"}), "l40s-pcie"),  # time-slicing suffix
        (node_selector({gfd.FAMILY: "ada-lovelace"}), "l40s-pcie"),
        (node_selector({gfd.FAMILY: "hopper"}), "h100-sxm"),
        (node_selector({gfd.MEMORY: "46068"}), "l40s-pcie"),
        (node_selector({gfd.COMPUTE_MAJOR: "9"}), "h100-sxm"),
        (node_selector({gfd.COMPUTE_MAJOR: "8", gfd.DRIVER_MAJOR: "580"}), "l40s-pcie"),
        (required([(gfd.PRODUCT, "NotIn", ["NVIDIA-H100-80GB-HBM3"])]), "l40s-pcie"),
        (required([(gfd.PRODUCT, "In", ["NVIDIA-A100-80GB-PCIe", "NVIDIA-L40S"])]), "l40s-pcie"),
        (required([(gfd.MEMORY, "Gt", ["50000"])]), "h100-sxm"),
        (required([(gfd.MEMORY, "Lt", ["50000"])]), "l40s-pcie"),
        (required([(gfd.COMPUTE_MAJOR, "Lt", ["9"])]), "l40s-pcie"),
        (required([(gfd.PRODUCT, "In", ["NVIDIA-B200"])], [(gfd.FAMILY, "In", ["ada-lovelace"])]), "l40s-pcie"),  # OR of terms
    ],
)
def test_the_claim_lands_where_the_labels_sent_the_pod(selection, expected):
    assert landed(pod(selection)) == expected


def test_memory_equality_is_exact_to_the_mib():
    # 46068 matches the L40S; 46067 and 46069 match nothing on this fleet
    for mib in ("46067", "46069"):
        result = migrate(pod(node_selector({gfd.MEMORY: mib})))
        with pytest.raises(AssertionError, match="cannot allocate"):
            allocate(documents(result.stdout), TWO_PRODUCTS)


def test_gt_and_lt_are_strict_to_the_mib():
    l40s = [("l40s-pcie", 1)]  # 46068 MiB
    for op, value, fits in (("Gt", "46067", True), ("Gt", "46068", False), ("Lt", "46069", True), ("Lt", "46068", False)):
        out = documents(migrate(pod(required([(gfd.MEMORY, op, [value])]))).stdout)
        if fits:
            assert allocate(out, l40s)
        else:
            with pytest.raises(AssertionError, match="cannot allocate"):
                allocate(out, l40s)


def test_translated_labels_leave_the_pod_others_stay():
    text = pod(
        node_selector({gfd.PRODUCT: "NVIDIA-L40S", "topology.kubernetes.io/zone": "a"})
        + required([(gfd.FAMILY, "In", ["ada-lovelace"]), ("kubernetes.io/arch", "In", ["amd64"])])
    )
    out = documents(migrate(text).stdout)[1]["spec"]
    assert out["nodeSelector"] == {"topology.kubernetes.io/zone": "a"}
    terms = out["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]


def test_an_emptied_affinity_goes_away():
    out = documents(migrate(pod(required([(gfd.PRODUCT, "In", ["NVIDIA-L40S"])]))).stdout)[1]["spec"]
    assert "affinity" not in out and "nodeSelector" not in out


def test_keep_node_selectors_keeps_the_labels_and_adds_the_selectors():
    text = pod(node_selector({gfd.PRODUCT: "NVIDIA-L40S"}))
    out = documents(migrate(text, keep_node_selectors=True).stdout)
    assert out[1]["spec"]["nodeSelector"] == {gfd.PRODUCT: "NVIDIA-L40S"}
    assert out[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    assert landed(text, keep_node_selectors=True) == "l40s-pcie"


@pytest.mark.parametrize(
    "selection, why",
    [
        (required([(gfd.PRODUCT, "Gt", ["5"])]), "is a name"),
        (required([(gfd.PRODUCT, "DoesNotExist", [])]), "DoesNotExist"),
        (node_selector({gfd.MEMORY: "lots"}), "integer"),
        (node_selector({gfd.PRODUCT: "bad value with spaces"}), "not a valid label value"),
        (required([(gfd.PRODUCT, "In", ["NVIDIA-L40S"])], [("kubernetes.io/arch", "In", ["amd64"])]), "several node selector terms"),
    ],
)
def test_what_cannot_be_expressed_stays_on_the_pod_with_a_warning(selection, why):
    result = migrate(pod(selection))
    assert result.exit_code == 0
    assert any(why in w for w in result.report.warnings), result.report.warnings
    spec = documents(result.stdout)[1]["spec"]
    assert "nodeSelector" in spec or "affinity" in spec


def test_memory_cannot_select_a_mig_device_so_the_label_stays():
    result = migrate(pod(node_selector({gfd.MEMORY: "81559"}), resource="nvidia.com/mig-1g.10gb"))
    assert any("MIG device" in w for w in result.report.warnings)
    out = documents(result.stdout)
    assert out[1]["spec"]["nodeSelector"] == {gfd.MEMORY: "81559"}
