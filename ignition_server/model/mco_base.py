"""The MCO base ConfigMap's contract: the annotation that marks it and the keys of its data.

`ignition-server base import` writes it, the reconciler (`reconcile/bases.py`) reads it.
"""

ANNOTATION_MCO_BASE = "ignition-server.openshift.io/mco-base"
BASE_KEY = "machineconfigs.yaml"
RELEASE_KEY = "release"
VERSION_KEY = "releaseVersion"
