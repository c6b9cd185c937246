"""A speed class per card: its memory bandwidth, which bounds decode speed (pure).

Decoding one token reads every weight once, so a card's share of the work costs bytes / bandwidth. The
planner fills faster cards first. Figures are the vendors' published peak bandwidths in GB/s; a card not
listed gets its kind's default, which only affects the order among unknown cards.
"""

from __future__ import annotations

# Lower-case substrings of the name llama.cpp reports, most specific first.
KNOWN_GBPS: tuple[tuple[str, float], ...] = (
    ("h200", 4800.0), ("h100", 3350.0), ("a100", 1935.0),
    ("rtx 5090", 1792.0), ("rtx 4090", 1008.0), ("rtx 3090 ti", 1008.0), ("rtx 3090", 936.0),
    ("rtx 3080 ti", 912.0), ("rtx 3080", 760.0), ("rtx 4080", 717.0), ("rtx 5080", 960.0),
    ("rtx 5060 ti", 448.0), ("rtx 4070", 504.0), ("rtx 3070", 448.0), ("rtx 3060", 360.0), ("rtx 2080 ti", 616.0),
    ("rtx 2070", 448.0), ("rtx 2060", 336.0), ("titan v", 653.0), ("v100", 900.0),
    ("gtx 1080 ti", 484.0), ("gtx 1080", 320.0), ("gtx 1070", 256.0), ("p100", 732.0), ("p40", 346.0),
    ("p102", 440.0), ("t4", 320.0), ("a4000", 448.0), ("a5000", 768.0), ("a6000", 768.0), ("l40", 864.0),
    ("rx 7900 xtx", 960.0), ("rx 7900 xt", 800.0), ("rx 6900 xt", 512.0), ("rx 6800", 512.0),
    ("rx 6700 xt", 384.0), ("radeon vii", 1024.0), ("mi50", 1024.0), ("mi60", 1024.0), ("rx 580", 256.0),
    ("rx 570", 224.0), ("arc a770", 560.0), ("arc a750", 512.0),
    ("llvmpipe", 20.0),  # Mesa's lavapipe: a Vulkan device that runs on the CPU
)
DEFAULT_GBPS = {"gpu": 300.0, "igpu": 60.0, "cpu": 40.0}


def bandwidth_gbps(description: str, kind: str = "gpu") -> float:
    name = description.lower()
    for needle, gbps in KNOWN_GBPS:
        if needle in name:
            return gbps
    return DEFAULT_GBPS.get(kind, DEFAULT_GBPS["gpu"])
