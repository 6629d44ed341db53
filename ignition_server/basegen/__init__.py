"""Generated MCO bases: the release's own machine-config-operator run once per (cluster configuration, release digest)."""
