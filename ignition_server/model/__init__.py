"""The domain model every layer shares: Kubernetes objects as the sources hand them over
(`objects.py`), the token Secret contract (`token_secret.py`, DESIGN §3) and what of its config
the MCO's bootstrap consumes (`bootstrap_objects.py`), the MCO base ConfigMap's keys
(`mco_base.py`). Pure: nothing here imports the rest of the server."""
