"""The reference gateway-fronted path: nginx config generation, pygw (the Python AI
gateway) and the LocalStack supervisor that starts them in front of the engine."""
