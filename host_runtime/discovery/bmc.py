"""Whether the box has a BMC: a local IPMI device, or an address the configuration names."""

from __future__ import annotations

from pathlib import Path

IPMI_DEVICES = ("dev/ipmi0", "dev/ipmi/0", "dev/ipmidev/0")


def collect_bmc(root: Path = Path("/"), configured_address: str | None = None) -> dict:
    local = [str(root / d) for d in IPMI_DEVICES if (root / d).exists()]
    return {"local_ipmi_device": local[0] if local else None, "configured_address": configured_address,
            "present": bool(local or configured_address)}
