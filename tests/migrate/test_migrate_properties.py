"""Property: for random workloads, migrate, then the devices each container's requests ask for equal
its extended-resource quantities (an init container that reuses an app request gets at least as many);
nothing GPU-shaped is left, and a second run changes nothing."""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from migrate_helpers import documents, gpus_before, migrate, template_counts

GPU_RESOURCES = ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb", "nvidia.com/gpu.shared"]
names = st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True)
quantities = st.dictionaries(st.sampled_from(GPU_RESOURCES), st.integers(0, 8), max_size=2)


@st.composite
def containers(draw, init: bool) -> list[dict]:
    out = []
    for name in draw(st.lists(names, min_size=0 if init else 1, max_size=3, unique=True)):
        body: dict = {"name": ("i" if init else "c") + name, "image": "img"}
        limits = {k: draw(st.sampled_from([v, str(v)])) for k, v in draw(quantities).items()}
        if draw(st.booleans()):
            limits["cpu"] = "1"
        if limits:
            body["resources"] = {"limits": limits}
            if draw(st.booleans()):
                body["resources"]["requests"] = dict(limits)
        if init and draw(st.booleans()):
            body["restartPolicy"] = "Always"
        out.append(body)
    return out


@st.composite
def workloads(draw) -> dict:
    spec = {"containers": draw(containers(False))}
    inits = draw(containers(True))
    if inits:
        spec["initContainers"] = inits
    name = draw(names)
    if draw(st.booleans()):
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": spec}},
    }


def _init_containers(docs: list[dict]) -> set[str]:
    out = set()
    for d in docs:
        spec = d["spec"] if d["kind"] == "Pod" else d["spec"]["template"]["spec"]
        out |= {c["name"] for c in spec.get("initContainers", []) if c.get("restartPolicy") != "Always"}
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(workloads(), min_size=1, max_size=3))
def test_devices_per_container_equal_the_extended_resources(objs):
    text = yaml.safe_dump_all(objs, sort_keys=False)
    result = migrate(text)
    assert result.exit_code == 0, result.report.problems
    out = documents(result.stdout)
    before, after = gpus_before(objs), template_counts(out)
    assert set(after) == set(before)
    run_to_completion = _init_containers(objs)
    for key, n in before.items():
        if key[2] in run_to_completion:
            assert after[key] >= n, key
        else:
            assert after[key] == n, key
    assert gpus_before(out) == {}
    assert migrate(result.stdout).stdout == result.stdout
