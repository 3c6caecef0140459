"""Fleet files: many simulated nodes, named, racked and valid."""

from __future__ import annotations

import pytest
from discovery_checks import slice_problems

from dralloc.discovery import attributes as A
from dralloc.discovery.fleet import FleetError, build_fleet, fleet_nodes, load_fleet


def test_fleet_file_builds_named_nodes_with_valid_slices(tmp_path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "layout: '1.34'\nnodes:\n- {profile: h100-sxm, count: 2}\n- {profile: h200-sxm-mig, count: 1, prefix: mig}\n- {profile: gb200-nvl72, count: 20}\n"
    )
    fleet = build_fleet(path)
    names = [name for name, _ in fleet]
    assert names[:3] == ["h100-sxm-0", "h100-sxm-1", "mig-0"] and len(names) == 23 == len(set(names))
    for name, slices in fleet:
        assert {s.spec.node_name for s in slices} == {name}
        assert slice_problems(slices, "1.34") == []
    nodes = {n.metadata.name: n.metadata.labels for n in fleet_nodes(path)}
    # 18 trays per NVL72 rack: trays 0-17 share a clique, 18-19 are the next rack.
    racks = [nodes[f"gb200-nvl72-{i}"][A.LABEL_RACK] for i in range(20)]
    assert racks == ["gb200-nvl72-rack-0"] * 18 + ["gb200-nvl72-rack-1"] * 2
    cliques = {nodes[f"gb200-nvl72-{i}"][A.LABEL_CLIQUE] for i in range(18)}
    assert len(cliques) == 1 and nodes["gb200-nvl72-18"][A.LABEL_CLIQUE] not in cliques
    assert nodes["mig-0"][A.LABEL_HOSTNAME] == "mig-0"


def test_pairs_and_same_prefix_keep_counting() -> None:
    names = [n.name for n in load_fleet([("l40s-pcie", 2), {"profile": "h100-sxm", "count": 1, "prefix": "l40s-pcie"}]).nodes]
    assert names == ["l40s-pcie-0", "l40s-pcie-1", "l40s-pcie-2"]


def test_thousands_of_nodes(tmp_path) -> None:
    fleet = build_fleet([("h100-sxm", 2000)])
    assert len(fleet) == 2000
    assert sum(len(s.spec.devices) for _, slices in fleet for s in slices) == 2000 * 16


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([{"profile": "h900", "count": 1}], "entry 0: profile: 'h900' is not one of"),
        ([{"profile": "h100-sxm", "count": -1}], "entry 0: count: expected a non-negative integer"),
        ([{"profile": "h100-sxm", "cuont": 1}], "entry 0: unknown field"),
        ({"layout": "1.2", "nodes": [["h100-sxm", 1]]}, "layout '1.2'"),
        ([], "non-empty list"),
        (["h100-sxm"], "entry 0: expected a mapping"),
    ],
)
def test_bad_fleet_specs_name_entry_and_field(spec, message) -> None:
    with pytest.raises(FleetError, match=message):
        load_fleet(spec)


def test_bad_fleet_file(tmp_path) -> None:
    (tmp_path / "f.yaml").write_text("- {profile: [unclosed\n")
    with pytest.raises(FleetError, match="f.yaml: not valid YAML"):
        load_fleet(tmp_path / "f.yaml")
    with pytest.raises(FleetError, match="/dev/zero: cannot read: larger than 16 MiB"):  # (stat says 0 bytes; it never ends)
        load_fleet("/dev/zero")
