"""Scale-out: replicas behind a router (deploy/scaleout.py)."""
