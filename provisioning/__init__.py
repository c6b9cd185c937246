"""Provisioning bundles: a box.toml and the files it names, validated, then applied at first boot."""
