"""Release images read from an OCI registry (distribution API), with pull secrets and mirrors.

Layers point one way: reference ← auth ← client ← layers ← mirrors ← resolver. Nothing
here knows about the reconciler; the reconciler asks the resolver and is told when a release
becomes known.
"""
