"""System updates: A/B root slots written by systemd-sysupdate, health-gated boot, automatic rollback."""
