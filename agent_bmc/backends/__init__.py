"""Backends: IPMI over LAN (pyghmi) and local hwmon (psutil, /sys); both produce the same reading dict."""
