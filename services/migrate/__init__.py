"""`dralloc migrate`: device-plugin GPU requests rewritten as DRA ResourceClaimTemplates.

The contract is `../shared/MIGRATE-CONTRACT.md`. The parts, each with one job:

- `resources`: which extended resources are GPUs and how many (pure);
- `podspecs`: where the pod specs of any object sit (pure, over plain mappings);
- `gfd`: GPU Feature Discovery node labels as CEL selectors (pure);
- `usage`: DCGM peak samples and the MIG profile a container is right-sized to (pure);
- `rewrite`: one object's pod specs rewritten and its templates made (pure, mutates
  the round-trip document it is given);
- `documents`: YAML/JSON text split into documents, loaded and dumped round-trip
  (ruamel.yaml: comments, key order and quotes kept);
- `command`: the CLI shell's work (read, rewrite, render yaml|diff|json, --in-place);
- `plan`: `dralloc plan`, device plugin vs DRA on a simulated fleet (`plan_render`: its table and chart).
"""
