"""The LAN-facing front: nginx terminates TLS and slow clients before gunicorn sees a request."""
