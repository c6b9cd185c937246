"""Provisioning bundles applied at first boot. Arrives with its issue."""
