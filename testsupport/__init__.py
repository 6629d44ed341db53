"""What the tests and the benchmarks share, imported by one name (`testsupport.<module>`), so a
server a helper starts inside a test is the one `tests/conftest.py` cleans up. Test files import
nothing from each other and nothing from bench/ (nor bench/ from tests/): what two of them need
is here.

- the real server and proxy as processes, the real Ignition client, `python -m bench` (`harness.py`),
  the real tools CI must have (`realtools.py`)
- objects as HyperShift and the API hand them over: token Secrets, Secrets, ConfigMaps (`manifests.py`),
  service-account keys and JWTs (`service_accounts.py`), a served NodePool (`serving.py`), the edge's
  token check alone in a plain HAProxy config (`edge_config.py`)
- worlds to test in: a reconciler over a file source (`reconcile_world.py`), the strict test API
  server (`kubeapi/`), a real registry (`registry_world.py`), stand-in and real MCO releases
  (`mco_image.py`, `mco_base.py`, `real_release.py`), HyperShift's real ignition server and its
  objects (`reference_server.py`, `parity_world.py`, `payload_diff.py`), HostedControlPlanes and
  the control-plane-operator's own code run on them (`hcp_inputs.py`), container images
  (`containers.py`, `container_launch.py`), the deploy/ manifests and the Dockerfile (`deploy.py`),
  spec-validation cases (`invalid_configs.py`)
- the benchmarks' fleets (`fleet.py`, `shared_input_fleet.py`)

Not part of the installed server: found through the repository's root on `sys.path`
(pytest's `pythonpath = ["."]`; `python -m bench` run from the root).
"""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent  # the repository's root (deploy/, examples/, the Dockerfile)
