"""MIG GPU-instance profile tables: what `nvidia-smi mig -lgip` / `-lgipp` print.

H200: the real table captured on an H200
(`../shared/fixtures/hardware/h200-vm/nvidia-smi-topo.txt`; a test parses
that file and checks it equals this table). H100 80GB and A100 80GB: NVIDIA's
published tables (MIG user guide, "Supported MIG Profiles"). Memory is in MiB
(the GiB column times 1024); placements are (start, size) over 8 memory slices.

`parse_nvidia_smi` reads the two nvidia-smi listings, so a new model's table
can be captured rather than typed.
"""

from __future__ import annotations

import re

from dralloc.discovery.inventory import MigProfile

_ONES = tuple((s, 1) for s in range(7))


def _table(rows: list[tuple]) -> tuple[MigProfile, ...]:
    return tuple(MigProfile(*row) for row in rows)


#        id  name          SM  CE DEC ENC JPEG OFA  MiB     placements
H200 = _table(
    [
        (19, "1g.18gb", 16, 1, 1, 0, 1, 0, 16384, _ONES),
        (20, "1g.18gb+me", 16, 1, 1, 0, 1, 1, 16384, _ONES),
        (15, "1g.35gb", 26, 1, 1, 0, 1, 0, 33280, ((0, 2), (2, 2), (4, 2), (6, 2))),
        (14, "2g.35gb", 32, 2, 2, 0, 2, 0, 33280, ((0, 2), (2, 2), (4, 2))),
        (9, "3g.71gb", 60, 3, 3, 0, 3, 0, 71424, ((0, 4), (4, 4))),
        (5, "4g.71gb", 64, 4, 4, 0, 4, 0, 71424, ((0, 4),)),
        (0, "7g.141gb", 132, 8, 7, 0, 7, 1, 143360, ((0, 8),)),
    ]
)

H100_80GB = _table(
    [
        (19, "1g.10gb", 16, 1, 1, 0, 1, 0, 9984, _ONES),
        (20, "1g.10gb+me", 16, 1, 1, 0, 1, 1, 9984, _ONES),
        (15, "1g.20gb", 26, 1, 1, 0, 1, 0, 20096, ((0, 2), (2, 2), (4, 2), (6, 2))),
        (14, "2g.20gb", 32, 2, 2, 0, 2, 0, 20096, ((0, 2), (2, 2), (4, 2))),
        (9, "3g.40gb", 60, 3, 3, 0, 3, 0, 40448, ((0, 4), (4, 4))),
        (5, "4g.40gb", 64, 4, 4, 0, 4, 0, 40448, ((0, 4),)),
        (0, "7g.80gb", 132, 8, 7, 0, 7, 1, 81152, ((0, 8),)),
    ]
)

A100_80GB = _table(
    [
        (19, "1g.10gb", 14, 1, 0, 0, 0, 0, 9728, _ONES),
        (20, "1g.10gb+me", 14, 1, 1, 0, 1, 1, 9728, _ONES),
        (15, "1g.20gb", 14, 1, 1, 0, 0, 0, 19968, ((0, 2), (2, 2), (4, 2), (6, 2))),
        (14, "2g.20gb", 28, 2, 1, 0, 0, 0, 19968, ((0, 2), (2, 2), (4, 2))),
        (9, "3g.40gb", 42, 3, 2, 0, 0, 0, 40192, ((0, 4), (4, 4))),
        (5, "4g.40gb", 56, 4, 2, 0, 0, 0, 40192, ((0, 4),)),
        (0, "7g.80gb", 98, 7, 5, 0, 1, 1, 80896, ((0, 8),)),
    ]
)

STANDARD_PLACEMENTS: dict[int, tuple[tuple[int, int], ...]] = {p.id: p.placements for p in H200}
"""GI profile id -> placements on an 8-memory-slice GPU (A100, H100, H200 share them).

Used when NVML cannot list placements (an old binding, or the capture in
`h200-vm`, whose tool called the placement query wrongly)."""

_LGIP_ROW = re.compile(
    r"^\|\s+\d+\s+MIG (?P<name>\S+)\s+(?P<id>\d+)\s+\d+/(?P<total>\d+)\s+(?P<gib>[\d.]+)\s+\w+\s+"
    r"(?P<sm>\d+)\s+(?P<dec>\d+)\s+(?P<enc>\d+)\s+\|$"
)
_LGIP_ROW2 = re.compile(r"^\|\s+(?P<ce>\d+)\s+(?P<jpeg>\d+)\s+(?P<ofa>\d+)\s+\|$")
_LGIPP = re.compile(r"Profile ID\s+(?P<id>\d+) Placements?\s*:\s*\{(?P<starts>[\d,]+)\}:(?P<size>\d+)")


def parse_nvidia_smi(text: str) -> tuple[MigProfile, ...]:
    """Profiles from `nvidia-smi mig -lgip` followed by `nvidia-smi mig -lgipp` (first GPU)."""
    placements = {int(m["id"]): tuple((int(s), int(m["size"])) for s in m["starts"].split(",")) for m in _LGIPP.finditer(text)}
    profiles: list[MigProfile] = []
    row: re.Match[str] | None = None
    for line in text.splitlines():
        line = line.strip()
        if row is None:
            row = _LGIP_ROW.match(line)
            continue
        second = _LGIP_ROW2.match(line)
        if second:
            pid = int(row["id"])
            profiles.append(
                MigProfile(
                    id=pid,
                    name=row["name"],
                    multiprocessors=int(row["sm"]),
                    copy_engines=int(second["ce"]),
                    decoders=int(row["dec"]),
                    encoders=int(row["enc"]),
                    jpeg_engines=int(second["jpeg"]),
                    ofa_engines=int(second["ofa"]),
                    memory_mib=round(float(row["gib"]) * 1024),
                    placements=placements.get(pid, ()),
                )
            )
        row = None
    return tuple(profiles)
